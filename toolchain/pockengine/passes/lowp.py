"""Store frozen weights in low precision (compile(frozen_dtype=...)).

A frozen 2-D parameter is converted when every node that reads it dequantizes
in its kernel: linear (weight), linear_bwd_input (the activation gradient
through a frozen layer) and embedding (table). The decision is made by name
over the training and the inference graph together, so both hold the same
state tensor. The state Value changes dtype (so the state layout, the
checkpoint and prog.stats() shrink) and int8 adds a per-row fp32 scale
constant "<name>:scale" (q4: its per-block (d, m), and the weight's Value
takes the packed shape [N, K / 2]; rows not a multiple of 32 stay fp32; an embedding table,
and a head tied to it, is stored in int8 instead). Other frozen tensors (norm weights, position
tables) and every trained tensor and optimizer state stay fp32.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops import REGISTRY
from ..schemes.quant import Q4_BLOCK, quantize


def _uses(g: Graph) -> dict[str, set]:
    uses: dict[str, set] = {}
    for n in g.nodes:
        for i, v in enumerate(n.inputs):
            if v is not None and v.kind == "param":
                uses.setdefault(v.name, set()).add((n.op, i))
    return uses


def store_frozen_lowp(graphs: list[Graph], trained, ir_dtype: str, products_only: bool = False) -> list[str]:
    """Convert the eligible frozen parameters of every graph; returns their names. products_only:
    only those a product reads (linear, linear_bwd_input), not tables only looked up (compute_dtype)."""
    uses: dict[str, set] = {}
    for g in graphs:
        for name, u in _uses(g).items():
            uses.setdefault(name, set()).update(u)
    names = []
    for name, u in uses.items():
        shapes = {g.state[name].shape for g in graphs if name in g.state}
        if name in trained or not all(i in REGISTRY[op].lowp_inputs for op, i in u) or len(next(iter(shapes))) != 2:
            continue
        if products_only and not u & {("linear", 1), ("linear_bwd_input", 1)}:
            continue
        dtype = ir_dtype
        if ir_dtype == "q4" and ("embedding", 0) in u:
            dtype = "i8"  # an embedding table (and a head tied to it) in int8, as GGUF Q4_1 models keep it in Q8_0
        elif ir_dtype == "q4" and next(iter(shapes))[1] % Q4_BLOCK:
            continue  # rows not whole blocks of 32: stays fp32
        names.append(name)
        stored = scale = None
        for g in graphs:
            v = g.state.get(name)
            if v is None:
                continue
            if stored is None:
                stored, scale = quantize(v.data, dtype)
            v.dtype, v.data = dtype, stored
            v.shape = tuple(stored.shape)  # q4: the packed [N, K / 2]
            if scale is not None:
                g.add_state(f"{name}:scale", scale.shape, "f32", "const", data=scale)
    return names
