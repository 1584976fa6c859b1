"""One PockEngine step on 1 and on 2 threads, alternated in one process: the thread check
of `run.py --check-threads` with less noise on a busy machine (the same trainer, the two
thread counts measured in turn, round after round; the order flips every round).

    PYTHONPATH=toolchain python bench/threads_ab.py [workload prefixes] [schemes] [rounds]
    e.g. POCK_MARCH=x86-64-v3 ... bench/threads_ab.py lstm_b1s16,transformer full,sparse 6

Prints per workload/scheme: median ms on 1 and on 2 threads, their ratio, and the median of
the per-round ratios (2t/1t < 1: two threads faster), with the 1-minute load average, and the
p10/median/p90 of every step on each thread count.

    ... bench/threads_ab.py --ref-runtime=/path/to/old/native/runtime transformer full,sparse 8

also builds each trainer over a second runtime (another threadpool.cpp, say; --ref-runtime with no
path: $POCK_BENCH_REF_RUNTIME, as bench/run.py's pockengine-ref rows) and times the two in the same
rounds: rows prefixed "ref " are that runtime's.
"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pockengine as pe  # noqa: E402
from pockengine.compiler import program as P  # noqa: E402
from models import workloads  # noqa: E402
from frameworks import ref_runtime  # noqa: E402
from run import percentile  # noqa: E402


def build(w, scheme, runtime=None):
    """A trainer of workload w / scheme, built against the native/runtime tree `runtime` when
    given (program.build's runtime=)."""
    torch.manual_seed(0)
    model = w.make()
    x, y = w.inputs(torch.Generator().manual_seed(0))
    prog = pe.compile(model, x, y, loss="cross_entropy", update=w.schemes[scheme](model),
                      optimizer=pe.SGD(lr=0.01, momentum=0.9))
    return P.build(prog, prog.emit(), runtime=runtime or None), x, y


def spread(ts):
    """p10 / median / p90 of ts (ms)."""
    return f"{percentile(ts, 0.1):.1f} / {statistics.median(ts):.1f} / {percentile(ts, 0.9):.1f}"


def main(argv):
    ref = None
    if argv and argv[0].split("=", 1)[0] == "--ref-runtime":
        ref = ref_runtime(argv.pop(0).partition("=")[2])
    keys = argv[0].split(",") if argv else ["lstm_b1s16", "lstm_b4s20", "transformer", "mobilenetv2"]
    schemes = argv[1].split(",") if len(argv) > 1 else ["full", "sparse"]
    rounds = int(argv[2]) if len(argv) > 2 else 6
    for w in workloads(False):
        if not any(w.key.startswith(k) for k in keys):
            continue
        for s in schemes:
            if s not in w.schemes:
                continue
            trainers = {"": build(w, s)}
            if ref:
                trainers["ref "] = build(w, s, ref)
            tr, x, y = trainers[""]
            tr.set_num_threads(1)
            tr.step(x, y)
            t0 = time.perf_counter()
            tr.step(x, y)
            k = max(1, min(5, int(0.3 / max(time.perf_counter() - t0, 1e-4))))  # ~0.3 s a turn
            configs = [(name, n) for name in trainers for n in (1, 2)]
            res = {c: [] for c in configs}
            steps = {c: [] for c in configs}
            ratios = {name: [] for name in trainers}
            for r in range(rounds):
                got = {}
                for c in (configs if r % 2 == 0 else configs[::-1]):
                    tr, x, y = trainers[c[0]]
                    tr.set_num_threads(c[1])
                    tr.step(x, y)  # warm-up
                    ts = []
                    for _ in range(k):
                        t0 = time.perf_counter()
                        tr.step(x, y)
                        ts.append((time.perf_counter() - t0) * 1e3)
                    got[c] = statistics.median(ts)
                    res[c].append(got[c])
                    steps[c] += ts
                for name in trainers:
                    ratios[name].append(got[(name, 2)] / got[(name, 1)])
            for name in trainers:
                a, b = statistics.median(res[(name, 1)]), statistics.median(res[(name, 2)])
                print(f"{name}{w.key}/{s}: 1t {a:.2f} ms, 2t {b:.2f} ms, 2t/1t {b / a:.2f} (median of per-round "
                      f"ratios {statistics.median(ratios[name]):.2f}; {rounds} rounds x {k} steps; load "
                      f"{os.getloadavg()[0]:.1f}); steps p10/median/p90 ms: 1t {spread(steps[(name, 1)])}, "
                      f"2t {spread(steps[(name, 2)])}", flush=True)
            for tr, _, _ in trainers.values():
                tr.close()


if __name__ == "__main__":
    main(sys.argv[1:])
