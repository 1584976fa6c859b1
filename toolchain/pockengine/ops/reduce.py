"""Reductions and softmax: sum, mean, sum_to, softmax and log_softmax with their backward ops."""
from __future__ import annotations

import math

import torch

from .cpp import _odi, arr, b, fl
from .record import OpRecord, bwd, register
from .shape import numel, same as _same


def _reduce(i, a):
    x = i[0].shape
    dims = set(a["dims"])
    if a.get("keepdim"):
        return [(tuple(1 if d in dims else s for d, s in enumerate(x)), "f32")]
    return [(tuple(s for d, s in enumerate(x) if d not in dims), "f32")]


def _sum_grad(b, n, g, need):
    x = n.inputs[0]
    dims = n.attrs["dims"]
    kept = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    gy = b.reshape(g[0], kept)
    if n.op == "mean":
        gy = b.add("mul_scalar", [gy], {"c": 1.0 / math.prod(x.shape[d] for d in dims)})
    return [b.expand(gy, x.shape)]


def _kept_shape(n):
    x, shape = n.inputs[0].shape, n.attrs["shape"]
    return (1,) * (len(x) - len(shape)) + tuple(shape)


def _reduce_call(x_shape, reduce_flags, scale, x, y):
    dims = [(s, r) for s, r in zip(x_shape, reduce_flags) if s != 1] or [(1, False)]
    merged = [dims[0]]
    for s, r in dims[1:]:
        if merged[-1][1] == r:
            merged[-1] = (merged[-1][0] * s, r)
        else:
            merged.append((s, r))
    shape = [m[0] for m in merged] + [1] * (6 - len(merged))
    flags = [b(m[1]) for m in merged] + ["false"] * (6 - len(merged))
    return f"pk::reduce_sum({x}, {y}, {{{len(merged)}, {arr(shape)}, {{{', '.join(flags)}}}, {fl(scale)}}});"


def _sum_cpu(e, n, x, y):
    shape, dims = n.inputs[0].shape, n.attrs["dims"]
    count = math.prod(shape[d] for d in dims)
    scale = 1.0 / count if n.op == "mean" and count else 1.0
    return _reduce_call(shape, [d in dims for d in range(len(shape))], scale, x, y)


def _sum_to_cpu(e, n, x, y):
    xs, target = n.inputs[0].shape, n.attrs["shape"]
    padded = (1,) * (len(xs) - len(target)) + tuple(target)
    return _reduce_call(xs, [padded[d] == 1 and xs[d] != 1 for d in range(len(xs))], 1.0, x, y)


register(
    OpRecord("sum", _reduce, lambda i, o, a: numel(i[0]), grad=_sum_grad,
             torch=lambda i, a: torch.sum(i[0], dim=tuple(a["dims"]), keepdim=bool(a.get("keepdim"))), cpu=_sum_cpu),
    OpRecord("mean", _reduce, lambda i, o, a: numel(i[0]), grad=_sum_grad,
             torch=lambda i, a: torch.mean(i[0], dim=tuple(a["dims"]), keepdim=bool(a.get("keepdim"))),
             cpu=_sum_cpu),
    OpRecord("sum_to", lambda i, a: [(tuple(a["shape"]), "f32")], lambda i, o, a: numel(i[0]),
             grad=lambda b, n, g, need: [b.expand(b.reshape(g[0], _kept_shape(n)), n.inputs[0].shape)],
             cpu=_sum_to_cpu),
)


# ---- softmax ---------------------------------------------------------------------------------
def _uses_output(bwd_op):
    return lambda b, n, g, need: [b.add(bwd_op, [g[0], n.outputs[0]], n.attrs)]


register(
    OpRecord("softmax", _same, lambda i, o, a: 5 * numel(i[0]), float_only=True, grad=_uses_output("softmax_bwd"),
             torch=lambda i, a: torch.softmax(i[0], a["dim"]),
             cpu=lambda e, n, x, y: f"pk::softmax_fwd({x}, {y}, {_odi(n.inputs[0], n.attrs['dim'])});"),
    OpRecord("log_softmax", _same, lambda i, o, a: 5 * numel(i[0]), float_only=True,
             grad=_uses_output("log_softmax_bwd"), torch=lambda i, a: torch.log_softmax(i[0], a["dim"]),
             cpu=lambda e, n, x, y: f"pk::log_softmax_fwd({x}, {y}, {_odi(n.inputs[0], n.attrs['dim'])});"),
    bwd("softmax_bwd", _same, lambda i, o, a: 4 * numel(i[0]),
        cpu=lambda e, n, dy, y, dx: f"pk::softmax_bwd({dy}, {y}, {dx}, {_odi(n.inputs[0], n.attrs['dim'])});"),
    bwd("log_softmax_bwd", _same, lambda i, o, a: 4 * numel(i[0]),
        cpu=lambda e, n, dy, y, dx: f"pk::log_softmax_bwd({dy}, {y}, {dx}, {_odi(n.inputs[0], n.attrs['dim'])});"),
)
