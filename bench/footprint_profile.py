"""Where a budgeted step's extra time goes (issue 36): the per-node profiler
(Trainer.profile) over the unbudgeted and a budgeted step of one footprint setup,
interleaved (A, B, A, B, ...), each node's median time; then the time per
(phase, op, kernel) of both, the recomputed nodes apart, and their GFLOP/s.

    PYTHONPATH=toolchain .venv/bin/python bench/footprint_profile.py smollm2:lora:256:62 [--rounds 3]
        [--json out.json]

Thread-CPU time is what the profiler's clock reads between nodes only when the
machine is quiet; under load compare the GFLOP/s of the same kernel in both
steps (the per-kernel table) rather than the totals.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import footprint  # noqa: E402


def node_keys(prog) -> list[tuple]:
    """Per scheduled node: (phase, op, recomputed?)."""
    return [(n.phase, n.op, bool(n.attrs.get("recompute"))) for n in prog.order]


def profile_pair(spec: str, rounds: int, steps: int = 1, threads: int = 1):
    import numpy as np
    model, scheme, seq, budget = spec.split(":")
    seq, budget = int(seq), float(budget)
    exports = {}
    progs = {"none": footprint.compile_row(model, scheme, seq, None, exports),
             "budget": footprint.compile_row(model, scheme, seq, budget, exports)}
    trainers = {k: p.build() for k, p in progs.items()}
    for t in trainers.values():
        t.set_num_threads(threads)  # the C driver's one thread
    vocab = footprint.MODELS[model][2]
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, size=(1, seq), dtype=np.int64)
    times = {k: [] for k in progs}  # per round: [ms per node]
    rows = {}
    step_ms = {k: [] for k in progs}
    for r in range(rounds):
        for k, t in trainers.items():
            prof = t.profile([x], [x], steps=steps, warmup=1 if r == 0 else 0)
            rows[k] = prof
            times[k].append([row["ms"] for row in prof])
            step_ms[k].append(prof.step_ms)
            print(f"round {r} {k}: {prof.step_ms:.1f} ms/step, nodes {prof.node_ms:.1f}", flush=True)
    out = {}
    for k, prog in progs.items():
        med = [statistics.median(c) for c in zip(*times[k])]
        keys = node_keys(prog)
        assert len(keys) == len(med), (len(keys), len(med))
        assert all(row["op"] == key[1] for row, key in zip(rows[k], keys)), "profile rows != schedule"
        out[k] = [dict(phase=key[0], op=key[1], recompute=key[2], kernel=row["kernel"], module=row["module"],
                       flops=row["flops"], ms=m) for key, row, m in zip(keys, rows[k], med)]
        out[k + "_step_ms"] = statistics.median(step_ms[k])
    for t in trainers.values():
        t.close()
    return out


def by_kernel(nodes, recompute=None):
    g = {}
    for n in nodes:
        if recompute is not None and n["recompute"] != recompute:
            continue
        key = (n["phase"], n["op"], n["kernel"], n["recompute"])
        e = g.setdefault(key, [0, 0.0, 0])
        e[0] += 1
        e[1] += n["ms"]
        e[2] += n["flops"]
    return g


def report(out) -> str:
    a, b = out["none"], out["budget"]
    lines = [f"step: unbudgeted {out['none_step_ms']:.1f} ms, budgeted {out['budget_step_ms']:.1f} ms "
             f"({out['budget_step_ms'] / out['none_step_ms']:.2f}x); nodes {sum(n['ms'] for n in a):.1f} / "
             f"{sum(n['ms'] for n in b):.1f} ms; FLOPs {sum(n['flops'] for n in a) / 1e9:.2f} / "
             f"{sum(n['flops'] for n in b) / 1e9:.2f} G", "",
             "| phase | op | kernel | recomputed | count A | ms A | GFLOP/s A | count B | ms B | GFLOP/s B |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    ga, gb = by_kernel(a), by_kernel(b)
    keys = sorted(set(ga) | set(gb), key=lambda k: -max(gb.get(k, [0, 0])[1], ga.get(k, [0, 0])[1]))
    for k in keys:
        ca, ma, fa = ga.get(k, [0, 0.0, 0])
        cb, mb, fb = gb.get(k, [0, 0.0, 0])
        gf = lambda f, m: f"{f / m / 1e6:.1f}" if m > 0 and f else "-"  # noqa: E731
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {'yes' if k[3] else ''} | {ca} | {ma:.2f} | {gf(fa, ma)} | "
                     f"{cb} | {mb:.2f} | {gf(fb, mb)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("setup", help="model:scheme:tokens:budget_MiB, e.g. smollm2:lora:256:62")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = profile_pair(args.setup, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
