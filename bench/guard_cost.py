"""What the non-finite guard costs per training step (issue 13), in each of its modes.

The same model compiled four ways and timed alternately in rounds on one batch (CPU time
of the stepping thread, one kernel thread); prints the median (and minimum) over rounds of
the ms/step of each, its difference to the unguarded reordered step, and each mode's arena:

  off        no guard (EmitOptions(nonfinite_guard=False)), updates reordered
             (exact_skip=False's schedule): the baseline
  off_last   no guard, updates after the whole backward (exact_skip=True's schedule): what
             the exact guard's schedule alone costs
  exact      pe.compile(exact_skip=True), the default: every gradient checked right after it
             is computed, every update after the whole backward
  nonexact   pe.compile(exact_skip=False): updates reordered, each update kernel checks its
             own gradient first (sgd_update/adamw_update(..., check_finite=true))
  separate   as nonexact, but the check is a pk::all_finite call before each update (the
             guard before the check moved into the update kernels)

The C API's entry check of float inputs is in every mode (it is not in the generated code).

    PYTHONPATH=toolchain .venv/bin/python bench/guard_cost.py [--rounds 9] [--steps 30] [--threads 1]
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
from pockengine import program as P  # noqa: E402
from pockengine.codegen import EmitOptions  # noqa: E402
from models import workloads  # noqa: E402  (bench/models.py)

MODES = {"off": (False, False), "off_last": (False, True), "exact": (True, True), "nonexact": (True, False),
         "separate": (True, False)}


def build(w, scheme, mode: str):
    """The step under `mode`'s EmitOptions ("separate": the guard before the folded one,
    pk::all_finite over the gradient then the update kernel: EmitOptions.update_check)."""
    guard, exact = MODES[mode]
    torch.manual_seed(0)
    model = w.make()
    (x,), (y,) = w.inputs(torch.Generator().manual_seed(0))
    prog = pe.compile(model, (x,), (y,), update=w.schemes[scheme](model), optimizer=pe.AdamW(lr=1e-3),
                      name=f"{w.key}_{scheme}_{mode}", exact_skip=exact)
    options = EmitOptions(nonfinite_guard=guard, exact_skip=exact,
                          update_check="separate" if mode == "separate" else "kernel")
    return P.build(prog, prog.emit(options=options)), (x,), (y,), prog.stats()["arena_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="transformer_b8s64,lstm_b4s20")
    ap.add_argument("--scheme", default="full")
    args = ap.parse_args()
    assert args.threads == 1, "CPU time of the calling thread measures single-threaded steps only"
    for w in workloads():
        if w.key not in args.only.split(","):
            continue
        runs = {m: build(w, args.scheme, m) for m in MODES}
        times = {m: [] for m in MODES}
        for tr, xs, ys, _ in runs.values():
            tr.set_num_threads(args.threads)
            tr.learning_rate = 0.0  # same work, weights stay put: rounds are comparable
            for _ in range(3):
                tr.step(xs, ys)
        # CPU time of this thread (the step runs here with --threads 1): on a shared machine the
        # wall clock also counts the time other processes hold the core.  The modes take turns
        # within each round, in a rotated order, so drifting load hits them alike.
        modes = list(MODES)
        for r in range(args.rounds):
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                tr, xs, ys, _ = runs[m]
                t0 = time.thread_time()
                for _ in range(args.steps):
                    tr.step(xs, ys)
                times[m].append((time.thread_time() - t0) / args.steps * 1e3)
        for stat in (statistics.median, min):
            base = stat(times["off"])
            for m in MODES:
                t, arena = stat(times[m]), runs[m][3]
                print(f"{w.key} {args.scheme} {m:9s} ({stat.__name__} of {args.rounds} rounds x {args.steps} steps): "
                      f"{t:.3f} ms/step, {(t - base) / base * 100:+.2f}% vs off, arena {arena / 2**20:.2f} MiB",
                      flush=True)
        # paired: each round's time over the same round's "off" (drifting load cancels), median over rounds
        for m in MODES:
            ratios = [a / b - 1 for a, b in zip(times[m], times["off"])]
            print(f"{w.key} {args.scheme} {m:9s} (median of per-round ratios to off): "
                  f"{statistics.median(ratios) * 100:+.2f}%, arena {runs[m][3] / 2**20:.2f} MiB", flush=True)


if __name__ == "__main__":
    main()
