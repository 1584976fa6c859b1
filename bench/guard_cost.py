"""What the non-finite guard costs per training step (issue 13).

The same model compiled twice, with the guard (the default) and without it
(pockengine.backends.cpu.NONFINITE_GUARD = False: no loss check before the
backward pass, no gradient check before each update; the C API's entry check
of float inputs stays, it is not in the generated code), timed alternately in
rounds on one batch (CPU time of the stepping thread, one kernel thread); prints
the median and the minimum over rounds of the ms/step of each and the difference.

    PYTHONPATH=toolchain .venv/bin/python bench/guard_cost.py [--rounds 7] [--steps 30] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pockengine as pe  # noqa: E402
from pockengine.backends import cpu  # noqa: E402
from models import workloads  # noqa: E402  (bench/models.py)


def build(w, scheme, guard: bool):
    cpu.NONFINITE_GUARD = guard
    try:
        model = w.make()
        (x,), (y,) = w.inputs(torch.Generator().manual_seed(0))
        prog = pe.compile(model, (x,), (y,), update=w.schemes[scheme](model), optimizer=pe.AdamW(lr=1e-3),
                          name=f"{w.key}_{scheme}_{'guard' if guard else 'noguard'}")
        return prog.build(), (x,), (y,)
    finally:
        cpu.NONFINITE_GUARD = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="lstm_b4s20,transformer_b8s64")
    ap.add_argument("--scheme", default="full")
    args = ap.parse_args()
    for w in workloads():
        if w.key not in args.only.split(","):
            continue
        runs = {g: build(w, args.scheme, g) for g in (True, False)}
        times = {True: [], False: []}
        for tr, xs, ys in runs.values():
            tr.set_num_threads(args.threads)
            assert args.threads == 1, "CPU time of the calling thread measures single-threaded steps only"
            tr.learning_rate = 0.0  # same work, weights stay put: rounds are comparable
            for _ in range(3):
                tr.step(xs, ys)
        # CPU time of this thread (the step runs here with --threads 1): on a shared machine the
        # wall clock also counts the time other processes hold the core
        for _ in range(args.rounds):
            for g, (tr, xs, ys) in runs.items():
                t0 = time.thread_time()
                for _ in range(args.steps):
                    tr.step(xs, ys)
                times[g].append((time.thread_time() - t0) / args.steps * 1e3)
        for stat in (statistics.median, min):
            on, off = stat(times[True]), stat(times[False])
            print(f"{w.key} {args.scheme} ({stat.__name__} of rounds): guard {on:.3f} ms/step, no guard {off:.3f} "
                  f"ms/step, cost {on - off:+.3f} ms ({(on - off) / off * 100:+.2f}%), threads {args.threads}, "
                  f"{args.rounds} rounds x {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
