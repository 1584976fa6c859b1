"""Dense layers: linear (+ its backward ops), matmul, embedding."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cpp import ACT, LOWP, _act, _lowp, _n, _wshape, b, index_check
from .record import OpRecord, bwd, k_of as _k, register
from .shape import broadcast_shapes, ew as _ew, numel
from .torchref import act as _torch_act


# ---- linear ------------------------------------------------------------------------
def _linear(i, a):
    x, w = i[0], i[1]
    return [(x.shape[:-1] + (w.shape[0],), "f32")]


def _linear_grad(b, n, g, need):
    x, w, _ = n.inputs
    gy = g[0]
    dx = b.add("linear_bwd_input", [gy, w], {"x_shape": x.shape}) if need[0] else None
    dw = None
    if need[1]:
        k = _k(need[1], w.shape[1])
        xs = b.saved_slice(x, len(x.shape) - 1, k)
        dw = b.add("linear_bwd_weight", [gy, xs], {"k": k})
    db = b.add("bias_bwd", [gy]) if need[2] else None
    return [dx, dw, db]


def _linear_cpu(e, n, x, w, bias, y):
    N, K = _wshape(n.inputs[1])
    if n.inputs[1].dtype in LOWP:
        act = ACT[n.attrs["act"]] if n.attrs.get("act") else "pk::Act::None"
        if n.attrs.get("compute"):  # passes/compute_dtype.py: the product in bf16/fp16
            return (f"pk::linear_fwd_lowp_cd({x}, {_lowp(e, n.inputs[1])}, {bias}, {y}, {_n(n.inputs[0]) // K}, "
                    f"{N}, {K}, {act}, {LOWP[n.attrs['compute']]});")
        return (f"pk::linear_fwd_lowp({x}, {_lowp(e, n.inputs[1])}, {bias}, {y}, {_n(n.inputs[0]) // K}, {N}, "
                f"{K}, {act});")
    suffix, arg = _act(n)
    return f"pk::linear_fwd{suffix}({x}, {w}, {bias}, {y}, {_n(n.inputs[0]) // K}, {N}, {K}{arg});"


def _linear_bi_cpu(e, n, dy, w, dx):
    N, K = _wshape(n.inputs[1])
    if n.inputs[1].dtype in LOWP:
        if n.attrs.get("compute"):
            return (f"pk::linear_bwd_input_lowp_cd({dy}, {_lowp(e, n.inputs[1])}, {dx}, {_n(n.inputs[0]) // N}, "
                    f"{N}, {K}, {LOWP[n.attrs['compute']]});")
        return f"pk::linear_bwd_input_lowp({dy}, {_lowp(e, n.inputs[1])}, {dx}, {_n(n.inputs[0]) // N}, {N}, {K});"
    return f"pk::linear_bwd_input({dy}, {w}, {dx}, {_n(n.inputs[0]) // N}, {N}, {K});"


def linear_bw_args(n, dy, xs, dw) -> str:
    """The arguments of pk::linear_bwd_weight and its fused forms (dy, x, dw, M, N, k, ldx)."""
    N = n.inputs[0].shape[-1]
    return f"{dy}, {xs}, {dw}, {_n(n.inputs[0]) // N}, {N}, {n.attrs['k']}, {n.inputs[1].shape[-1]}"


def _linear_bw_cpu(e, n, dy, xs, dw):
    return f"pk::linear_bwd_weight({linear_bw_args(n, dy, xs, dw)});"


def _linear_bw_finite(e, n, dy, xs, dw):  # the check made as the GEMM stores dw
    return [], f"pk::linear_bwd_weight_finite({linear_bw_args(n, dy, xs, dw)})"


def _bias_bwd_cpu(e, n, dy, db):
    N = n.inputs[0].shape[-1]
    return f"pk::bias_bwd({dy}, {db}, {_n(n.inputs[0]) // N}, {N});"


register(
    # K from x [..., K]: a q4 weight's Value is the packed [N, K / 2] (passes/lowp.py)
    OpRecord("linear", _linear, lambda i, o, a: 2 * numel(o[0]) * i[0].shape[-1], float_only=True, act_epilogue=True,
             lowp_inputs=(1,),
             grad=_linear_grad, partial=frozenset({1}),
             torch=lambda i, a: _torch_act(F.linear(i[0], i[1], i[2]), a), cpu=_linear_cpu),
    bwd("linear_bwd_input", lambda i, a: [(tuple(a["x_shape"]), "f32")],
        lambda i, o, a: 2 * numel(o[0]) * i[1].shape[0], lowp_inputs=(1,), cpu=_linear_bi_cpu),
    bwd("linear_bwd_weight", lambda i, a: [((i[0].shape[-1], a["k"]), "f32")],
        lambda i, o, a: 2 * numel(o[0]) * (numel(i[0]) // i[0].shape[-1]), cpu=_linear_bw_cpu,
        cpu_finite=_linear_bw_finite),
    bwd("bias_bwd", lambda i, a: [((i[0].shape[-1],), "f32")], lambda i, o, a: numel(i[0]), cpu=_bias_bwd_cpu),
)


# ---- matmul --------------------------------------------------------------------------
def _matmul(i, a):
    A, B = i[0].shape, i[1].shape
    m, k = (A[-1], A[-2]) if a.get("ta") else (A[-2], A[-1])
    k2, n = (B[-1], B[-2]) if a.get("tb") else (B[-2], B[-1])
    if k != k2:
        raise ValueError(f"matmul inner dims differ: {A} @ {B}")
    return [(broadcast_shapes(A[:-2], B[:-2]) + (m, n), "f32")]


def _matmul_flops(i, o, a):
    A = i[0].shape
    return 2 * numel(o[0]) * (A[-2] if a.get("ta") else A[-1])


def _matmul_grad(b, n, g, need):
    A, B = n.inputs
    ta, tb = n.attrs.get("ta", False), n.attrs.get("tb", False)
    gy = g[0]
    da = db = None
    if need[0]:
        da = (b.add("matmul", [B, gy], {"ta": tb, "tb": True}) if ta
              else b.add("matmul", [gy, B], {"ta": False, "tb": not tb}))
        da = b.sum_to(da, A.shape)
    if need[1]:
        db = (b.add("matmul", [gy, A], {"ta": True, "tb": ta}) if tb
              else b.add("matmul", [A, gy], {"ta": not ta, "tb": False}))
        db = b.sum_to(db, B.shape)
    return [da, db]


def _matmul_torch(a, b, attrs):
    if attrs.get("ta"):
        a = a.transpose(-1, -2)
    if attrs.get("tb"):
        b = b.transpose(-1, -2)
    return torch.matmul(a, b)


def _matmul_cpu(e, n, a, bb, c):
    A, B, C = n.inputs[0].shape, n.inputs[1].shape, n.outputs[0].shape
    M, N = C[-2:]
    K = A[-2] if n.attrs.get("ta") else A[-1]
    batch = math.prod(C[:-2])
    sa = M * K if math.prod(A[:-2]) > 1 else 0
    sb = K * N if math.prod(B[:-2]) > 1 else 0
    return (f"pk::gemm({a}, {bb}, {c}, {{{batch}, {M}, {N}, {K}, {b(n.attrs.get('ta', False))}, "
            f"{b(n.attrs.get('tb', False))}, {sa}, {sb}, {M * N}, 0.0f}});")


register(OpRecord("matmul", _matmul, _matmul_flops, float_only=True, grad=_matmul_grad,
                  torch=lambda i, a: _matmul_torch(i[0], i[1], a), cpu=_matmul_cpu))


# ---- embedding -------------------------------------------------------------------------
def _embedding_grad(b, n, g, need):
    w, idx = n.inputs
    k = _k(need[0], w.shape[1])
    return [b.add("embedding_bwd", [g[0], idx], {"num_weights": w.shape[0], "k": k,
                                                  "padding_idx": n.attrs["padding_idx"]}), None]


def _embedding_cpu(e, n, w, idx, y):
    V, D = _wshape(n.inputs[0])
    if n.inputs[0].dtype in LOWP:
        return [index_check(n, idx, "embedding", V),
                f"pk::embedding_fwd_lowp({_lowp(e, n.inputs[0])}, {idx}, {y}, {_n(n.inputs[1])}, {V}, {D});"]
    return [index_check(n, idx, "embedding", V),
            f"pk::embedding_fwd({w}, {idx}, {y}, {_n(n.inputs[1])}, {V}, {D});"]


def _embedding_bwd_cpu(e, n, dy, idx, *rest):
    *base, dw = rest  # base: the optional third input, another gradient the rows are summed onto
    a = n.attrs
    D = n.inputs[0].shape[-1]
    tail = f"{_n(n.inputs[1])}, {a['num_weights']}, {D}, {a['k']}, {a['padding_idx']});"
    if base:
        return f"pk::embedding_bwd_onto({dy}, {idx}, {base[0]}, {dw}, {tail}"
    return f"pk::embedding_bwd({dy}, {idx}, {dw}, {tail}"


def _embedding_bwd_finite(e, n, dy, idx, *rest):
    # only the rows it summed into: every other row is zero, or base's (checked where made)
    a = n.attrs
    return ([_embedding_bwd_cpu(e, n, dy, idx, *rest)],
            f"pk::embedding_rows_finite({rest[-1]}, {idx}, {_n(n.inputs[1])}, {a['num_weights']}, {a['k']}, "
            f"{a['padding_idx']})")


register(
    OpRecord("embedding", lambda i, a: [(i[1].shape + (i[0].shape[1],), "f32")], _ew, grad=_embedding_grad,
             partial=frozenset({0}), lowp_inputs=(0,), torch=lambda i, a: F.embedding(i[1], i[0]),
             cpu=_embedding_cpu),
    # inputs (dy, idx[, base]): with base (autodiff.backward.sum_grads, e.g. a tied head's gradient)
    # the rows are summed onto it, in its buffer when it dies here
    bwd("embedding_bwd", lambda i, a: [((a["num_weights"], a["k"]), "f32")], lambda i, o, a: numel(i[0]),
        inplace=(2,), cpu=_embedding_bwd_cpu, cpu_finite=_embedding_bwd_finite),
)
