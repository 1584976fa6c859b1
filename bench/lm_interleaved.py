"""The held-out-like transformer LM (issue 39: d 192, 3 pre-LN blocks, vocab 6,000, batch 6 x 48
tokens, SGD with momentum), every row stepped in turn in ONE process: PyTorch eager fp32,
torch.compile, PockEngine on 2 threads and on 1 thread, each for the full update and the
sparse scheme (bench/models.py transformer_sparse; PyTorch's frozen parameters have
requires_grad False, so it skips their gradients as PockEngine does).

    PYTHONPATH=toolchain .venv/bin/python bench/lm_interleaved.py [--rounds 40] [--threads 2]
        [--schemes full,sparse] [--no-compile] [--heads 4] [--omp-active] [--size heldout|bench]
        [--ref-runtime PATH] [--json PATH]

--size bench steps `make bench`'s keyboard transformer LM b8x64 instead (vocab 8k, d 256, 4 blocks,
FFN 1024, 8 x 64 tokens); --ref-runtime PATH (or $POCK_BENCH_REF_RUNTIME, as for bench/run.py's
pockengine-ref rows) adds PockEngine rows "pockengine-ref" built over another tree's native/runtime
(the kernels before a change, say), stepped in the same rounds.

--json PATH also writes every row's p10 / median / p90 ms, median caller-CPU ms and first / last loss
with the run's settings (`make bench` writes lm_interleaved.json and, --size bench,
lm_bench_interleaved.json: bench/targets.py judges issue 39's targets from them).

Round r takes one step of every row (the order reversed every other round), after --warmup
rounds, so a changing machine load hits every row alike. Prints per row p10 / median / p90 ms
of its steps (wall clock) and the median CPU time of the calling thread per step (on one thread
the whole step's cost, robust to a busy machine's descheduling), and per scheme the ratios
(PyTorch eager median / row median; the median of the per-round ratios beside it; with
--threads 1 also the ratio of the CPU-time medians), torch.compile / PockEngine, and PockEngine 2 threads / 1 thread.
PyTorch runs on --threads threads throughout (torch.set_num_threads); PockEngine's 1-thread
row is its own trainer with set_num_threads(1).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

# PyTorch's OpenMP threads (libgomp, OMP_WAIT_POLICY unset) spin-wait after each parallel region:
# after a PyTorch step its worker keeps a core busy for tens of milliseconds, which in one process
# lands on the next row (PockEngine's pool then sees a busy machine and, by design, gives up its
# second core: the 2-thread rows turn bimodal).  PASSIVE makes them sleep at once; measured on this
# machine it leaves PyTorch's own steps as fast (eager full 57.0 ms passive vs 59.8 ms spinning, sparse
# 39.4 vs 40.2), so each row pays only for its own threads.  --omp-active keeps libgomp's default.
if __name__ == "__main__" and "--omp-active" not in sys.argv:  # before torch loads libgomp
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pockengine as pe  # noqa: E402
from models import KeyboardTransformer, transformer_sparse  # noqa: E402
from frameworks import ref_runtime  # noqa: E402
from tables import step_summary  # noqa: E402


class Size(NamedTuple):
    """The LM's shape and its batch."""
    vocab: int
    d: int
    layers: int
    ffn: int
    seq: int
    batch: int


SIZES = {"heldout": Size(6000, 192, 3, 768, 48, 6), "bench": Size(8000, 256, 4, 1024, 64, 8)}  # bench: models.py's b8x64
LR, MOMENTUM = 0.01, 0.9


def make_model(size: Size, heads: int) -> KeyboardTransformer:
    torch.manual_seed(0)
    return KeyboardTransformer(vocab=size.vocab, d=size.d, layers=size.layers, heads=heads, ffn=size.ffn,
                               seq=size.seq)


def make_batches(size: Size, n: int = 4):
    g = torch.Generator().manual_seed(0)
    shape = (size.batch, size.seq)
    return [((torch.randint(0, size.vocab, shape, generator=g),),
             (torch.randint(0, size.vocab, shape, generator=g),)) for _ in range(n)]


def update_of(scheme: str, model):
    return "full" if scheme == "full" else transformer_sparse(model)


def torch_row(size: Size, scheme: str, heads: int, batches, compiled: bool):
    """A step function of PyTorch (eager or torch.compile) on this scheme."""
    from pockengine.compiler.program import resolve_update
    model = make_model(size, heads)
    named = dict(model.named_parameters())
    trained = resolve_update({n: tuple(p.shape) for n, p in named.items()}, update_of(scheme, model))
    for n, p in named.items():
        p.requires_grad_(n in trained)
    opt = torch.optim.SGD([named[n] for n in trained], lr=LR, momentum=MOMENTUM)

    def loss_fn(x, y):
        out = model(x)
        return F.cross_entropy(out.reshape(-1, size.vocab), y.reshape(-1))

    if compiled:
        loss_fn = torch.compile(loss_fn)

    def step(i):
        (x,), (y,) = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def pe_row(size: Size, scheme: str, heads: int, batches, threads: int, runtime=None):
    from pockengine.compiler import program as P
    model = make_model(size, heads)
    x, y = batches[0]
    prog = pe.compile(model, x, y, loss="cross_entropy", update=update_of(scheme, model),
                      optimizer=pe.SGD(lr=LR, momentum=MOMENTUM), name=f"lm_d{size.d}_{scheme}")
    tr = P.build(prog, prog.emit(), runtime=runtime) if runtime else prog.build()
    tr.set_num_threads(threads)

    def step(i):
        return tr.step(*batches[i % len(batches)])
    step.trainer = tr
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--schemes", default="full,sparse")
    ap.add_argument("--size", choices=sorted(SIZES), default="heldout")
    ap.add_argument("--ref-runtime", nargs="?", const="", default=None,
                    help="also PockEngine rows (pockengine-ref) built over this native/runtime tree "
                         "(no PATH: $POCK_BENCH_REF_RUNTIME)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    ap.add_argument("--json", help="also write the rows' statistics here (bench/targets.py reads them)")
    ap.add_argument("--no-1t", action="store_true", help="leave out PockEngine's 1-thread rows")
    ap.add_argument("--omp-active", action="store_true",
                    help="leave OMP_WAIT_POLICY unset (PyTorch's threads spin after each step into the next row's)")
    a = ap.parse_args(argv)
    size = SIZES[a.size]
    ref = ref_runtime(a.ref_runtime) if a.ref_runtime is not None else None
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    batches = make_batches(size)
    rows = {}
    for s in a.schemes.split(","):
        rows[f"eager/{s}"] = torch_row(size, s, a.heads, batches, False)
        if not a.no_compile:
            rows[f"torch.compile/{s}"] = torch_row(size, s, a.heads, batches, True)
        rows[f"pockengine/{s}"] = pe_row(size, s, a.heads, batches, a.threads)
        if not a.no_1t:
            rows[f"pockengine-1t/{s}"] = pe_row(size, s, a.heads, batches, 1)
        if ref:
            rows[f"pockengine-ref/{s}"] = pe_row(size, s, a.heads, batches, a.threads, ref)
            if not a.no_1t:
                rows[f"pockengine-ref-1t/{s}"] = pe_row(size, s, a.heads, batches, 1, ref)
    names = list(rows)
    t0 = time.perf_counter()
    for r in range(a.warmup):  # torch.compile compiles here (forward and backward)
        for n in names:
            rows[n](r)
    print(f"# built and warmed up in {time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f}", flush=True)
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}  # the calling thread's CPU time: the step's whole cost on one thread
    losses = {n: [] for n in names}
    for r in range(a.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            t0, c0 = time.perf_counter(), time.thread_time()
            losses[n].append(rows[n](a.warmup + r))
            times[n].append((time.perf_counter() - t0) * 1e3)
            cpu[n].append((time.thread_time() - c0) * 1e3)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "size": a.size, **size._asdict(),
            "heads": a.heads, "threads": a.threads, "rounds": a.rounds, "load": os.getloadavg()[0],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}
    summary = step_summary(times, cpu, losses, meta)  # the table below and --json print the same numbers
    stats = summary["rows"]
    med = {n: st["median"] for n, st in stats.items()}
    print(f"# LM d{size.d} x{size.layers} heads {a.heads} ffn {size.ffn} vocab {size.vocab}, "
          f"batch {size.batch}x{size.seq}, SGD momentum; "
          f"{a.threads} threads; {a.rounds} interleaved rounds; load {meta['load']:.1f}; "
          f"OMP_WAIT_POLICY={meta['omp_wait_policy']}")
    print(f"{'row':26s} {'p10':>7s} {'median':>7s} {'p90':>7s}  p90/med  caller-CPU  loss first->last")
    for n, st in stats.items():
        print(f"{n:26s} {st['p10']:7.1f} {st['median']:7.1f} {st['p90']:7.1f}  {st['p90'] / st['median']:6.2f}"
              f"   {st['cpu_ms']:8.1f}   {st['loss_first']:.4f} -> {st['loss_last']:.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
        print(f"# wrote {a.json}")

    def ratio(num, den):
        per_round = statistics.median(t / u for t, u in zip(times[num], times[den]))
        return f"{med[num] / med[den]:.2f}x (per-round median {per_round:.2f}x)"
    for s in a.schemes.split(","):
        cpu_ratio = ""
        if a.threads == 1:
            cpu_ratio = f"; CPU time {statistics.median(cpu[f'eager/{s}']) / statistics.median(cpu[f'pockengine/{s}']):.2f}x"
        print(f"[{s}] eager / pockengine: {ratio(f'eager/{s}', f'pockengine/{s}')}{cpu_ratio}")
        if not a.no_compile:
            print(f"[{s}] torch.compile / pockengine: {ratio(f'torch.compile/{s}', f'pockengine/{s}')}; "
                  f"eager / torch.compile: {ratio(f'eager/{s}', f'torch.compile/{s}')}")
        if not a.no_1t:
            print(f"[{s}] pockengine {a.threads}t / 1t: {ratio(f'pockengine/{s}', f'pockengine-1t/{s}')}; "
                  f"eager / pockengine-1t: {ratio(f'eager/{s}', f'pockengine-1t/{s}')}")
        if ref:
            print(f"[{s}] pockengine-ref / pockengine ({a.threads}t): {ratio(f'pockengine-ref/{s}', f'pockengine/{s}')}")
            if not a.no_1t:
                print(f"[{s}] pockengine-ref-1t / pockengine-1t: "
                      f"{ratio(f'pockengine-ref-1t/{s}', f'pockengine-1t/{s}')}; CPU time "
                      f"{statistics.median(cpu[f'pockengine-ref-1t/{s}']) / statistics.median(cpu[f'pockengine-1t/{s}']):.2f}x")
    for n in names:
        tr = getattr(rows[n], "trainer", None)
        if tr is not None:
            tr.close()


if __name__ == "__main__":
    main()
