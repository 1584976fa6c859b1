"""Attention: scaled dot-product attention (sdpa) and rotary position embeddings (rope), with their
backward ops."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ir.graph import Value
from .cpp import b, bcast_strides, fl
from .record import OpRecord, bwd, register


# Layouts (attrs["layout"] = (q, k, v, out), absent = all 0; passes/attention.py sets them): 0 stores
# an operand as [..., H, T, D], 1 as [..., T, H, D] (a projection split into heads, no permute copy);
# its gradient has the same layout.  k/v may have fewer heads than q (grouped-query attention: q head
# h reads kv head h / (H / Hk)).  Shapes below are "logical" ([..., H, T, D]) unless said otherwise.
def logical(shape, tmajor) -> tuple:
    """The [..., H, T, D] shape of an operand stored as `shape` (tmajor: [..., T, H, D])."""
    shape = tuple(shape)
    return shape[:-3] + (shape[-2], shape[-3], shape[-1]) if tmajor else shape


def _layout(a) -> tuple:
    return tuple(a.get("layout", (0, 0, 0, 0)))


# Packed (attrs["packed"] = ((offset, heads, D) for q, k, v), set by passes/attention.py): q, k and v
# are one tensor X [..., T, C] (GPT-2's fused c_attn) and operand i is X[..., off:off + heads * D]
# viewed [..., T, heads, D] (layout 1); the backward writes dX (the three column ranges cover C).
def _stored(x, a, i) -> tuple:
    """The shape operand i is stored as."""
    p = a.get("packed")
    return tuple(x.shape[:-1]) + tuple(p[i][1:]) if p else tuple(x.shape)


def _shapes(q, k, v, a):
    lay = _layout(a)
    return tuple(logical(_stored(x, a, i), lay[i]) for i, x in enumerate((q, k, v)))


def _sdpa(i, a):
    q, k, v = _shapes(i[0], i[1], i[2], a)
    out = logical(q[:-1] + (v[-1],), _layout(a)[3])  # [..., H, L, Ev] stored as the out layout says
    return [(out, "f32"), (q[:-1], "f32")]  # out, and each row's log-sum-exp [..., H, L]


def _sdpa_flops(i, o, a):
    q, k, v = _shapes(i[0], i[1], i[2], a)
    b = math.prod(q[:-2])
    return 2 * b * q[-2] * k[-2] * (q[-1] + v[-1]) + 5 * b * q[-2] * k[-2]


def _sdpa_grad(b, n, g, need):
    q, k, v, mask = n.inputs
    out, lse = n.outputs
    dmask = None
    if need[3]:  # a learned additive bias (Swin's relative positions): dS = P * (dP - rowsum(dP * P))
        if _layout(n.attrs) != (0, 0, 0, 0) or k.shape[:-2] != q.shape[:-2]:
            b.unsupported("a learned attention mask with strided or grouped-query operands")
        probs = b.add("sdpa_probs_bwd", [q, k, mask, lse], n.attrs)  # recomputed from the saved lse
        dp = b.add("matmul", [g[0], v], {"ta": False, "tb": True})
        ds = b.add("softmax_bwd", [dp, probs], {"dim": len(probs.shape) - 1})
        dmask = b.sum_to(ds, mask.shape)
    ins = [g[0], q, k, v, out, lse, mask]
    if n.attrs.get("packed"):  # one gradient, dX, for q, k and v (the same X)
        dx = b.add("sdpa_bwd", ins, n.attrs, wanted=[True, False, False, True])[0]
        return [dx, None, None, dmask]
    dq, dk, dv, _ = b.add("sdpa_bwd", ins, n.attrs, wanted=[bool(need[0]), bool(need[1]), bool(need[2]), True])
    return [dq, dk, dv, dmask]


def _sdpa_torch(q, k, v, mask, a):
    if mask is not None and mask.dtype == torch.uint8:
        mask = mask.bool()
    lay, packed = _layout(a), a.get("packed")
    if packed:
        q, k, v = (x[..., o:o + h * d].reshape(x.shape[:-1] + (h, d)) for x, (o, h, d) in zip((q, k, v), packed))
    q, k, v = (x.transpose(-3, -2) if t else x for x, t in zip((q, k, v), lay))
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:  # grouped-query heads (repeated: exporters know this form)
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=a["causal"], scale=a["scale"])
    return y.transpose(-3, -2) if lay[3] else y


def _strides(shape, tmajor, row=None) -> str:
    """{sb, sh, sr} of an operand (pock_kernels.h SdpaLayout) of logical shape [..., H, T, D]
    (row: its row stride when it is a column range of a wider [..., T, row] tensor)."""
    H, T, D = ((1,) * 3 + tuple(shape))[-3:]
    if tmajor:
        row = row or H * D
        return f"{{{T * row}, {D}, {row}}}"
    return f"{{{H * T * D}, {T * D}, {D}}}"


def sdpa_params(q: Value, k: Value, v: Value, mask: Value | None, a) -> str:
    lay = _layout(a)
    qs, ks, vs = _shapes(q, k, v, a)
    B = math.prod(qs[:-2])
    L, E = qs[-2:]
    S, Ev = ks[-2], vs[-1]
    H = qs[-3] if len(qs) >= 3 else 1
    group = H // (ks[-3] if len(ks) >= 3 else 1)
    kind, sb, sl, ss = 0, 0, 0, 0
    if mask is not None:
        kind = 1 if mask.dtype == "u8" else 2
        full = qs[:-2] + (L, S)
        st = bcast_strides(mask.shape, full)
        sl, ss = st[-2], st[-1]
        padded = (1,) * (len(full) - len(mask.shape)) + mask.shape
        # the frontend made the mask's batch dims all 1 or all equal to q's: one stride walks them
        sb = 0 if math.prod(padded[:-2]) == 1 else padded[-2] * padded[-1]
    os_ = qs[:-1] + (Ev,)
    row = q.shape[-1] if a.get("packed") else None
    return (f"{{{B}, {L}, {S}, {E}, {Ev}, {fl(a['scale'])}, {b(a['causal'])}, {kind}, {sb}, {sl}, {ss}, {H}, "
            f"{group}, {_strides(qs, lay[0], row)}, {_strides(ks, lay[1], row)}, {_strides(vs, lay[2], row)}, "
            f"{_strides(os_, lay[3])}}}")


def _operands(a, q, k, v):
    """The C++ pointers of q, k, v (packed: column offsets into the one tensor)."""
    p = a.get("packed")
    if not p or q == "nullptr":
        return q, k, v
    return tuple(f"{q} + {o}" if o else q for o, _, _ in p)


def _sdpa_cpu(e, n, q, k, v, mask, out, lse):
    q, k, v = _operands(n.attrs, q, k, v)
    return f"pk::sdpa_fwd({q}, {k}, {v}, {mask}, {out}, {lse}, {sdpa_params(*n.inputs, n.attrs)});"


def _sdpa_bwd_cpu(e, n, dout, q, k, v, out, lse, mask, dq, dk, dv, scratch):
    p = sdpa_params(*n.inputs[1:4], n.inputs[6], n.attrs)
    q, k, v = _operands(n.attrs, q, k, v)
    dq, dk, dv = _operands(n.attrs, dq, dk, dv)
    return f"pk::sdpa_bwd({dout}, {q}, {k}, {v}, {out}, {lse}, {mask}, {dq}, {dk}, {dv}, {scratch}, {p});"


def _sdpa_bwd_scratch(i, a) -> tuple:
    """Grouped-query attention: each query head's dk and dv ([S, E + Ev]) before its group's are
    summed; else the kernel needs none."""
    q, k, v = _shapes(i[1], i[2], i[3], a)
    if len(q) < 3 or len(k) < 3 or q[-3] == k[-3]:
        return (1,)
    return (math.prod(q[:-2]) * k[-2] * (k[-1] + v[-1]),)


def _sdpa_probs_cpu(e, n, q, k, mask, lse, probs):
    p = sdpa_params(n.inputs[0], n.inputs[1], n.inputs[1], n.inputs[2], n.attrs)
    q, k, _ = _operands(n.attrs, q, k, k)
    return f"pk::sdpa_probs({q}, {k}, {mask}, {lse}, {probs}, {p});"


def _sdpa_probs_infer(i, a):
    q, k, _ = _shapes(i[0], i[1], i[1], a)
    return [(q[:-1] + (k[-2],), "f32")]


register(
    OpRecord("sdpa", _sdpa, _sdpa_flops, grad=_sdpa_grad, torch=lambda i, a: _sdpa_torch(i[0], i[1], i[2], i[3], a),
             cpu=_sdpa_cpu),
    # flash-style: recomputes the probabilities block by block from q, k and the saved lse; scratch
    # only under grouped-query attention (O(tokens), never tokens x tokens)
    bwd("sdpa_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32"), (i[3].shape, "f32"),
                                  (_sdpa_bwd_scratch(i, a), "f32")],
        lambda i, o, a: 2 * _sdpa_flops(i[1:4], o, a) + _sdpa_flops(i[1:4], o, a) // 2, cpu=_sdpa_bwd_cpu),
    # the probabilities [..., H, L, S], for a learned mask's gradient only
    bwd("sdpa_probs_bwd", _sdpa_probs_infer, lambda i, o, a: _sdpa_flops([i[0], i[1], i[1]], o, a) // 2,
        cpu=_sdpa_probs_cpu),
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
    tm = f", {a['tmajor']}" if a.get("tmajor") else ""
    return f"{a['outer']}, {a['rep']}, {a['inner']}, {n.inputs[0].shape[-1]}, {a['cos_outer']}{tm}"


def _rope_torch(i, a):
    """x * cos + rotate_half(x) * sin; tmajor: x is [B, T, H, D] (cos/sin [B or 1, 1, T, D])."""
    x = i[0].transpose(-3, -2) if a.get("tmajor") else i[0]
    y = x * i[1] + _rotate_half(x) * i[2]
    return y.transpose(-3, -2) if a.get("tmajor") else y


register(
    OpRecord("rope", lambda i, a: [(i[0].shape, "f32")], lambda i, o, a: 3 * math.prod(i[0].shape),
             float_only=True, grad=_rope_grad,
             torch=_rope_torch,
             cpu=lambda e, n, x, cos, sin, y: f"pk::rope_fwd({x}, {cos}, {sin}, {y}, {_rope_args(n)});"),
    bwd("rope_bwd", lambda i, a: [(i[0].shape, "f32")], lambda i, o, a: 3 * math.prod(i[0].shape),
        cpu=lambda e, n, dy, cos, sin, dx: f"pk::rope_bwd({dy}, {cos}, {sin}, {dx}, {_rope_args(n)});"),
)
