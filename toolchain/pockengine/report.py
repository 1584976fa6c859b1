"""The human-readable summary `pock-build` writes next to the generated code."""
from __future__ import annotations

from .autodiff.rules import FULL
from .ir.ops import flops


def _mib(n: int) -> str:
    return f"{n / 2**20:.3f} MiB" if n >= 2**16 else f"{n} B"


def summary(prog, source) -> str:
    """The summary of prog whose step is `source` (a codegen.Source)."""
    s = prog.stats()
    lines = [f"# PockEngine program `{prog.name}`", "", f"structural hash `{source.hash}`", "",
             "## Cost per training step", "", "| quantity | value |", "|---|---|"]
    for key in ("arena_bytes", "arena_bytes_no_reorder", "state_bytes", "param_bytes", "optimizer_state_bytes",
                "forward_arena_bytes"):
        lines.append(f"| {key} | {_mib(s[key])} |")
    lines += [f"| flops_per_step | {s['flops_per_step'] / 1e6:.2f} MFLOP |",
              f"| trainable_elements | {s['trainable_elements']} of {s['total_parameter_elements']} |",
              f"| nodes | {s['num_nodes']} |", "", "## What is updated", "",
              "| parameter | shape | updated slice | elements | optimizer state |", "|---|---|---|---|---|"]
    opt_bytes = {}
    for v in prog.state.values():
        if v.kind == "opt_state":
            opt_bytes[v.name.split(":")[0]] = opt_bytes.get(v.name.split(":")[0], 0) + v.nbytes
    for v in prog.state.values():
        if v.kind != "param":
            continue
        k = prog.trained.get(v.name)
        if k is None:
            lines.append(f"| {v.name} | {list(v.shape)} | frozen | 0 | - |")
            continue
        part = "all" if k is FULL else f"[:, :{k}]"
        n = v.numel if k is FULL else v.numel // v.shape[1] * k
        lines.append(f"| {v.name} | {list(v.shape)} | {part} | {n} | {_mib(opt_bytes.get(v.name, 0))} |")
    lines += ["", "## Schedule", "", "| # | phase | op | module | output | MFLOP |", "|---|---|---|---|---|---|"]
    for i, n in enumerate(prog.order):
        out = next((o for o in n.outputs if o is not None), None)
        shape = f"{out.dtype}{list(out.shape)}" if out is not None else "(writes " + \
            ", ".join(m.name for m in n.mutates) + ")"
        lines.append(f"| {i} | {n.phase} | {n.op} | {n.source} | {shape} | {flops(n) / 1e6:.3f} |")
    lines += ["", "## Memory plan (arena)", "", "| tensor | offset | bytes | live steps |", "|---|---|---|---|"]
    for b in sorted(prog.plan.buffers, key=lambda b: (b.offset, b.first)):
        lines.append(f"| {b.value.name} | {b.offset} | {b.size} | {b.first}..{b.last} |")
    return "\n".join(lines) + "\n"
