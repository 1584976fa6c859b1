"""Fusion before autodiff: RMSNorm written out as ops (Llama/Qwen2/Mistral/Gemma's
`x.to(float32); x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` then `weight * ...`,
the fp32 upcast casts already dropped by the frontend) becomes one `rms_norm` node whose
gradient is one `rms_norm_bwd` (kernels/rms_norm.cpp): one pass over x instead of six,
and none of the intermediates saved for the backward. Likewise `silu(gate) * up` (SwiGLU MLPs)
becomes one `swiglu` node (kernels/swiglu.cpp) with `swiglu_bwd`, when gate and up are both
linear outputs (the MLP pattern), and rotary embeddings (`x * cos + rotate_half(x) * sin` with
compile-time cos/sin tables) one `rope` node (kernels/rope.cpp) with `rope_bwd`. RMSNorm and
SwiGLU also have Vulkan shaders (shaders/rms_norm.comp, shaders/swiglu.comp)."""
from __future__ import annotations

import math

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


def _rewrite(g: Graph, fuse_at) -> Graph:
    """Each chain of nodes `fuse_at(n, users)` returns, as (chain, fused node), becomes the
    fused node at the chain's last node (which produced the result; the fused node takes its
    `origin`); the rest of it is dropped."""
    users = g.users()
    drop, place = set(), {}
    for n in g.nodes:
        if id(n) in drop:
            continue
        m = fuse_at(n, users)
        if m is None:
            continue
        chain, fused = m
        for v in fused.outputs:
            v.producer = fused
        drop.update(id(c) for c in chain)
        place[id(chain[-1])] = fused
    if place:
        g.nodes = [place.get(id(n), n) for n in g.nodes if id(n) not in drop or id(n) in place]
    return g


def fuse_rms_norm(g: Graph) -> Graph:
    def fuse_at(n, users):
        chain = _match(n, users, g)
        if chain is None:
            return None
        x, eps, last = n.inputs[0], float(chain[2].attrs["c"]), chain[-1]
        w = _other(last, chain[4].outputs[0])
        y = last.outputs[0]
        rstd = g.new_value("rms_rstd", (y.numel // x.shape[-1],), "f32")
        return chain, Node("rms_norm", [x, w], [y, rstd], {"eps": eps}, last.source, "forward", last.origin)

    return _rewrite(g, fuse_at)


def fuse_swiglu(g: Graph) -> Graph:
    def fuse_at(n, users):
        if n.op != "silu" or n.phase != "forward" or n.outputs[0] in g.outputs:
            return None
        us = users.get(id(n.outputs[0]), [])
        if len(us) != 1 or us[0].op != "mul" or us[0].phase != "forward":
            return None
        mul = us[0]
        gate, up = n.inputs[0], _other(mul, n.outputs[0])
        if up is None or up is n.outputs[0] or up.shape != gate.shape or up.dtype != "f32" \
                or mul.outputs[0].shape != gate.shape:
            return None
        if any(v.producer is None or v.producer.op != "linear" for v in (gate, up)):  # the MLP pattern only
            return None
        return [n, mul], Node("swiglu", [gate, up], [mul.outputs[0]], {}, mul.source, "forward", mul.origin)

    return _rewrite(g, fuse_at)


def rope_layout(x_shape, c_shape):
    """(outer, rep, inner, cos_outer) of the rope kernel (kernels/rope.cpp) for x of x_shape and cos/sin
    of c_shape broadcast to it: x = [outer, rep, inner] with cos covering `inner` exactly, constant
    over `rep` and either equal to x over `outer` (cos_outer 1) or constant over it (0); None if
    the broadcast has another form."""
    n = len(x_shape)
    if len(c_shape) > n:
        return None
    c = (1,) * (n - len(c_shape)) + tuple(c_shape)
    k = n
    while k > 0 and (c[k - 1] == x_shape[k - 1] or x_shape[k - 1] == 1):  # inner: where cos follows x
        k -= 1
    j = k
    while j > 0 and c[j - 1] == 1:  # rep: where cos is broadcast
        j -= 1
    lead = list(zip(x_shape[:j], c[:j]))
    if any(cv != xv for xv, cv in lead):
        return None
    prod = lambda dims: math.prod(dims) if dims else 1  # noqa: E731
    outer, rep, inner = prod(x_shape[:j]), prod(x_shape[j:k]), prod(x_shape[k:])
    if n - k < 1 or inner % x_shape[-1]:
        return None
    return outer, rep, inner, int(prod(c[:j]) > 1)


def _slice_of(v, x, start, end):
    p = v.producer
    return p is not None and p.op == "slice" and p.inputs[0] is x and p.attrs["dim"] in (-1, len(x.shape) - 1) \
        and p.attrs["start"] == start and p.attrs["end"] == end and p.attrs.get("step", 1) == 1


def _table(v) -> bool:
    """A cos/sin table computed at compile time (passes/const_eval.py) or a buffer: nothing trains it."""
    return v is not None and v.producer is None and v.kind in ("const", "buffer") and v.dtype == "f32"


def _match_rope(cat: Node, users, g: Graph):
    """cat(-x[..., h:], x[..., :h]) * sin + x * cos (either operand order), each intermediate read once."""
    if cat.op != "cat" or cat.phase != "forward" or len(cat.inputs) != 2:
        return None
    neg, lo = cat.inputs
    if neg is None or neg.producer is None or neg.producer.op != "neg" or lo is None or lo.producer is None:
        return None
    x = lo.producer.inputs[0] if lo.producer.op == "slice" else None
    if x is None or x.dtype != "f32" or not x.shape or cat.attrs["dim"] not in (-1, len(x.shape) - 1):
        return None
    D = x.shape[-1]
    h = D // 2
    if D % 2 or not _slice_of(lo, x, 0, h) or not _slice_of(neg.producer.inputs[0], x, h, D):
        return None
    chain = [lo.producer, neg.producer.inputs[0].producer, neg.producer, cat]
    for v in (lo, neg.producer.inputs[0], neg, cat.outputs[0]):
        if len(users.get(id(v), [])) != 1 or v in g.outputs:
            return None
    mul_s = users[id(cat.outputs[0])][0]
    if mul_s.op != "mul" or mul_s.phase != "forward":
        return None
    sin = _other(mul_s, cat.outputs[0])
    us = users.get(id(mul_s.outputs[0]), [])
    if not _table(sin) or len(us) != 1 or us[0].op != "add" or mul_s.outputs[0] in g.outputs:
        return None
    add = us[0]
    xc = _other(add, mul_s.outputs[0])
    mul_c = xc.producer if xc is not None else None
    if mul_c is None or mul_c.op != "mul" or mul_c.phase != "forward" or len(users.get(id(xc), [])) != 1 \
            or xc in g.outputs:
        return None
    cos = _other(mul_c, x)
    if not _table(cos) or cos.shape != sin.shape or add.outputs[0].shape != x.shape:
        return None
    layout = rope_layout(x.shape, cos.shape)
    if layout is None:
        return None
    return x, cos, sin, [*chain, mul_s, mul_c, add], layout


def fuse_rope(g: Graph) -> Graph:
    """Rotary position embeddings (`apply_rotary_pos_emb` with `rotate_half`) -> one `rope` node
    (kernels/rope.cpp) whose gradient is one `rope_bwd`: no slices, negation, cat or products saved."""
    def fuse_at(n, users):
        m = _match_rope(n, users, g)
        if m is None:
            return None
        x, cos, sin, chain, (outer, rep, inner, cos_outer) = m
        add = chain[-1]
        return chain, Node("rope", [x, cos, sin], [add.outputs[0]],
                           {"outer": outer, "rep": rep, "inner": inner, "cos_outer": cos_outer}, add.source, "forward",
                           add.origin)

    return _rewrite(g, fuse_at)


__all__ = ["fuse_rms_norm", "fuse_rope", "fuse_swiglu", "rope_layout"]
