"""Fusion before autodiff: RMSNorm written out as ops (Llama/Qwen2/Mistral/Gemma's
`x.to(float32); x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` then `weight * ...`,
the fp32 upcast casts already dropped by the frontend) becomes one `rms_norm` node whose
gradient is one `rms_norm_bwd` (kernels/rms_norm.cpp): one pass over x instead of six,
and none of the intermediates saved for the backward. Likewise `silu(gate) * up` (SwiGLU MLPs)
becomes one `swiglu` node (kernels/swiglu.cpp) with `swiglu_bwd`, when gate and up are both
linear outputs (the MLP pattern). Both fused ops have Vulkan shaders as well
(shaders/rms_norm.comp, shaders/swiglu.comp)."""
from __future__ import annotations

from ..ir.graph import Graph, Node


def _other(n: Node, v):
    a, b = n.inputs
    return b if a is v else a if b is v else None


def _match(x_sq: Node, users, g: Graph):
    """x*x -> mean(last, keepdim) -> +eps -> rsqrt -> x*r -> w*h, each intermediate read once."""
    if x_sq.op != "mul" or x_sq.phase != "forward":
        return None
    x = x_sq.inputs[0]
    if x_sq.inputs[1] is not x or x is None or x.dtype != "f32" or not x.shape:
        return None
    chain, v = [x_sq], x_sq.outputs[0]
    for op in ("mean", "add_scalar", "rsqrt", "mul", "mul"):
        us = users.get(id(v), [])
        if len(us) != 1 or us[0].op != op or us[0].phase != "forward" or v in g.outputs:
            return None
        n = us[0]
        if op == "mean" and (tuple(n.attrs["dims"]) != (len(x.shape) - 1,) or not n.attrs.get("keepdim")):
            return None
        if op == "mul" and len(chain) == 4 and _other(n, v) is not x:
            return None
        if op == "mul" and len(chain) == 5:
            w = _other(n, v)
            if w is None or w.shape != x.shape[-1:] or w.dtype != "f32" or n.outputs[0].shape != x.shape:
                return None
        chain.append(n)
        v = n.outputs[0]
    return chain


def fuse_rms_norm(g: Graph) -> Graph:
    users = g.users()
    drop, place = set(), {}
    for n in g.nodes:
        if id(n) in drop:
            continue
        chain = _match(n, users, g)
        if chain is None:
            continue
        x, eps, last = n.inputs[0], float(chain[2].attrs["c"]), chain[-1]
        w = _other(last, chain[4].outputs[0])
        y = last.outputs[0]
        rstd = g.new_value("rms_rstd", (y.numel // x.shape[-1],), "f32")
        fused = Node("rms_norm", [x, w], [y, rstd], {"eps": eps}, last.source, "forward")
        y.producer = rstd.producer = fused
        drop.update(id(c) for c in chain)
        place[id(last)] = fused
    if place:
        g.nodes = [place.get(id(n), n) for n in g.nodes if id(n) not in drop or id(n) in place]
    return g


def fuse_swiglu(g: Graph) -> Graph:
    users = g.users()
    drop, place = set(), {}
    for n in g.nodes:
        if n.op != "silu" or n.phase != "forward" or n.outputs[0] in g.outputs:
            continue
        us = users.get(id(n.outputs[0]), [])
        if len(us) != 1 or us[0].op != "mul" or us[0].phase != "forward":
            continue
        mul = us[0]
        gate, up = n.inputs[0], _other(mul, n.outputs[0])
        if up is None or up is n.outputs[0] or up.shape != gate.shape or up.dtype != "f32" \
                or mul.outputs[0].shape != gate.shape:
            continue
        if any(v.producer is None or v.producer.op != "linear" for v in (gate, up)):  # the MLP pattern only
            continue
            continue
        y = mul.outputs[0]
        fused = Node("swiglu", [gate, up], [y], {}, mul.source, "forward")
        y.producer = fused
        drop.add(id(n))
        place[id(mul)] = fused
    if place:
        g.nodes = [place.get(id(n), n) for n in g.nodes if id(n) not in drop]
    return g


__all__ = ["fuse_rms_norm", "fuse_swiglu"]
