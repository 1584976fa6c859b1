"""One PockEngine step on 1 and on 2 threads, alternated in one process: the thread check
of `run.py --check-threads` with less noise on a busy machine (the same trainer, the two
thread counts measured in turn, round after round; the order flips every round).

    PYTHONPATH=toolchain python bench/threads_ab.py [workload prefixes] [schemes] [rounds]
    e.g. POCK_MARCH=x86-64-v3 ... bench/threads_ab.py lstm_b1s16,transformer full,sparse 6

Prints per workload/scheme: median ms on 1 and on 2 threads, their ratio, and the median of
the per-round ratios (2t/1t < 1: two threads faster), with the 1-minute load average.
"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pockengine as pe  # noqa: E402
from models import workloads  # noqa: E402


def main(argv):
    keys = argv[0].split(",") if argv else ["lstm_b1s16", "lstm_b4s20", "transformer", "mobilenetv2"]
    schemes = argv[1].split(",") if len(argv) > 1 else ["full", "sparse"]
    rounds = int(argv[2]) if len(argv) > 2 else 6
    for w in workloads(False):
        if not any(w.key.startswith(k) for k in keys):
            continue
        for s in schemes:
            if s not in w.schemes:
                continue
            torch.manual_seed(0)
            model = w.make()
            x, y = w.inputs(torch.Generator().manual_seed(0))
            tr = pe.compile(model, x, y, loss="cross_entropy", update=w.schemes[s](model),
                            optimizer=pe.SGD(lr=0.01, momentum=0.9)).build()
            tr.set_num_threads(1)
            tr.step(x, y)
            t0 = time.perf_counter()
            tr.step(x, y)
            k = max(1, min(5, int(0.3 / max(time.perf_counter() - t0, 1e-4))))  # ~0.3 s a turn
            res, ratios = {1: [], 2: []}, []
            for r in range(rounds):
                got = {}
                for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                    tr.set_num_threads(n)
                    tr.step(x, y)  # warm-up
                    ts = []
                    for _ in range(k):
                        t0 = time.perf_counter()
                        tr.step(x, y)
                        ts.append(time.perf_counter() - t0)
                    got[n] = statistics.median(ts) * 1e3
                    res[n].append(got[n])
                ratios.append(got[2] / got[1])
            a, b = statistics.median(res[1]), statistics.median(res[2])
            print(f"{w.key}/{s}: 1t {a:.2f} ms, 2t {b:.2f} ms, 2t/1t {b / a:.2f} (median of per-round ratios "
                  f"{statistics.median(ratios):.2f}; {rounds} rounds x {k} steps; load {os.getloadavg()[0]:.1f})",
                  flush=True)
            tr.close()


if __name__ == "__main__":
    main(sys.argv[1:])
