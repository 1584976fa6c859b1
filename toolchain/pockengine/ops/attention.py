"""Attention: scaled dot-product attention (sdpa) and rotary position embeddings (rope), with their
backward ops."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ir.graph import Value
from .cpp import b, bcast_strides, fl
from .record import OpRecord, bwd, register


def _sdpa(i, a):
    q, k, v = i[0].shape, i[1].shape, i[2].shape
    return [(q[:-1] + (v[-1],), "f32"), (q[:-1] + (k[-2],), "f32")]


def _sdpa_flops(i, o, a):
    q, k, v = i[0].shape, i[1].shape, i[2].shape
    b = math.prod(q[:-2])
    return 2 * b * q[-2] * k[-2] * (q[-1] + v[-1]) + 5 * b * q[-2] * k[-2]


def _sdpa_grad(b, n, g, need):
    q, k, v, mask = n.inputs
    if need[3]:
        b.unsupported("a gradient for an attention mask")
    dq, dk, dv, _ = b.add("sdpa_bwd", [g[0], q, k, v, n.outputs[1], mask], n.attrs,
                          wanted=[bool(need[0]), bool(need[1]), bool(need[2]), True])
    return [dq, dk, dv, None]


def _sdpa_torch(q, k, v, mask, a):
    if mask is not None and mask.dtype == torch.uint8:
        mask = mask.bool()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=a["causal"], scale=a["scale"])


def sdpa_params(q: Value, k: Value, v: Value, mask: Value | None, a) -> str:
    B = math.prod(q.shape[:-2])
    L, E = q.shape[-2:]
    S, Ev = k.shape[-2], v.shape[-1]
    kind, sb, sl, ss = 0, 0, 0, 0
    if mask is not None:
        kind = 1 if mask.dtype == "u8" else 2
        full = q.shape[:-2] + (L, S)
        st = bcast_strides(mask.shape, full)
        sl, ss = st[-2], st[-1]
        padded = (1,) * (len(full) - len(mask.shape)) + mask.shape
        # the frontend made the mask's batch dims all 1 or all equal to q's: one stride walks them
        sb = 0 if math.prod(padded[:-2]) == 1 else padded[-2] * padded[-1]
    return (f"{{{B}, {L}, {S}, {E}, {Ev}, {fl(a['scale'])}, {b(a['causal'])}, {kind}, {sb}, {sl}, {ss}}}")


def _sdpa_cpu(e, n, q, k, v, mask, out, probs):
    return f"pk::sdpa_fwd({q}, {k}, {v}, {mask}, {out}, {probs}, {sdpa_params(*n.inputs, n.attrs)});"


def _sdpa_bwd_cpu(e, n, dout, q, k, v, probs, mask, dq, dk, dv, scratch):
    p = sdpa_params(*n.inputs[1:4], n.inputs[5], n.attrs)
    return f"pk::sdpa_bwd({dout}, {q}, {k}, {v}, {probs}, {dq}, {dk}, {dv}, {scratch}, {p});"


register(
    OpRecord("sdpa", _sdpa, _sdpa_flops, grad=_sdpa_grad, torch=lambda i, a: _sdpa_torch(i[0], i[1], i[2], i[3], a),
             cpu=_sdpa_cpu),
    bwd("sdpa_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32"), (i[3].shape, "f32"),
                                  ((i[1].shape[-2] * i[2].shape[-2],), "f32")],
        lambda i, o, a: 2 * _sdpa_flops(i[1:4], o, a), cpu=_sdpa_bwd_cpu),
)


# ---- rope: rotary position embedding (passes/fuse_norm.py fuses apply_rotary_pos_emb) -----------
def _rope_grad(b, n, g, need):
    x, cos, sin = n.inputs
    if need[1] or need[2]:
        b.unsupported("a gradient for rotary cos/sin tables")
    dx = b.add("rope_bwd", [g[0], cos, sin], n.attrs)
    return [dx, None, None]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope_args(n) -> str:
    a = n.attrs
    return f"{a['outer']}, {a['rep']}, {a['inner']}, {n.inputs[0].shape[-1]}, {a['cos_outer']}"


register(
    OpRecord("rope", lambda i, a: [(i[0].shape, "f32")], lambda i, o, a: 3 * math.prod(i[0].shape),
             float_only=True, grad=_rope_grad,
             torch=lambda i, a: i[0] * i[1] + _rotate_half(i[0]) * i[2],
             cpu=lambda e, n, x, cos, sin, y: f"pk::rope_fwd({x}, {cos}, {sin}, {y}, {_rope_args(n)});"),
    bwd("rope_bwd", lambda i, a: [(i[0].shape, "f32")], lambda i, o, a: 3 * math.prod(i[0].shape),
        cpu=lambda e, n, dy, cos, sin, dx: f"pk::rope_bwd({dy}, {cos}, {sin}, {dx}, {_rope_args(n)});"),
)
