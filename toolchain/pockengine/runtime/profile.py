"""Per-op profiles of a compiled training step: rows and tables.

    prof = trainer.profile(inputs, targets, steps=20)   # a Profile: list of row dicts
    print(format_table(prof))

A row is one node of the step's schedule:

    index, phase, op, kernel, module   what it is ("linear", "linear_fwd", "blocks.0.qkv (Linear)")
    flops                              FLOPs per step (the compiler's count)
    steps, total_ns                    profiled steps and the node's time summed over them
    ms                                 milliseconds per step
    pct                                share of the step's node time, in percent
    gflops                             flops / time, GFLOP/s (0 for nodes without FLOPs)
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence


class Profile(list):
    """The rows of Trainer.profile (one dict per node, in schedule order), with
    what was measured around them: `steps` profiled, `step_ms` (wall-clock
    milliseconds per step.step() call, which adds input checks and copies to
    the nodes' time), `losses` (the profiled steps' losses) and `model`."""

    def __init__(self, rows: Iterable[dict], *, model: str = "", steps: int = 0, step_ms: float = 0.0,
                 losses: Sequence[float] = ()):
        super().__init__(rows)
        self.model = model
        self.steps = steps
        self.step_ms = step_ms
        self.losses = list(losses)

    @property
    def node_ms(self) -> float:
        """Milliseconds per step spent in the nodes (the sum of the rows)."""
        return sum(r["ms"] for r in self)


def make_rows(entries: Iterable[Mapping]) -> list[dict]:
    """Rows from raw entries (index, phase, op, kernel, module, flops, steps, total_ns)."""
    rows = [dict(e) for e in entries]
    total_ns = sum(r["total_ns"] for r in rows)
    for r in rows:
        steps = max(r["steps"], 1)
        r["ms"] = r["total_ns"] / steps / 1e6
        r["pct"] = 100.0 * r["total_ns"] / total_ns if total_ns else 0.0
        r["gflops"] = r["flops"] / (r["ms"] * 1e6) if r["ms"] > 0 else 0.0  # FLOP/ns == GFLOP/s
    return rows


def summarize(rows: Iterable[Mapping], key: str = "op") -> list[dict]:
    """One row per distinct row[key] ("op", "kernel", "phase", "module"):
    {key, count, ms, pct, flops, gflops}, slowest first."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r[key], {key: r[key], "count": 0, "ms": 0.0, "pct": 0.0, "flops": 0})
        g["count"] += 1
        g["ms"] += r["ms"]
        g["pct"] += r["pct"]
        g["flops"] += r["flops"]
    out = sorted(groups.values(), key=lambda g: (-g["ms"], str(g[key])))
    for g in out:
        g["gflops"] = g["flops"] / (g["ms"] * 1e6) if g["ms"] > 0 else 0.0
    return out


def _num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _gflops(x: float) -> str:
    return f"{x:.2f}" if x > 0 else "-"


def _table(header: Sequence[str], right: Sequence[bool], body: list[Sequence[str]]) -> list[str]:
    """An aligned Markdown table (reads as plain text in a terminal too)."""
    body = [[c.replace("|", "\\|") for c in row] for row in body]
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right)) + "|"
    return [line(header), rule] + [line(row) for row in body]


def format_table(rows: Sequence[Mapping], top: int = 20) -> str:
    """The profile as text (Markdown tables): the `top` slowest nodes (index,
    phase, op, kernel, module, ms/step, % of step, GFLOP/s), then the time per
    op kind and per kernel (count, ms/step, %, GFLOP/s)."""
    model, step_ms = getattr(rows, "model", ""), getattr(rows, "step_ms", 0.0)
    rows = list(rows)
    node_ms = sum(r["ms"] for r in rows)
    flops = sum(r["flops"] for r in rows)
    steps = max((r["steps"] for r in rows), default=0)
    head = f"Profile{f' of {model}' if model else ''}: {len(rows)} nodes, {steps} steps; " \
           f"{_num(node_ms)} ms/step in the nodes"
    if step_ms:
        head += f" of {_num(step_ms)} ms/step measured ({100 * node_ms / step_ms:.0f}%)"
    head += f"; {flops / 1e6:.2f} MFLOP/step"
    if node_ms > 0:
        head += f", {flops / (node_ms * 1e6):.2f} GFLOP/s"
    out = [head, ""]

    slowest = sorted(rows, key=lambda r: (-r["ms"], r["index"]))[:top]
    out.append(f"Slowest {len(slowest)} of {len(rows)} nodes:" if len(slowest) < len(rows) else "Nodes by time:")
    out.append("")
    out += _table(["#", "phase", "op", "kernel", "module", "ms/step", "% step", "GFLOP/s"],
                  [True, False, False, False, False, True, True, True],
                  [[str(r["index"]), r["phase"], r["op"], r["kernel"], r["module"] or "-", _num(r["ms"], 4),
                    f"{r['pct']:.1f}", _gflops(r["gflops"])] for r in slowest])
    for key, title in (("op", "Per op"), ("kernel", "Per kernel")):
        out += ["", f"{title}:", ""]
        out += _table([key, "count", "ms/step", "% step", "GFLOP/s"], [False, True, True, True, True],
                      [[str(g[key]), str(g["count"]), _num(g["ms"], 4), f"{g['pct']:.1f}", _gflops(g["gflops"])]
                       for g in summarize(rows, key)])
    return "\n".join(out) + "\n"
