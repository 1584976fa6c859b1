"""Benchmark worker processes (started by bench/run.py; one JSON object a line both ways).

    worker.py prepare-server
        answers each {"framework", "workload", "scheme", "quick", "threads", "art_dir"} job with
        {"ok", "prep" | "error", "seconds"}: exports/compiles that framework's artifacts
    worker.py zygote --sock FD
        imports torch once, then for each request received on the Unix socket FD (a JSON line
        plus two passed file descriptors: the new worker's socket and its log file) forks one
        `serve` worker; answers {"ok", "pid"}
    worker.py serve --spec JSON
        the same worker on stdin/stdout, without the zygote (for debugging)

A serve worker: loads one framework on one (model, scheme), measures the RSS baseline, resets
the RSS high-water mark, runs the warm-up steps and answers {"ok": true, "rss_loaded_kb", ...};
then answers each {"run": n} with the n step times, and {"finish": true} with the peak RSS.
Everything the frameworks print goes to stderr (the log), never into the protocol.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_kb() -> int:
    return _status("VmRSS")


def hwm_kb() -> int:
    return _status("VmHWM")


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not permitted or not working."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return hwm_kb() <= rss_kb() + 64


def trim():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Sampler:
    """Fallback peak-RSS meter: samples VmRSS in a thread while steps run."""

    def __init__(self):
        self.peak = 0
        self._on = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            self._on.wait()
            self.peak = max(self.peak, rss_kb())
            time.sleep(0.001)

    def start(self):
        self._on.set()

    def pause(self):
        self.peak = max(self.peak, rss_kb())
        self._on.clear()


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) < 2000 else msg[:2000] + " ..."


def _ctx(spec: dict):
    from frameworks import Ctx
    art = Path(spec.get("art_dir") or ".")
    art.mkdir(parents=True, exist_ok=True)
    return Ctx(spec["workload"], spec["scheme"], spec["quick"], spec["threads"], art)


# ============================================================================ prepare
def prepare(spec: dict) -> dict:
    t0 = time.perf_counter()
    try:
        from frameworks import PREPARE, to_json
        prep = PREPARE[spec["framework"]](_ctx(spec))
        return {"ok": True, "prep": to_json(prep), "seconds": time.perf_counter() - t0}
    except BaseException as e:  # noqa: BLE001 - reported to the harness as the reason
        traceback.print_exc()
        return {"ok": False, "error": _error(e), "seconds": time.perf_counter() - t0}
    finally:
        sys.stderr.flush()


# ============================================================================ serve
def serve(spec: dict, rfile, wfile) -> None:
    def answer(obj):
        wfile.write(json.dumps(obj) + "\n")
        wfile.flush()

    t0 = time.perf_counter()
    try:
        from frameworks import RUNNERS
        ctx = _ctx(spec)
        runner = RUNNERS[spec["framework"]](ctx, spec.get("prep"))
        batches = [runner.batch(x, y) for x, y in ctx.load()[4]]
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        answer({"ok": False, "error": _error(e), "seconds": time.perf_counter() - t0})
        return

    trim()
    rss_loaded = rss_kb()
    method = "clear_refs" if reset_hwm() else "sampler"
    sampler = Sampler() if method == "sampler" else None
    i = 0
    losses = []

    def run(n):
        nonlocal i
        times = []
        if sampler:
            sampler.start()
        for _ in range(n):
            b = batches[i % len(batches)]
            i += 1
            s = time.perf_counter()
            loss = runner.step(b)
            times.append(time.perf_counter() - s)
            losses.append(loss)
        if sampler:
            sampler.pause()
        return times

    try:  # warm-up: the requested steps, but stop once they took warmup_budget_s (at least one)
        warm, t_warm = [], time.perf_counter()
        while len(warm) < spec.get("warmup", 3) and (
                not warm or time.perf_counter() - t_warm < spec.get("warmup_budget_s", 1e9)):
            warm += run(1)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        answer({"ok": False, "error": _error(e), "seconds": time.perf_counter() - t0})
        return
    answer({"ok": True, "rss_loaded_kb": rss_loaded, "hwm_method": method, "load_s": time.perf_counter() - t0,
            "warmup_s": warm, "first_loss": losses[0] if losses else None,
            "preallocated_bytes": runner.preallocated_bytes, "notes": runner.notes})
    for line in rfile:
        cmd = json.loads(line)
        if "run" in cmd:
            try:
                times = run(cmd["run"])
            except BaseException as e:  # noqa: BLE001
                traceback.print_exc()
                answer({"ok": False, "error": _error(e)})
                return
            answer({"ok": True, "times": times, "loss": losses[-1],
                    "finite": all(math.isfinite(v) for v in losses)})
        elif "finish" in cmd:
            peak = sampler.peak if sampler else hwm_kb()
            answer({"ok": True, "peak_kb": peak, "rss_kb": rss_kb(), "steps": i, "losses": losses})
            return


# ============================================================================ zygote
def zygote(fd: int) -> None:
    import frameworks  # noqa: F401 - torch, numpy and the models, imported once for every fork
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    ctl = socket.socket(fileno=fd)
    buf, fds = b"", []
    while True:
        msg, got, _, _ = socket.recv_fds(ctl, 1 << 20, 2)
        if not msg:
            return
        buf += msg
        fds += got
        if not buf.endswith(b"\n"):
            continue
        spec, buf = json.loads(buf), b""
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                ctl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock_fd, log_fd = fds
                os.dup2(log_fd, 2)
                os.dup2(log_fd, 1)
                sock = socket.socket(fileno=sock_fd)
                serve(spec, sock.makefile("r"), sock.makefile("w"))
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        for f in fds:
            os.close(f)
        fds = []
        ctl.sendall((json.dumps({"ok": True, "pid": pid}) + "\n").encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["prepare-server", "zygote", "serve"])
    ap.add_argument("--sock", type=int)
    ap.add_argument("--spec")
    args = ap.parse_args()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (Python or C) must not corrupt the protocol
    sys.stdout = sys.stderr
    if args.mode == "zygote":
        zygote(args.sock)
    elif args.mode == "serve":
        serve(json.loads(args.spec), sys.stdin, proto)
    else:
        for line in sys.stdin:
            res = prepare(json.loads(line))
            proto.write(json.dumps(res) + "\n")
            proto.flush()
    # no finalizers: a model library's teardown (joining its thread pool) has nothing to add here
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
