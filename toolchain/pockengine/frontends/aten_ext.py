"""Converters for the ops Hugging Face families use beyond the core set (aten.py): padding,
Conv1d, norms, comparisons and masks, dtype casts, repeats, min/max, trig, assertions.

Most are compositions of existing IR ops (so their gradients come from the rules table);
the integer/boolean ones produce `compare` and `cast` nodes (kernels/compare.cpp).
Shape-only bookkeeping never reaches here: passes/const_eval.py folds it first.
"""
from __future__ import annotations

import math

import torch

from ..errors import PockError
from ..ir.graph import Value
from .aten import (CONVERTERS, _binary, _cat, _conv2d, _expand, _full, _reshape, conv, slice_value, to_ir_dtype,
                   _dim)

aten = torch.ops.aten


# ---- no-ops: assertions and dtype checks ------------------------------------------------
@conv(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten._assert_async.msg,
      aten._assert_async.default, aten.sym_constrain_range_for_size.default)
def _drop(c, *args, **kw):
    return None


def cast(c, x: Value, dtype: str) -> Value:
    if x.dtype == dtype:
        return x
    return c.add("cast", [x], {"dtype": dtype})


@conv(aten._to_copy.default)
def _to_copy(c, x, dtype=None, **kw):
    if dtype is None:
        return x
    return cast(c, x, to_ir_dtype(dtype, f"the cast in {c.source}"))


@conv(aten.type_as.default)
def _type_as(c, x, other):
    return cast(c, x, other.dtype)


# ---- comparisons and boolean logic --------------------------------------------------------
def _operand(c, v, like: Value):
    if isinstance(v, Value):
        return v
    return _full(c, (), v, "f32" if like.dtype == "f32" else like.dtype)


def _compare(c, op, a, b):
    if not isinstance(a, Value):
        a, b, op = b, a, {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(op, op)
    b = _operand(c, b, a)
    if a.dtype != b.dtype:  # int vs float: compare as float
        a, b = cast(c, a, "f32"), cast(c, b, "f32")
    return c.add("compare", [a, b], {"cmp": op})


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    conv(getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)(
        (lambda name: lambda c, a, b: _compare(c, name, a, b))(_name))


@conv(aten.bitwise_and.Tensor, aten.logical_and.default)
def _and(c, a, b):
    return c.add("compare", [cast(c, a, "u8"), cast(c, b, "u8")], {"cmp": "and"})


@conv(aten.bitwise_or.Tensor, aten.logical_or.default)
def _or(c, a, b):
    return c.add("compare", [cast(c, a, "u8"), cast(c, b, "u8")], {"cmp": "or"})


@conv(aten.minimum.default, aten.maximum.default)
def _minmax(c, a, b):
    lt = _compare(c, "lt" if c.target is aten.minimum.default else "gt", a, b)
    return c.add("where", [lt, a, b])


# ---- padding and convolution ------------------------------------------------------------------
@conv(aten.constant_pad_nd.default)
def _constant_pad(c, x, pad, value=0.0):
    nd = len(x.shape)
    for i in range(len(pad) // 2):
        d = nd - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            x = slice_value(c, x, d, max(0, -lo), x.shape[d] - max(0, -hi))
            lo, hi = max(lo, 0), max(hi, 0)
        parts = []
        for n in (lo, None, hi):
            if n is None:
                parts.append(x)
            elif n > 0:
                shape = list(x.shape)
                shape[d] = n
                parts.append(_full(c, shape, value, x.dtype))
        x = _cat(c, parts, d) if len(parts) > 1 else x
    return x


@conv(aten.conv1d.default)
def _conv1d(c, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    one = lambda v: v[0] if isinstance(v, (list, tuple)) else v  # noqa: E731
    if isinstance(padding, str):
        padding = 0 if padding == "valid" else (one(dilation) * (w.shape[2] - 1)) // 2
    x4 = _reshape(c, x, x.shape[:2] + (1, x.shape[2]))
    w4 = _reshape(c, w, w.shape[:2] + (1, w.shape[2]))
    y = _conv2d(c, x4, w4, b, (1, one(stride)), (0, one(padding)), (1, one(dilation)), groups)
    return _reshape(c, y, y.shape[:2] + (y.shape[3],))


_core_convolution = CONVERTERS[aten.convolution.default]


@conv(aten.convolution.default)
def _convolution(c, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if not transposed and len(w.shape) == 3:
        return _conv1d(c, x, w, b, stride, padding, dilation, groups)
    return _core_convolution(c, x, w, b, stride, padding, dilation, transposed, output_padding, groups)


# ---- norms ---------------------------------------------------------------------------------------
@conv(aten.linalg_vector_norm.default)
def _vector_norm(c, x, ord=2, dim=None, keepdim=False, dtype=None):
    if ord != 2:
        raise PockError(f"linalg_vector_norm supports ord=2 only ({c.source}), got {ord}")
    dims = tuple(range(len(x.shape))) if dim is None else tuple(_dim(d, len(x.shape)) for d in
                                                              ([dim] if isinstance(dim, int) else dim))
    s = c.add("sum", [c.add("mul", [x, x])], {"dims": tuple(sorted(dims)), "keepdim": bool(keepdim)})
    return c.add("sqrt", [s])


# ---- layout: repeat ------------------------------------------------------------------------------
@conv(aten.repeat.default)
def _repeat(c, x, reps):
    reps = tuple(reps)
    shape = (1,) * (len(reps) - len(x.shape)) + x.shape
    inter = []
    for r, s in zip(reps, shape):
        inter += [1, s]
    y = _reshape(c, x, tuple(inter))
    big = []
    for r, s in zip(reps, shape):
        big += [r, s]
    y = _expand(c, y, tuple(big))
    return _reshape(c, y, tuple(r * s for r, s in zip(reps, shape)))


# ---- pointwise ------------------------------------------------------------------------------------
@conv(aten.cos.default, aten.sin.default)
def _trig(c, x):
    return c.add("cos" if c.target is aten.cos.default else "sin", [x])


__all__ = ["cast"]
