"""Layout ops (they only move data): reshape (a view), permute, expand, slice (+ its backward),
cat and full."""
from __future__ import annotations

import math

import torch

from .cpp import CTYPE, _n, bcast_strides, fl, strided_copy, strides
from .record import OpRecord, bwd, register
from .torchref import TORCH_DTYPE as _TORCH_DTYPE


def _reshape_grad(b, n, g, need):
    if n.attrs.get("stop_gradient"):
        return [None]
    return [b.reshape(g[0], n.inputs[0].shape)]


def _reshape_cpu(e, n, x, y):
    return f"// view: {n.outputs[0].name} aliases {n.inputs[0].name}"


def _permute_grad(b, n, g, need):
    perm = n.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.add("permute", [g[0]], {"perm": inverse})]


def _permute_cpu(e, n, x, y):
    xs = strides(n.inputs[0].shape)
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, [xs[p] for p in n.attrs["perm"]], 0, strides(out), 0)


def _expand_cpu(e, n, x, y):
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, bcast_strides(n.inputs[0].shape, out), 0, strides(out), 0)


register(
    OpRecord("reshape", lambda i, a: [(tuple(a["shape"]), i[0].dtype)], view=True, layout=True, grad=_reshape_grad,
             torch=lambda i, a: i[0].reshape(tuple(a["shape"])), cpu=_reshape_cpu),
    OpRecord("permute", lambda i, a: [(tuple(i[0].shape[p] for p in a["perm"]), i[0].dtype)], layout=True,
             grad=_permute_grad, torch=lambda i, a: i[0].permute(*a["perm"]), cpu=_permute_cpu),
    OpRecord("expand", lambda i, a: [(tuple(a["shape"]), i[0].dtype)], layout=True,
             grad=lambda b, n, g, need: [b.sum_to(g[0], n.inputs[0].shape)],
             torch=lambda i, a: i[0].expand(*a["shape"]), cpu=_expand_cpu),
)


# ---- slice and cat ----------------------------------------------------------------------------
def _slice(i, a):
    shape = list(i[0].shape)
    shape[a["dim"]] = len(range(a["start"], a["end"], a["step"]))
    return [(tuple(shape), i[0].dtype)]


def _slice_torch(x, a):
    idx = [slice(None)] * x.dim()
    idx[a["dim"]] = slice(a["start"], a["end"], a["step"])
    return x[tuple(idx)]


def _slice_cpu(e, n, x, y):
    a, xs = n.attrs, strides(n.inputs[0].shape)
    ins = list(xs)
    ins[a["dim"]] *= a["step"]
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, ins, a["start"] * xs[a["dim"]], strides(out), 0)


def _slice_bwd_cpu(e, n, dy, dx):
    a = n.attrs
    xs = strides(a["x_shape"])
    outs = list(xs)
    outs[a["dim"]] *= a["step"]
    dy_shape = n.inputs[0].shape
    return [f"pk::fill<float>({dx}, {math.prod(a['x_shape'])}, 0.0f);",
            strided_copy("f32", dy, dx, dy_shape, strides(dy_shape), 0, outs, a["start"] * xs[a["dim"]])]


def _cat(i, a):
    shape = list(i[0].shape)
    shape[a["dim"]] = sum(v.shape[a["dim"]] for v in i)
    return [(tuple(shape), i[0].dtype)]


def _cat_grad(b, n, g, need):
    dim, start, grads = n.attrs["dim"], 0, []
    for x, nd in zip(n.inputs, need):
        size = x.shape[dim]
        grads.append(b.add("slice", [g[0]], {"dim": dim, "start": start, "end": start + size, "step": 1})
                     if nd else None)
        start += size
    return grads


def _cat_cpu(e, n, *ptrs):
    ins, y = ptrs[:-1], ptrs[-1]
    dim, ys = n.attrs["dim"], strides(n.outputs[0].shape)
    lines, at = [], 0
    for v, p in zip(n.inputs, ins):
        lines.append(strided_copy(v.dtype, p, y, v.shape, strides(v.shape), 0, ys, at * ys[dim]))
        at += v.shape[dim]
    return lines


def _full_cpu(e, n, y):
    v = n.outputs[0]
    value = fl(n.attrs["value"]) if v.dtype == "f32" else str(int(n.attrs["value"]))
    return f"pk::fill<{CTYPE[v.dtype]}>({y}, {_n(v)}, {CTYPE[v.dtype]}({value}));"


register(
    OpRecord("slice", _slice, layout=True,
             grad=lambda b, n, g, need: [b.add("slice_bwd", [g[0]], n.attrs | {"x_shape": n.inputs[0].shape})],
             torch=lambda i, a: _slice_torch(i[0], a), cpu=_slice_cpu),
    bwd("slice_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")], cpu=_slice_bwd_cpu),
    OpRecord("cat", _cat, layout=True, grad=_cat_grad, torch=lambda i, a: torch.cat(list(i), a["dim"]),
             cpu=_cat_cpu),
    OpRecord("full", lambda i, a: [(tuple(a["shape"]), a.get("dtype", "f32"))], layout=True,
             grad=lambda b, n, g, need: [],
             torch=lambda i, a: torch.full(tuple(a["shape"]), a["value"], dtype=_TORCH_DTYPE[a.get("dtype", "f32")]),
             cpu=_full_cpu),
)
