"""Attention without layout copies, before autodiff (so the backward inherits it).

A Hugging Face attention block (Llama/Qwen2/Mistral/Gemma/Phi-3, GPT-2, BERT, our tiny GPT) splits
each projection into heads with `view(B, T, H, D).transpose(1, 2)`, repeats the k/v heads for
grouped-query attention (`repeat_kv`: reshape, expand, reshape), and merges the heads back with
`transpose(1, 2).reshape(B, T, H * D)` before o_proj.  Each permute and expand is a copy in the
forward and again (permute, sum_to) in the backward.  Here:

  - `absorb_gqa`: an sdpa k or v that is a head repeat of a [..., Hk, S, D] tensor (repeat_kv, or
    the frontend's enable_gqa / multi-query broadcast) reads that tensor itself: the sdpa kernel
    maps query head h to kv head h / (H / Hk), and its backward sums the group's gradients;
  - `absorb_head_permutes`: a permute swapping the head and position dims ([..., T, H, D] ->
    [..., H, T, D]) whose every reader is an sdpa operand or a rope whose readers are sdpa
    operands disappears: those ops read the [..., T, H, D] tensor in place (sdpa's attrs["layout"],
    rope's attrs["tmajor"], ops/attention.py); an sdpa output read only by the inverse permute is
    written as [..., L, H, Ev] directly;
  - `absorb_qkv_split`: q, k and v split from one fused projection (GPT-2's c_attn) are read from
    it in place, and the backward writes its gradient whole.

An sdpa whose mask may need a gradient (a learned bias) is left as it is (its mask gradient is
computed in the [..., H, L, S] layout with the full k/v heads)."""
from __future__ import annotations

import math

from ..ir.graph import Graph, Node, Value
from ..ops.attention import logical
from .dce import eliminate_dead_code


def _learned(v: Value | None, memo: dict) -> bool:
    """Whether v depends on a parameter (so it may need a gradient)."""
    if v is None:
        return False
    if id(v) in memo:
        return memo[id(v)]
    memo[id(v)] = False
    p = v.producer
    r = v.kind == "param" if p is None else any(_learned(u, memo) for u in p.inputs)
    memo[id(v)] = r
    return r


def _sdpas(g: Graph):
    memo: dict = {}
    return [n for n in g.nodes if n.op == "sdpa" and not _learned(n.inputs[3], memo)]


def _repeat_source(v: Value, q_shape) -> Value | None:
    """x when v ([..., H, S, D]) repeats the heads of x ([..., Hk, S, D]) for q of q_shape, each
    kv head g = H / Hk times in a row (repeat_kv; or an expand of one head), else None."""
    p = v.producer
    if p is None or len(v.shape) < 3 or v.shape[:-2] != tuple(q_shape[:-2]):
        return None
    lead, H = v.shape[:-3], v.shape[-3]
    if p.op == "expand":  # [..., 1, S, D] -> [..., H, S, D] (multi-query)
        x = p.inputs[0]
        return x if x.shape == lead + (1,) + v.shape[-2:] else None
    if p.op != "reshape" or p.inputs[0].producer is None or p.inputs[0].producer.op != "expand":
        return None
    e = p.inputs[0]
    r = e.producer.inputs[0]
    if r.producer is None or r.producer.op != "reshape" or len(e.shape) != len(v.shape) + 1:
        return None
    x = r.producer.inputs[0]
    Hk, g = e.shape[-4], e.shape[-3]
    if Hk * g != H or e.shape != lead + (Hk, g) + v.shape[-2:] or r.shape != lead + (Hk, 1) + v.shape[-2:] \
            or x.shape != lead + (Hk,) + v.shape[-2:]:
        return None
    return x


def absorb_gqa(g: Graph) -> Graph:
    for n in _sdpas(g):
        if n.attrs.get("layout"):
            continue
        q = n.inputs[0]
        if len(q.shape) < 3:
            continue
        srcs = [_repeat_source(n.inputs[i], q.shape) for i in (1, 2)]
        if srcs[0] is None or srcs[1] is None or srcs[0].shape[-3] != srcs[1].shape[-3]:
            continue
        n.inputs[1], n.inputs[2] = srcs
    return g  # the repeats left without readers go with dead-code elimination


def _swaps_heads(n: Node) -> bool:
    """A permute exchanging dims -3 and -2 (heads and positions), the rest in place."""
    if n.op != "permute" or len(n.inputs[0].shape) < 3:
        return False
    k = len(n.attrs["perm"])
    return tuple(n.attrs["perm"]) == tuple(range(k - 3)) + (k - 2, k - 3, k - 1)


def _rope_tmajor(n: Node):
    """rope attrs for its x stored [..., T, H, D] (x's shape now [..., H, T, D]), or None."""
    x, cos = n.inputs[0], n.inputs[1]
    if n.attrs.get("tmajor") or len(x.shape) < 3 or cos.shape != n.inputs[2].shape or len(cos.shape) > len(x.shape):
        return None
    c = (1,) * (len(x.shape) - len(cos.shape)) + tuple(cos.shape)
    lead, (H, T, D) = x.shape[:-3], x.shape[-3:]
    if c[-3:] != (1, T, D):
        return None
    if all(s == 1 for s in c[:-3]):
        cos_outer = 0
    elif tuple(c[:-3]) == tuple(lead):
        cos_outer = 1
    else:
        return None
    return {**n.attrs, "outer": math.prod(lead), "rep": H, "inner": T * D, "cos_outer": cos_outer, "tmajor": 1}


def _operand_slots(n: Node, v: Value, done) -> list[int] | None:
    """The sdpa operand indices (0..2) at which n reads v, if n can take it as [..., T, H, D]."""
    if n.op != "sdpa" or id(n) not in done:
        return None
    lay = n.attrs.get("layout", (0, 0, 0, 0))
    slots = [i for i in range(3) if n.inputs[i] is v]
    if not slots or n.inputs[3] is v or any(lay[i] for i in slots):
        return None
    return slots


def absorb_head_permutes(g: Graph) -> Graph:
    eligible = {id(n) for n in _sdpas(g)}
    outputs = {id(v) for v in g.outputs} | ({id(g.loss)} if g.loss is not None else set())
    users = g.users()
    drop = set()

    def set_layout(n: Node, slot: int):
        lay = list(n.attrs.get("layout", (0, 0, 0, 0)))
        lay[slot] = 1
        n.attrs = {**n.attrs, "layout": tuple(lay)}

    # inputs: permute -> (rope ->) sdpa
    for p in g.nodes:
        if not _swaps_heads(p) or p.phase != "forward" or id(p.outputs[0]) in outputs:
            continue
        y, x = p.outputs[0], p.inputs[0]
        plan, ok = [], True
        for u in users.get(id(y), []):
            if u.op == "rope" and u.inputs[0] is y and y not in u.inputs[1:]:
                attrs, z = _rope_tmajor(u), u.outputs[0]
                zs = users.get(id(z), [])
                slots = [_operand_slots(w, z, eligible) for w in zs]
                if attrs is None or not zs or id(z) in outputs or any(s is None for s in slots):
                    ok = False
                    break
                plan.append(("rope", u, attrs, list(zip(zs, slots))))
            else:
                slots = _operand_slots(u, y, eligible)
                if slots is None:
                    ok = False
                    break
                plan.append(("sdpa", u, slots, None))
        if not ok or not plan:
            continue
        for kind, u, a, readers in plan:
            if kind == "rope":
                u.inputs[0], u.attrs = x, a
                u.outputs[0].shape = x.shape
                for w, slots in readers:
                    for s in slots:
                        set_layout(w, s)
            else:
                for s in a:
                    u.inputs[s] = x
                    set_layout(u, s)
        drop.add(id(p))
    # outputs: sdpa -> permute
    for n in g.nodes:
        if id(n) not in eligible or n.attrs.get("layout", (0, 0, 0, 0))[3]:
            continue
        o = n.outputs[0]
        us = users.get(id(o), [])
        if len(us) != 1 or not _swaps_heads(us[0]) or id(o) in outputs or id(us[0]) in drop:
            continue
        p = us[0]
        n.outputs[0] = p.outputs[0]
        p.outputs[0].producer = n
        set_layout(n, 3)
        drop.add(id(p))
    if drop:
        g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g


def _column_range(r: Value, users):
    """(X, start, heads, D) when r = reshape(X[..., start:end]) to [..., T, heads, D] (a head split
    of a column range of X), read by nothing else, else None."""
    p = r.producer
    if p is None or p.op != "reshape" or len(r.shape) < 3:
        return None
    s = p.inputs[0]
    sl = s.producer
    if sl is None or sl.op != "slice" or sl.attrs.get("step", 1) != 1 or len(users.get(id(s), [])) != 1:
        return None
    x = sl.inputs[0]
    if sl.attrs["dim"] not in (-1, len(x.shape) - 1) or x.shape[:-1] != r.shape[:-2] or x.dtype != "f32":
        return None
    start, end = sl.attrs["start"], sl.attrs["end"]
    if end - start != r.shape[-2] * r.shape[-1]:
        return None
    return x, start, r.shape[-2], r.shape[-1]


def absorb_qkv_split(g: Graph) -> Graph:
    """An sdpa whose q, k and v ([..., T, H, D], layout 1) are head splits of three column ranges
    covering one tensor X [..., T, C] (GPT-2's fused c_attn split, our tiny GPT's qkv.split) reads
    X in place (attrs["packed"]), and its backward writes dX whole: no slices, no slice_bwd/adds."""
    users = g.users()
    outputs = {id(v) for v in g.outputs}
    for n in _sdpas(g):
        lay = n.attrs.get("layout", (0, 0, 0, 0))
        if tuple(lay[:3]) != (1, 1, 1) or n.attrs.get("packed"):
            continue
        ranges = []
        for i in range(3):
            r = n.inputs[i]
            m = _column_range(r, users) if r is not None and id(r) not in outputs else None
            if m is None or [u for u in users.get(id(r), []) if u is not n]:
                break
            ranges.append(m)
        if len(ranges) != 3 or any(m[0] is not ranges[0][0] for m in ranges):
            continue
        x = ranges[0][0]
        spans = sorted((s, s + h * d) for _, s, h, d in ranges)
        if spans[0][0] != 0 or spans[-1][1] != x.shape[-1] or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            continue
        n.inputs[0] = n.inputs[1] = n.inputs[2] = x
        n.attrs = {**n.attrs, "packed": tuple((s, h, d) for _, s, h, d in ranges)}
    return g


def attention_layouts(g: Graph) -> Graph:
    """absorb_gqa, then (its repeats dropped, so they read nothing) absorb_head_permutes, then
    absorb_qkv_split."""
    g = absorb_head_permutes(eliminate_dead_code(absorb_gqa(g)))
    return eliminate_dead_code(absorb_qkv_split(g))


__all__ = ["absorb_gqa", "absorb_head_permutes", "absorb_qkv_split", "attention_layouts", "logical"]
