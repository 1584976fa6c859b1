"""Converters for the ops Hugging Face families use beyond the core set (aten.py): padding,
Conv1d, norms, comparisons and masks, dtype casts, repeats, min/max, trig, assertions.

Most are compositions of existing IR ops (so their gradients come from the rules table);
the integer/boolean ones produce `compare` and `cast` nodes (kernels/compare.cpp).
Shape-only bookkeeping never reaches here: passes/const_eval.py folds it first.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import PockError
from ..ir.graph import Value
from .aten import (CONVERTERS, _binary, _cat, _conv2d, _dim, _expand, _full, _reshape, const_value, conv,
                   slice_value, to_ir_dtype)

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





# ---- integer indexing ------------------------------------------------------------------------------
@conv(aten.cumsum.default)
def _cumsum(c, x, dim, dtype=None):
    """Running sum along dim (RoBERTa's position ids: cumsum of input_ids.ne(pad)); integer
    inputs accumulate in int64 like torch, floats in float32 (gradient: the reverse cumsum)."""
    y = c.add("cumsum", [x], {"dim": _dim(dim, len(x.shape)), "reverse": False})
    return y if dtype is None else cast(c, y, to_ir_dtype(dtype, f"the cumsum in {c.source}"))


def _const_index(c, x, indices):
    """x[i0, i1, ...] with compile-time index tensors (e.g. the padding-mask lookup
    `mask[batch_idx, kv_idx]` of transformers' mask functions): the flat row ids are computed
    here, range-checked, and the lookup becomes the embedding gather."""
    k = len(indices)
    idx = np.broadcast_arrays(*[np.asarray(getattr(i, "data", i), dtype=np.int64) for i in indices])
    flat = np.zeros(idx[0].shape, np.int64)
    for d, i in enumerate(idx):
        n = x.shape[d]
        if i.size and (i.min() < -n or i.max() >= n):
            raise PockError(f"index ids out of range [0, {n}) along dim {d} in {c.source}: "
                            f"min {i.min()}, max {i.max()}")
        flat = flat * n + np.where(i < 0, i + n, i)
    ids = const_value(c, "index", flat)
    rest = x.shape[k:]
    table = x if x.dtype == "f32" else cast(c, x, "f32")
    rows = _reshape(c, table, (math.prod(x.shape[:k]), math.prod(rest)))
    y = _reshape(c, c.add("embedding", [rows, ids], {"padding_idx": -1}), flat.shape + rest)
    return y if x.dtype == "f32" else cast(c, y, x.dtype)


@conv(aten.gather.default)
def _gather(c, x, dim, index, sparse_grad=False):
    """torch.gather with input-dependent ids (RoBERTa's token-type lookup by position ids):
    the table with `dim` first is read by the embedding gather (the ids range-checked against
    x.shape[dim], naming the input they come from), then each output keeps the column of its
    own coordinates (a compile-time index)."""
    nd = len(x.shape)
    d = _dim(dim, nd)
    if index.dtype != "i64" or len(index.shape) != nd or x.dtype not in ("f32", "u8", "i64", "i32") or \
            any(index.shape[j] > x.shape[j] for j in range(nd) if j != d):
        raise PockError(f"gather needs int64 ids with x's rank and sizes ({c.source}), got x {x.shape} {x.dtype}, "
                        f"ids {index.shape} {index.dtype}")
    if x.dtype in ("i64", "i32") and (x.data is None or np.abs(x.data).max(initial=0) >= 2 ** 24):
        raise PockError(f"gather from an integer tensor is supported for compile-time tables of small "
                        f"values only ({c.source})")
    others = [j for j in range(nd) if j != d]
    table = cast(c, x, "f32")
    if d != 0:
        table = c.add("permute", [table], {"perm": tuple([d] + others)})
    cols = math.prod(x.shape[j] for j in others)
    rows = c.add("embedding", [_reshape(c, table, (x.shape[d], cols)), _reshape(c, index, (index.numel,))],
                 {"padding_idx": -1})
    coords = np.indices(index.shape).reshape(nd, -1)
    col = np.zeros(index.numel, np.int64)
    for j in others:
        col = col * x.shape[j] + coords[j]
    y = _const_index(c, rows, [np.arange(index.numel), col])
    y = _reshape(c, y, index.shape)
    return y if x.dtype == "f32" else cast(c, y, x.dtype)


@conv(aten.index.Tensor)
def _index(c, x, indices):
    """x[idx] along dim 0 (e.g. Whisper's learned positions): the embedding gather, whose kernel
    range-checks every id. x[i0, i1, ...] with compile-time index tensors: _const_index.
    Leading or interleaved `:` dims (x[:, :, ids], Falcon's fused QKV, LeViT's attention-bias
    lookup): the indexed dims are moved first, gathered, and the result dims put where torch
    puts them. Other index patterns are rejected."""
    indices = list(indices)
    picked = [d for d, i in enumerate(indices) if i is not None]
    if picked and picked != list(range(len(picked))) and len(indices) <= len(x.shape):
        return _index_moved(c, x, indices, picked)
    if indices and all(isinstance(i, Value) and i.data is not None and i.dtype in ("i64", "i32") for i in indices) \
            and len(indices) <= len(x.shape) and x.dtype in ("f32", "u8"):
        return _const_index(c, x, indices)
    dynamic = [d for d, i in enumerate(indices) if isinstance(i, Value) and i.data is None]
    if len(indices) > 1 and len(dynamic) == 1 and x.dtype == "f32" and len(indices) <= len(x.shape) and \
            indices[dynamic[0]].dtype == "i64" and all(isinstance(i, Value) and i.dtype in ("i64", "i32")
                                                       for i in indices):
        return _index_mixed(c, x, indices, dynamic[0])
    if len(indices) != 1 or not isinstance(indices[0], Value) or indices[0].dtype != "i64" or x.dtype != "f32" \
            or len(x.shape) < 2:
        what = [None if i is None else f"{i.dtype}{list(i.shape)}{' const' if i.data is not None else ''}"
                for i in indices]
        raise PockError(f"index.Tensor is supported as x[int64 ids] along one dim of a float tensor, or with "
                        f"compile-time index tensors on a float/bool tensor, only ({c.source}); got x "
                        f"{x.dtype}{list(x.shape)} indexed by {what}")
    ids = indices[0]
    if ids.data is not None and ids.numel and not (0 <= ids.data.min() and ids.data.max() < x.shape[0]):
        raise PockError(f"index ids out of range [0, {x.shape[0]}) in {c.source}: "
                        f"min {ids.data.min()}, max {ids.data.max()}")
    rows = _reshape(c, x, (x.shape[0], math.prod(x.shape[1:])))
    y = c.add("embedding", [rows, indices[0]], {"padding_idx": -1})
    return _reshape(c, y, indices[0].shape + x.shape[1:])


def _index_mixed(c, x, indices, d):
    """x[i0, ..., ids, ...] with one input-dependent ids tensor among compile-time ones (CLIP's
    pooled token, hidden[arange(B), eos_pos]): the rows of dim d are gathered by ids (range-
    checked against x.shape[d]), then each keeps its own compile-time coordinates."""
    from ..ops.shape import broadcast_shapes
    k = len(indices)
    shape = broadcast_shapes(*[i.shape for i in indices])
    n = math.prod(shape)
    ids = indices[d]
    if ids.shape != shape:
        ids = _expand(c, _reshape(c, ids, (1,) * (len(shape) - len(ids.shape)) + ids.shape), shape)
    others = [e for e in range(k) if e != d]
    moved = c.add("permute", [x], {"perm": tuple([d] + others + list(range(k, len(x.shape))))})
    rest = x.shape[k:]
    rows = _reshape(c, moved, (x.shape[d], math.prod(moved.shape[1:])))
    y = c.add("embedding", [rows, _reshape(c, ids, (n,))], {"padding_idx": -1})
    y = _reshape(c, y, (n,) + tuple(x.shape[e] for e in others) + rest)
    consts = [np.broadcast_to(np.asarray(indices[e].data, np.int64), shape).reshape(-1) for e in others]
    y = _const_index(c, y, [np.arange(n)] + consts)
    return _reshape(c, y, shape + rest)


def _index_moved(c, x, indices, picked):
    nd = len(x.shape)
    rest = [d for d in range(nd) if d not in picked]
    if x.dtype != "f32" and not all(indices[d].data is not None for d in picked):
        raise PockError(f"index.Tensor with input-dependent ids needs a float tensor ({c.source})")
    moved = c.add("permute", [x], {"perm": tuple(picked + rest)})
    y = _index(c, moved, [indices[d] for d in picked])  # (ids dims..., rest dims...)
    k = len(y.shape) - len(rest)
    if picked != list(range(picked[0], picked[0] + len(picked))):
        return y  # non-adjacent indexed dims: torch puts the ids dims first too
    p = picked[0]  # adjacent: the ids dims replace the indexed dims in place
    perm = list(range(k, k + p)) + list(range(k)) + list(range(k + p, len(y.shape)))
    return c.add("permute", [y], {"perm": tuple(perm)})


__all__ = ["cast"]
