"""PockEngine training-step benchmark against PyTorch eager, torch.compile, ExecuTorch training
and ONNX Runtime training, side by side in one run (`make bench`).

    .venv/bin/python bench/run.py            # full: writes bench/results.md, .png, .json
    .venv/bin/python bench/run.py --quick    # miniature models, few steps, PockEngine + eager only

How it measures (see bench/README.md):
  * each (model, scheme, framework) runs in its own worker process (bench/worker.py, forked
    from a "zygote" that has torch imported already); the artifacts (PockEngine library,
    ExecuTorch .pte, ONNX Runtime training artifacts) are made first, by separate `prepare`
    processes, two at a time;
  * per (model, scheme) all workers load and warm up, then the timed steps run in rounds that
    alternate the frameworks (rotating the order), one process stepping at a time;
  * ms/step is the median of >= --steps timed steps (with their p10 and p90: steady steps have
    p90 close to the median); speed ratio = eager ms / framework ms;
    GFLOP/s = PockEngine's flops_per_step (the same FLOP count for every framework) / time;
    % of peak = GFLOP/s / the all-core FMA peak measured by bench/fma_peak.cpp;
  * training memory = peak RSS over warm-up + timed steps (VmHWM, reset through
    /proc/self/clear_refs, else a sampling thread) - RSS once the model is loaded, plus what the
    framework allocated and touched for training before that baseline (PockEngine's arena and
    optimizer state; ExecuTorch's memory-planned buffers).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from tables import pct_reference, percentile  # noqa: E402,F401  (llm.py, threads_ab.py import percentile from here)

# pockengine-1t / -v3 / -v3-1t: the same step on one thread and built for -march=x86-64-v3
# (bench/frameworks.py); eager-1t: PyTorch eager on one thread; eager-v3[-1t]: PyTorch eager with its
# kernels capped at AVX2 (ATen, MKL, oneDNN), the reference of the -v3 rows; pockengine-ref[-1t] (not run by default) builds against the runtime in
# $POCK_BENCH_REF_RUNTIME for a before/after comparison in one run; pockengine-fused-v3-1t (not run by
# default) compiles with exact_skip=False, so each update runs as its gradient completes and a
# linear weight's update is fused into its weight-gradient GEMM.
ALL_FRAMEWORKS = ["pockengine", "pockengine-1t", "pockengine-v3", "pockengine-v3-1t", "pockengine-vulkan", "eager",
                  "eager-1t", "eager-v3", "eager-v3-1t", "torch.compile", "executorch", "onnxruntime", "pockengine-ref", "pockengine-ref-1t",
                  "pockengine-ref-v3", "pockengine-ref-v3-1t", "pockengine-fused-v3-1t"]
DEFAULT_FRAMEWORKS = [f for f in ALL_FRAMEWORKS if not f.startswith(("pockengine-ref", "pockengine-fused"))]
PREPARED = {"pockengine", "pockengine-1t", "pockengine-v3", "pockengine-v3-1t", "pockengine-vulkan", "torch.compile",
            "executorch", "onnxruntime", "pockengine-ref", "pockengine-ref-1t", "pockengine-ref-v3",
            "pockengine-ref-v3-1t", "pockengine-fused-v3-1t"}  # frameworks with a prepare step
CACHED = {"executorch", "onnxruntime"}  # their artifacts depend only on bench/ and the package versions

T0 = time.perf_counter()
SETTLE_S = 0.25  # idle time before each framework's share of a round (measure_config)
LOADS: list[float] = []


def sample_load():
    """The 1-minute load average every 5 s: other work on the machine skews every timing."""
    while True:
        LOADS.append(os.getloadavg()[0])
        time.sleep(5)


def log(msg: str):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# ============================================================================ machine peak
def fma_peak(threads: int, out_dir: Path, march: str = "native") -> dict:
    exe = out_dir / f"fma_peak-{march}"
    cmd = ["g++", "-O3", f"-march={march}", "-std=c++17", "-pthread", str(HERE / "fma_peak.cpp"), "-o", str(exe)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        log(f"FMA peak microbenchmark failed: {e}")
        return {}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ============================================================================ availability
def probe(framework: str) -> tuple[bool, str]:
    """(available, version or the reason it is not)."""
    from frameworks import env_python
    code = {
        "pockengine": "import pockengine; print(pockengine.__version__)",
        # the Vulkan column: glslc and a device (`vulkaninfo --summary`), else n/a with the reason
        "pockengine-vulkan": "import shutil, subprocess, pockengine; assert shutil.which('glslc'), 'glslc not "
                             "installed'; r = subprocess.run(['vulkaninfo', '--summary'], capture_output=True, "
                             "text=True); d = [ln.split('=', 1)[1].strip() for ln in r.stdout.splitlines() "
                             "if ln.strip().startswith('deviceName')]; "
                             "assert d, 'no Vulkan device (vulkaninfo --summary lists none)'; "
                             "print(pockengine.__version__, 'on', d[0])",
        "eager": "import torch; print(torch.__version__)",
        "torch.compile": "import torch, shutil; assert shutil.which('g++') or shutil.which('c++'), "
                         "'no C++ compiler for inductor'; print(torch.__version__)",
        "executorch": "import warnings; warnings.filterwarnings('ignore'); import importlib.metadata as m; "
                      "import executorch.extension.training; print(m.version('executorch'))",
        "onnxruntime": "import importlib.metadata as m; import onnxruntime.training.api, onnx; "
                       "print(m.version('onnxruntime-training'), 'onnx', onnx.__version__)",
    }["pockengine" if framework.startswith("pockengine-") and framework != "pockengine-vulkan"
      else "eager" if framework.startswith("eager-") else framework]
    py = env_python(framework)
    if not Path(py).exists():
        return False, f"not installed ({Path(py).parent.parent.name} missing; `make bench` installs it)"
    try:
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"not runnable: {e}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"not installed: {last}"
    return True, r.stdout.strip().splitlines()[-1]


# ============================================================================ processes
def worker_env(threads):
    """The workers' environment.  They run in bench/, so PYTHONPATH's relative entries are made
    absolute (from the caller's directory) and this checkout's toolchain/ goes first: a relative
    `PYTHONPATH=toolchain` would otherwise name bench/toolchain, and the workers would silently
    import whichever pockengine the venv holds (another checkout's, installed editable)."""
    env = dict(os.environ)
    paths = [str(ROOT / "toolchain")] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore",
               TORCHINDUCTOR_COMPILE_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def first_line(msg: str, limit=300) -> str:
    msg = " ".join(msg.split())
    for tail in (" Please feel free to request support", " [Caused by", " There are a few things to try"):
        msg = msg.split(tail)[0]
    return msg if len(msg) <= limit else msg[:limit] + " ..."


def source_key() -> str:
    h = hashlib.sha256()
    for f in ("models.py", "frameworks.py", "worker.py"):
        h.update((HERE / f).read_bytes())
    return h.hexdigest()[:16]


def _readline(f, timeout):
    """A line from f, "" at EOF, None after timeout seconds."""
    box = []
    t = threading.Thread(target=lambda: box.append(f.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else None


class PrepareServer:
    """A long-lived `worker.py prepare-server` for one interpreter: one job at a time."""

    def __init__(self, python, args, logf):
        self.log = open(logf, "a")
        self.p = subprocess.Popen([python, "-u", str(HERE / "worker.py"), "prepare-server"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
                                  env=worker_env(args.threads), cwd=str(HERE))

    def run(self, job: dict, timeout) -> dict:
        self.log.write(f"\n===== {job}\n")
        self.log.flush()
        try:
            self.p.stdin.write(json.dumps(job) + "\n")
            self.p.stdin.flush()
        except OSError:
            pass
        line = _readline(self.p.stdout, timeout)
        if line is None:
            self.close(kill=True)
            return {"ok": False, "error": f"prepare timed out after {timeout} s"}
        if not line:
            code = self.p.wait()
            self.log.flush()
            tail = Path(self.log.name).read_text().strip().splitlines()[-2:]
            return {"ok": False, "error": f"prepare process died (exit {code}): {' | '.join(tail)}"}
        return json.loads(line)

    @property
    def alive(self):
        return self.p.poll() is None

    def close(self, kill=False):
        if kill and self.p.poll() is None:
            self.p.kill()
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def prepare_all(jobs, args, versions, art_root, logs):
    """Run the prepare jobs on two slots (the cores), each slot keeping one server per interpreter."""
    from frameworks import env_python
    queue = list(jobs)
    lock = threading.Lock()
    results = {}
    counter = [0]

    def slot(k):
        servers = {}
        while True:
            with lock:
                if not queue:
                    break
                job = queue.pop(0)
            wl, scheme, fw = job
            art = art_root / wl / scheme / fw.replace(".", "_")
            manifest = art / "prep.json"
            key = {"source": source_key(), "version": versions.get(fw, "")}
            res = None
            if fw in CACHED and manifest.exists():
                try:
                    cached = json.loads(manifest.read_text())
                    if cached.get("key") == key:
                        res = {"ok": True, "prep": cached["prep"], "seconds": 0.0, "cached": True}
                except (OSError, ValueError):
                    pass
            if res is None:
                if art.exists():
                    shutil.rmtree(art)
                art.mkdir(parents=True)
                py = env_python(fw)
                if py not in servers or not servers[py].alive:
                    servers[py] = PrepareServer(py, args, logs / f"prepare-{k}-{Path(py).parent.parent.name}.log")
                res = servers[py].run({"framework": fw, "workload": wl, "scheme": scheme, "quick": args.quick,
                                       "threads": args.threads, "art_dir": str(art)}, args.prepare_timeout)
                if res.get("ok"):
                    manifest.write_text(json.dumps({"key": key, "prep": res["prep"]}))
            with lock:
                results[job] = res
                counter[0] += 1
                status = ("cached" if res.get("cached") else f"{res['seconds']:.1f} s") if res.get("ok") else \
                    "n/a: " + first_line(res.get("error", "?"), 160)
                log(f"  prepare [{counter[0]}/{len(jobs)}] {wl}/{scheme} {fw}: {status}")
        for srv in servers.values():
            srv.close()

    threads = [threading.Thread(target=slot, args=(k,)) for k in range(max(1, min(2, args.threads)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Zygote:
    """A `worker.py zygote` for one interpreter: forks serve workers with torch already imported."""

    def __init__(self, python, args, logf, extra_env=None):
        self.ctl, child = socket.socketpair()
        self.log = open(logf, "w")
        self.p = subprocess.Popen([python, "-u", str(HERE / "worker.py"), "zygote", "--sock", str(child.fileno())],
                                  pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=self.log,
                                  stderr=self.log, env={**worker_env(args.threads), **(extra_env or {})}, cwd=str(HERE))
        child.close()
        self.rf = self.ctl.makefile("r")
        self.lock = threading.Lock()

    def fork(self, spec: dict, logf: Path):
        """-> (socket to the new worker, pid) or raises RuntimeError."""
        mine, theirs = socket.socketpair()
        with open(logf, "w") as lf, self.lock:
            socket.send_fds(self.ctl, [(json.dumps(spec) + "\n").encode()], [theirs.fileno(), lf.fileno()])
            line = _readline(self.rf, 300)
        theirs.close()
        if not line:
            mine.close()
            self.log.flush()
            tail = Path(self.log.name).read_text().strip().splitlines()[-2:]
            raise RuntimeError(f"worker zygote failed: {' | '.join(tail)}")
        return mine, json.loads(line)["pid"]

    def close(self):
        self.rf.close()
        self.ctl.close()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


class Worker:
    """One serve worker (forked by a zygote), spoken to over a Unix socket."""

    def __init__(self, zygote: Zygote, spec: dict, logf: Path):
        self.logf = logf
        self.pid = None
        try:
            self.sock, self.pid = zygote.fork(spec, logf)
            self.rf, self.wf = self.sock.makefile("r"), self.sock.makefile("w")
        except RuntimeError as e:
            self.sock, self.error = None, str(e)

    def read(self, timeout):
        if self.sock is None:
            return {"ok": False, "error": self.error}
        line = _readline(self.rf, timeout)
        if line is None:
            self.kill()
            return {"ok": False, "error": f"no answer within {timeout:.0f} s"}
        if not line:
            tail = self.logf.read_text().strip().splitlines()[-2:] if self.logf.exists() else []
            return {"ok": False, "error": f"worker died: {' | '.join(tail)}"}
        return json.loads(line)

    def send(self, obj):
        try:
            self.wf.write(json.dumps(obj) + "\n")
            self.wf.flush()
        except OSError:
            pass

    def kill(self):
        if self.pid:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def close(self):
        if self.sock is not None:
            for f in (self.rf, self.wf, self.sock):
                try:
                    f.close()
                except OSError:
                    pass
        # a worker that finished exits on its own; give it a moment, then make sure
        deadline = time.time() + 10
        while self.pid and time.time() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        self.kill()


# ============================================================================ one (model, scheme)
def zygote_key(fw: str):
    """(interpreter, extra environment) of the zygote a framework's workers fork from."""
    from frameworks import env_python, framework_env
    return env_python(fw), tuple(sorted(framework_env(fw).items()))


def reference_ms(fw: str, res: dict) -> float | None:
    """The PyTorch eager time a row's speed ratio is taken against: the same thread count (eager-1t
    for a -1t row) and, for a -march=x86-64-v3 row, PyTorch held to AVX2 (eager-v3[-1t]) when those ran."""
    def ms(name):
        return res.get(name, {}).get("ms") if res.get(name, {}).get("status") == "ok" else None
    one = fw.endswith("-1t")
    if "-v3" in fw and fw.startswith("pockengine") and ms("eager-v3-1t" if one else "eager-v3"):
        return ms("eager-v3-1t" if one else "eager-v3")
    return (ms("eager-1t") if one else None) or ms("eager")


# Vulkan on a CPU implementation (lavapipe/llvmpipe) is a sanity check, not a GPU timing: a row
# whose warm-up step took longer than this there is not timed (the transformer's full step takes
# 37 s on lavapipe: its 20 timed steps alone would add 12 minutes to make bench).  Its results
# are checked against the CPU backend by tests/backends/vulkan either way.
CPU_VULKAN_MAX_STEP_S = 2.0


def untimed_reason(fw: str, ready: dict) -> str | None:
    """Why a loaded framework is not timed (None: it is): a CPU-Vulkan row whose fastest warm-up
    step took longer than CPU_VULKAN_MAX_STEP_S."""
    step_s = min(ready.get("warmup_s") or [0.0])
    if fw == "pockengine-vulkan" and any("CPU Vulkan" in n for n in ready.get("notes", [])) \
            and step_s > CPU_VULKAN_MAX_STEP_S:
        return (f"Vulkan on a CPU (lavapipe): a step took {step_s:.1f} s, not timed "
                f"(its results are checked against the CPU backend in tests/backends/vulkan)")
    return None


def measure_config(wl, scheme, fws, preps, args, logs, zygotes):
    """Run every framework on one (model, scheme) in interleaved rounds; -> {fw: result}."""
    results = {}
    workers = {}
    for fw in fws:
        spec = {"framework": fw, "workload": wl, "scheme": scheme, "quick": args.quick, "threads": args.threads,
                "warmup": args.warmup, "warmup_budget_s": args.warmup_budget, "prep": preps.get(fw)}
        workers[fw] = Worker(zygotes[zygote_key(fw)], spec, logs / f"serve-{wl}-{scheme}-{fw}.log")
    # all workers load and warm up concurrently (nothing is timed yet)
    for fw, w in workers.items():
        ready = w.read(args.load_timeout)
        if not ready.get("ok"):
            results[fw] = {"status": "n/a", "reason": first_line(ready.get("error", "?"))}
            w.kill()
        elif (why := untimed_reason(fw, ready)) is not None:
            results[fw] = {"status": "n/a", "reason": why}
            w.kill()
        else:
            results[fw] = {"status": "ok", "ready": ready, "times": []}
    live = [fw for fw in fws if results[fw]["status"] == "ok"]
    per_round = [args.steps // args.rounds + (1 if r < args.steps % args.rounds else 0) for r in range(args.rounds)]
    for r, n in enumerate(per_round):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for fw in order:
            if results[fw]["status"] != "ok":
                continue
            # let the previous framework's spin-waiting threads (OpenMP, ONNX Runtime's pool, ours)
            # go idle first: spinning on the other core, they would push this framework's thread
            # pool into its busy-machine back-off (a 2-thread row timed as if on one core)
            time.sleep(SETTLE_S)
            workers[fw].send({"run": n})
            ans = workers[fw].read(args.step_timeout * n + 60)
            if not ans.get("ok"):
                results[fw] = {"status": "n/a", "reason": first_line("during timed steps: " + ans.get("error", "?"))}
                workers[fw].kill()
                continue
            if not ans.get("finite", True):
                results[fw]["nonfinite"] = True
            results[fw]["times"] += ans["times"]
            results[fw]["loss"] = ans["loss"]
    for fw in live:
        res = results[fw]
        if res["status"] != "ok":
            continue
        workers[fw].send({"finish": True})
        fin = workers[fw].read(60)
        ready = res.pop("ready")
        times = res["times"]
        losses = fin.get("losses") or []
        # the loss of step steps+1: every framework got there (at least one warm-up step), on the
        # same batch, whatever its number of warm-up steps
        res.update(final_loss=losses[args.steps] if len(losses) > args.steps else None,
                   ms=1000 * statistics.median(times), ms_min=1000 * min(times), ms_max=1000 * max(times),
                   ms_p10=1000 * percentile(times, 0.1), ms_p90=1000 * percentile(times, 0.9),
                   n=len(times), warmup=len(ready.get("warmup_s", [])), first_loss=ready.get("first_loss"),
                   load_s=ready.get("load_s"), notes=ready.get("notes", []), hwm_method=ready.get("hwm_method"))
        if fin.get("ok"):
            pre = ready.get("preallocated_bytes", 0) or 0
            res["mem_mib"] = max(0.0, (fin["peak_kb"] - ready["rss_loaded_kb"]) * 1024 + pre) / 2**20
            res["rss_loaded_mib"] = ready["rss_loaded_kb"] / 1024
            res["peak_rss_mib"] = fin["peak_kb"] / 1024
        if res.get("nonfinite"):
            res["notes"] = res["notes"] + ["non-finite loss"]
    for w in workers.values():
        w.close()
    return results


# ============================================================================ main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="miniature models, few steps, PockEngine + eager only")
    ap.add_argument("--steps", type=int, help="timed steps per framework (default 20; quick 6)")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default 3, fewer where they take > "
                    "--warmup-budget; quick 1)")
    ap.add_argument("--warmup-budget", type=float, default=2.0,
                    help="stop warming up after this many seconds (at least one warm-up step)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds the timed steps are split into (default 4; quick 2)")
    ap.add_argument("--threads", type=int, help="threads for every framework (default: the cores; quick: 1)")
    ap.add_argument("--frameworks", help=f"comma-separated subset of {','.join(ALL_FRAMEWORKS)}")
    ap.add_argument("--models", help="comma-separated workload keys or prefixes (e.g. lstm,transformer)")
    ap.add_argument("--schemes", help="comma-separated subset of full,last,sparse")
    ap.add_argument("--out", help="output directory (default bench/; quick: bench/out-quick/)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--check-threads", action="store_true",
                    help="exit 1 when a PockEngine build's step is more than 5%% slower on all threads than on "
                    "one in this run (needs its -1t framework too, e.g. pockengine,pockengine-1t)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (6 if args.quick else 20)
    args.threads = args.threads or (1 if args.quick else os.cpu_count() or 1)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.rounds = max(1, min(args.rounds or (2 if args.quick else 4), args.steps))
    args.prepare_timeout, args.load_timeout, args.step_timeout = (120, 120, 30) if args.quick else (900, 900, 120)
    return args


def main(argv=None):
    args = parse_args(argv)
    from models import workloads
    out = Path(args.out) if args.out else (HERE / "out-quick" if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    # logs and artifacts beside an explicit --out (two runs at once, e.g. two test workers each
    # running --quick into its own folder, must not clear each other's logs), else bench/.work
    work = (out / ".work" if args.out else HERE / ".work") / ("quick" if args.quick else "full")
    logs = work / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    art_root = work / "artifacts"

    fws = args.frameworks.split(",") if args.frameworks else (
        ["pockengine", "eager"] if args.quick else list(DEFAULT_FRAMEWORKS))
    bad = [f for f in fws if f not in ALL_FRAMEWORKS]
    if bad:
        raise SystemExit(f"unknown framework(s) {bad}; choose from {ALL_FRAMEWORKS}")
    if "eager" not in fws:
        fws.insert(0, "eager")  # the reference every ratio is taken against
    wls = workloads(args.quick)
    if args.models:
        keys = args.models.split(",")
        wls = [w for w in wls if any(w.key.startswith(k) for k in keys)]
    schemes = args.schemes.split(",") if args.schemes else ["full", "last", "sparse"]
    configs = [(w, s) for w in wls for s in schemes if s in w.schemes]

    threading.Thread(target=sample_load, daemon=True).start()
    load0 = os.getloadavg()[0]
    if load0 > 0.75 * (os.cpu_count() or 1):
        log(f"warning: the machine is busy (1-minute load average {load0:.1f} on {os.cpu_count()} cores); "
            "timings will be skewed")
    log(f"PockEngine training-step benchmark ({'quick' if args.quick else 'full'}): {len(configs)} model/scheme "
        f"pairs x {len(fws)} frameworks, {args.threads} threads, {args.warmup} warm-up + {args.steps} timed steps "
        f"in {args.rounds} interleaved rounds")
    peak = fma_peak(os.cpu_count() or 1, work)
    if peak:
        log(f"FMA peak ({peak['isa']}): {peak['single_gflops']:.1f} GFLOP/s on one core, "
            f"{peak['all_gflops']:.1f} GFLOP/s on {peak['threads']} threads")

    versions, unavailable = {}, {}
    with ThreadPoolExecutor(len(fws)) as ex:
        for fw, (ok, info) in zip(fws, ex.map(probe, fws)):
            (versions if ok else unavailable)[fw] = info
            log(f"{fw:14s} {'ok ' + info if ok else 'n/a: ' + info}")

    # ---- prepare artifacts, two processes at a time (the machine's cores; nothing is timed yet)
    jobs = [(w.key, s, fw) for w, s in configs for fw in fws if fw in PREPARED and fw in versions]
    zygotes = {key: Zygote(key[0], args, logs / f"zygote-{Path(key[0]).parent.parent.name}{'-avx2' if key[1] else ''}.log",
                           dict(key[1]))
               for key in {zygote_key(fw) for fw in versions}}
    log(f"preparing {len(jobs)} artifacts ...")
    preps = prepare_all(jobs, args, versions, art_root, logs)

    # ---- measure
    rows = []
    for i, (w, s) in enumerate(configs, 1):
        cfg_fws, res = [], {}
        for fw in fws:
            if fw in unavailable:
                res[fw] = {"status": "n/a", "reason": unavailable[fw]}
            elif fw in PREPARED and not preps[(w.key, s, fw)].get("ok"):
                res[fw] = {"status": "n/a", "reason": first_line(preps[(w.key, s, fw)].get("error", "?"), 400)}
            else:
                cfg_fws.append(fw)
        t_cfg = time.perf_counter()
        log(f"[{i}/{len(configs)}] {w.key}/{s}: {', '.join(cfg_fws)} ...")
        res.update(measure_config(w.key, s, cfg_fws, {fw: preps[(w.key, s, fw)]["prep"] for fw in cfg_fws
                                                        if fw in PREPARED}, args, logs, zygotes))
        pe_prep = preps.get((w.key, s, "pockengine"), {})
        for other in [fw for fw in fws if fw.startswith("pockengine-")]:
            if not pe_prep.get("ok"):  # every PockEngine build compiles the same program (the same FLOPs)
                pe_prep = preps.get((w.key, s, other), {})
        stats = pe_prep.get("prep", {}).get("stats") if pe_prep.get("ok") else None
        flops = stats["flops_per_step"] if stats else None
        eager_ms = res.get("eager", {}).get("ms")
        parts = []
        for fw in fws:
            r = res[fw]
            row = {"workload": w.key, "title": w.title, "scheme": s, "framework": fw, "status": r["status"],
                   "flops_per_step": flops}
            if r["status"] == "ok":
                row.update({k: r.get(k) for k in ("ms", "ms_p10", "ms_p90", "ms_min", "ms_max", "n", "warmup", "mem_mib", "first_loss", "final_loss",
                                                  "loss", "load_s", "rss_loaded_mib", "peak_rss_mib", "hwm_method")})
                row["notes"] = r.get("notes", [])
                # the 1-thread rows against PyTorch on one thread, the -v3 rows against PyTorch on AVX2
                ref_ms = reference_ms(fw, res)
                row["ratio"] = ref_ms / r["ms"] if ref_ms else None
                row["ratio_vs_eager"] = eager_ms / r["ms"] if eager_ms else None
                row["gflops"] = flops / (r["ms"] / 1000) / 1e9 if flops else None
                row["gflops_for_pct"] = True
                parts.append(f"{fw} {r['ms']:.4g} ms" + (f" (x{row['ratio']:.2f})" if row["ratio"] else ""))
            else:
                row["reason"] = r["reason"]
                parts.append(f"{fw} n/a")
            rows.append(row)
        log(f"        {'; '.join(parts)} [{time.perf_counter() - t_cfg:.0f} s]")

    for z in zygotes.values():
        z.close()
    peak2 = fma_peak(os.cpu_count() or 1, work)  # again at the end: keep the better of the two
    if peak2 and (not peak or peak2["all_gflops"] > peak["all_gflops"]):
        peak = {**peak2, "single_gflops": max(peak2["single_gflops"], peak.get("single_gflops", 0))}
    meta = {"loss_step": args.steps + 1, "warmup_budget": args.warmup_budget, "quick": args.quick, "load_avg": {"start": load0, "max": max(LOADS or [load0]),
                                              "mean": statistics.mean(LOADS or [load0])}, "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
            "rounds": args.rounds, "cpu": cpu_name(), "cores": os.cpu_count(), "peak": peak,
            "versions": versions, "unavailable": unavailable, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.perf_counter() - T0,
            "stats": {f"{k[0]}/{k[1]}": v["prep"]["stats"] for k, v in preps.items()
                      if k[2].startswith("pockengine") and k[2] != "pockengine-vulkan" and v.get("ok")}}
    if not args.quick:
        try:  # memory-bound kernels in GB/s against the measured bandwidth (one thread)
            from kernels_bw import measure
            meta["kernels_bw"] = [measure(march=m) for m in ("native", "x86-64-v3")]
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            log(f"kernel bandwidth benchmark failed: {e}")
    # the AVX2 (+FMA) peak, against which the -v3 rows are judged (issue 17's targets are on that build)
    peak_v3 = fma_peak(os.cpu_count() or 1, work, "x86-64-v3") if platform.machine() == "x86_64" else {}
    meta["peak_v3"] = peak_v3
    ref = (peak.get("single_gflops") if args.threads == 1 else peak.get("all_gflops")) if peak else None
    meta["peak_ref_gflops"] = ref
    for row in rows:
        if row.pop("gflops_for_pct", False):
            row_ref = pct_reference(row["framework"], args.threads, peak, peak_v3)
            row["pct_peak"] = 100 * row["gflops"] / row_ref if row.get("gflops") and row_ref else None
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    from report import write_markdown, write_plot
    write_markdown(out / "results.md", meta, rows)
    log(f"wrote {out / 'results.md'}")
    if not args.no_plot:
        try:
            write_plot(out / "results.png", meta, rows)
            log(f"wrote {out / 'results.png'}")
        except ImportError as e:
            log(f"no plot: {e}")
    log(f"done in {time.perf_counter() - T0:.0f} s")
    if args.check_threads:
        from report import slower_on_more_threads, thread_pairs
        if not thread_pairs(rows):
            log("--check-threads: no framework ran both on 1 thread and on all (add e.g. pockengine-1t)")
            return 1
        slow = slower_on_more_threads(rows)
        for line in slow:
            log(f"slower on {args.threads} threads than on 1: {line}")
        log(f"--check-threads: {'FAILED' if slow else 'ok'} ({len(thread_pairs(rows))} pairs)")
        return 1 if slow else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
