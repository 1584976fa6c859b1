"""The human-readable summary `pock-build` writes next to the generated code."""
from __future__ import annotations

import math

from ..ops import FULL, flops


def _mib(n: int) -> str:
    return f"{n / 2**20:.3f} MiB" if n >= 2**16 else f"{n} B"


# frozen weights stored in low precision (pe.compile(frozen_dtype=...)): IR dtype -> the keyword's name
FROZEN_NAMES = {"bf16": "bf16", "f16": "fp16", "i8": "int8", "q4": "q4"}


def logical_shape(v) -> list[int]:
    """A parameter's shape as the model has it (q4 stores [N, K] as packed nibbles [N, K / 2])."""
    return [*v.shape[:-1], 2 * v.shape[-1]] if v.dtype == "q4" else list(v.shape)


def _frozen_storage(prog) -> str:
    """How the frozen weights are stored: "fp32", or e.g. "q4: 3 tensors, 0.016 MiB (0.125 MiB as fp32)"."""
    low = [v for v in prog.state.values() if v.kind == "param" and v.dtype in FROZEN_NAMES]
    if not low:
        return "fp32"
    kinds = sorted({FROZEN_NAMES[v.dtype] for v in low})
    stored = sum(v.nbytes + (prog.state[v.name + ":scale"].nbytes if v.name + ":scale" in prog.state else 0)
                 for v in low)
    fp32 = sum(4 * math.prod(logical_shape(v)) for v in low)
    plural = "s" if len(low) != 1 else ""
    return f"{'/'.join(kinds)}: {len(low)} tensor{plural}, {_mib(stored)} ({_mib(fp32)} as fp32)"


def summary(prog, source) -> str:
    """The summary of prog whose step is `source` (a codegen.Source)."""
    s = prog.stats()
    lines = [f"# PockEngine program `{prog.name}`", "", f"structural hash `{source.hash}`", "",
             "## Cost per training step", "", "| quantity | value |", "|---|---|"]
    for key in ("arena_bytes", "arena_bytes_no_reorder", "state_bytes", "param_bytes", "optimizer_state_bytes",
                "forward_arena_bytes"):
        lines.append(f"| {key} | {_mib(s[key])} |")
    lines.append(f"| frozen_dtype | {_frozen_storage(prog)} |")
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
            stored = f" ({FROZEN_NAMES[v.dtype]})" if v.dtype in FROZEN_NAMES else ""
            lines.append(f"| {v.name} | {logical_shape(v)} | frozen{stored} | 0 | - |")
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
