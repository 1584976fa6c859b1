"""Converters for op classes more Hugging Face families use (the wav2vec2/Hubert/PoolFormer
group norm, BiT's weight standardization, bilinear/nearest upsampling in MobileViT and BEiT,
Funnel's slice_scatter, fused-QKV and relative-position lookups with leading `:` dims).

Each is a composition of existing IR ops, so its gradient comes from the rules of those ops:
norms as mean/sub/mul/rsqrt, resampling as products with compile-time interpolation matrices.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import PockError
from ..ir.graph import Value
from .aten import CONVERTERS, _cat, _conv2d, _dim, _dims, _full, _pair, _reshape, const_value, conv, slice_value

aten = torch.ops.aten


# ---- normalisation by composition ------------------------------------------------------------------
def _normalize(c, x: Value, dims, eps):
    """(x - mean) * rsqrt(var + eps) over `dims` (biased variance, like torch's norms);
    returns y, mean and rstd (keepdim)."""
    attrs = {"dims": tuple(dims), "keepdim": True}
    mu = c.add("mean", [x], attrs)
    d = c.add("sub", [x, mu])
    var = c.add("mean", [c.add("mul", [d, d])], attrs)
    rstd = c.add("rsqrt", [c.add("add_scalar", [var], {"c": float(eps)})])
    return c.add("mul", [d, rstd]), mu, rstd


def _affine(c, y: Value, w, b, channel_dim: int):
    shape = tuple(y.shape[channel_dim] if i == channel_dim else 1 for i in range(len(y.shape)))
    if w is not None:
        y = c.add("mul", [y, _reshape(c, w, shape)])
    if b is not None:
        y = c.add("add", [y, _reshape(c, b, shape)])
    return y


@conv(aten.native_group_norm.default)
def _native_group_norm(c, x, w, b, n, ch, hw, groups, eps):
    y, mu, rstd = _group_norm_core(c, x, groups, w, b, eps)
    return y, _reshape(c, mu, (x.shape[0], groups)), _reshape(c, rstd, (x.shape[0], groups))


@conv(aten.group_norm.default)
def _group_norm(c, x, groups, w=None, b=None, eps=1e-5, cudnn_enabled=True):
    return _group_norm_core(c, x, groups, w, b, eps)[0]


def _group_norm_core(c, x, groups, w, b, eps):
    if len(x.shape) < 2 or x.shape[1] % groups:
        raise PockError(f"group_norm needs channels ({x.shape[1] if len(x.shape) > 1 else '?'}) divisible by "
                        f"groups ({groups}) in {c.source}")
    xg = _reshape(c, x, (x.shape[0], groups, x.numel // (x.shape[0] * groups)))
    y, mu, rstd = _normalize(c, xg, (2,), eps)
    return _affine(c, _reshape(c, y, x.shape), w, b, 1), mu, rstd


@conv(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(c, x, w, b, training, momentum, eps):
    """Batch norm without running statistics (BiT's weight standardization normalizes a
    weight this way): the batch statistics always, over every dim but 1."""
    dims = tuple(d for d in range(len(x.shape)) if d != 1)
    y, mu, rstd = _normalize(c, x, dims, eps)
    return _affine(c, y, w, b, 1), _reshape(c, mu, (x.shape[1],)), _reshape(c, rstd, (x.shape[1],))


# ---- resampling ------------------------------------------------------------------------------------
def _interp_matrix(op, size_in: int, size_out: int, args, axis: int) -> np.ndarray:
    """The (size_out, size_in) matrix of a separable 2-D interpolation along one axis, read off
    torch's own op applied to unit impulses (so align_corners and scale_factors semantics are
    torch's): the other axis is 1 wide and every interpolation row sums to 1."""
    eye = torch.eye(size_in).reshape(size_in, 1, size_in, 1) if axis == 0 else \
        torch.eye(size_in).reshape(size_in, 1, 1, size_in)
    out = op(eye, *args(axis))
    m = out[:, 0, :, 0] if axis == 0 else out[:, 0, 0, :]
    return m.T.double().numpy()


def _resample(c, x: Value, op, out_hw, args):
    if len(x.shape) != 4:
        raise PockError(f"2-D upsampling needs an NCHW input in {c.source}, got {x.shape}")
    n, ch, h, w = x.shape
    ho, wo = out_hw
    ah = _interp_matrix(op, h, ho, args, 0)
    aw = _interp_matrix(op, w, wo, args, 1)
    y = x
    if wo != w or not np.array_equal(aw, np.eye(w)):
        y = c.add("matmul", [_reshape(c, y, (n * ch * h, w)), const_value(c, "resample_w", aw.T)])
        y = _reshape(c, y, (n, ch, h, wo))
    if ho != h or not np.array_equal(ah, np.eye(h)):
        t = c.add("permute", [y], {"perm": (0, 1, 3, 2)})
        t = c.add("matmul", [_reshape(c, t, (n * ch * wo, h)), const_value(c, "resample_h", ah.T)])
        y = c.add("permute", [_reshape(c, t, (n, ch, wo, ho))], {"perm": (0, 1, 3, 2)})
    return y


def _out_size(x, output_size, scale_factors):
    if output_size is not None:
        return tuple(int(s) for s in output_size)
    return tuple(int(math.floor(x.shape[2 + i] * float(s))) for i, s in enumerate(scale_factors))


@conv(aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec, aten._upsample_nearest_exact2d.vec,
      aten.upsample_bicubic2d.vec)
def _upsample_vec(c, x, output_size, *rest):
    """upsample_{bilinear,bicubic}2d.vec(x, size, align_corners, scales) and
    upsample_nearest2d.vec(x, size, scales)."""
    target = c.target
    align = rest[0] if len(rest) == 2 else None
    scales = rest[-1]
    out = _out_size(x, output_size, scales)

    def args(axis):
        sizes = None if scales is not None else ((out[0], 1) if axis == 0 else (1, out[1]))
        sc = None if scales is None else ((scales[0], 1.0) if axis == 0 else (1.0, scales[1]))
        return (sizes, align, sc) if align is not None else (sizes, sc)

    return _resample(c, x, target, out, args)


@conv(aten.upsample_bilinear2d.default, aten.upsample_bicubic2d.default, aten.upsample_nearest2d.default)
def _upsample_default(c, x, output_size, *rest):
    """upsample_{bilinear,bicubic}2d(x, size, align_corners, scales_h, scales_w) and
    upsample_nearest2d(x, size, scales_h, scales_w): the explicit-size overloads."""
    align = rest[0] if c.target is not aten.upsample_nearest2d.default else None
    sc = list(rest[1:] if align is not None else rest) + [None, None]
    sh, sw = sc[0], sc[1]
    out = tuple(int(s) for s in output_size)

    def args(axis):
        size = (out[0], 1) if axis == 0 else (1, out[1])
        scales = (sh, 1.0) if axis == 0 else (1.0, sw)
        return (size, align) + scales if align is not None else (size,) + scales

    return _resample(c, x, c.target, out, args)


# ---- scatter into a slice ------------------------------------------------------------------------------
@conv(aten.slice_scatter.default)
def _slice_scatter(c, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end, ...] replaced by src (Funnel's relative shift): for a unit step,
    the parts of x before and after the slice concatenated around src."""
    d = _dim(dim, len(x.shape))
    n = x.shape[d]
    start = 0 if start is None else (start + n if start < 0 else min(start, n))
    end = n if end is None else (end + n if end < 0 else min(end, n))
    if step != 1:
        raise PockError(f"slice_scatter with step {step} is not supported ({c.source})")
    parts = ([slice_value(c, x, d, 0, start)] if start > 0 else []) + [src] + \
        ([slice_value(c, x, d, end, n)] if end < n else [])
    return parts[0] if len(parts) == 1 else _cat(c, parts, d)



@conv(aten.index_select.default)
def _index_select(c, x, dim, index):
    """x.index_select(dim, ids) (XLNet's relative shift, Speech2Text's sinusoidal positions):
    x[:, ..., ids] through index.Tensor (range-checked gather, gradient into x)."""
    from .aten_ext import _index
    d = _dim(dim, len(x.shape))
    return _index(c, x, [None] * d + [index])



@conv(aten.select_scatter.default)
def _select_scatter(c, x, src, dim, index):
    """x with x.select(dim, index) replaced by src (a recurrent scan writing step t)."""
    d = _dim(dim, len(x.shape))
    i = index + x.shape[d] if index < 0 else index
    return _slice_scatter(c, x, _reshape(c, src, x.shape[:d] + (1,) + x.shape[d + 1:]), d, i, i + 1)


@conv(aten.copy.default)
def _copy(c, x, src, non_blocking=False):
    """The functional form of x.copy_(src): src cast to x's dtype and broadcast to its shape."""
    from .aten import _expand
    from .aten_ext import cast
    y = cast(c, src, x.dtype)
    if y.shape != x.shape:
        y = _expand(c, _reshape(c, y, (1,) * (len(x.shape) - len(y.shape)) + y.shape), x.shape)
    return y


@conv(aten.baddbmm.default)
def _baddbmm(c, x, b1, b2, beta=1, alpha=1):
    """beta * x + alpha * (b1 @ b2); beta = 0 ignores x as torch does."""
    from .aten import _addmm, _binary
    if beta == 0:
        y = c.add("matmul", [b1, b2])
        return y if alpha == 1 else _binary(c, "mul", y, alpha)
    return _addmm(c, x, b1, b2, beta, alpha)


# ---- max/min reductions --------------------------------------------------------------------------------
def _pool_rows(c, x, dims, negate=False):
    """x with `dims` moved last and flattened: one max_pool2d window per row of the rest
    (values, and the i32 position of each row's first maximum)."""
    if x.dtype != "f32":
        raise PockError(f"max/min reductions are supported on float tensors only ({c.source}), got {x.dtype}")
    nd = len(x.shape)
    dims = sorted({_dim(d, nd) for d in dims})
    keep = [d for d in range(nd) if d not in dims]
    k = math.prod(x.shape[d] for d in dims)
    rows = math.prod(x.shape[d] for d in keep)
    t = c.add("neg", [x]) if negate else x
    if keep + dims != list(range(nd)):
        t = c.add("permute", [t], {"perm": tuple(keep + dims)})
    t = _reshape(c, t, (1, rows, 1, k))
    y, idx = c.add("max_pool2d", [t], {"kernel": (1, k), "stride": (1, k), "padding": (0, 0),
                                       "dilation": (1, 1), "ceil_mode": False})
    return (c.add("neg", [y]) if negate else y), idx, dims, keep


def _out_shape(x, dims, keep, keepdim):
    return tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else tuple(x.shape[d] for d in keep)


def _reduce_max(c, x, dims, keepdim, negate=False):
    """max (or min, as -max(-x)) of a float tensor over `dims` through max_pool2d: the reduced
    dims are moved together and pooled by one window (gradient: to the max element)."""
    y, _, dims, keep = _pool_rows(c, x, dims, negate)
    return _reshape(c, y, _out_shape(x, dims, keep, keepdim))


@conv(aten.argmax.default, aten.argmin.default)
def _argmax(c, x, dim=None, keepdim=False):
    """Index of the first maximum (minimum) along dim (CLIP's end-of-text position from
    input_ids): the i32 position max_pool2d keeps for its backward. Integer tensors are
    compared as float32, exact for values below 2**24 (token ids, masks)."""
    if dim is None:
        flat = _reshape(c, x, (x.numel,))
        return _argmax(c, flat, 0, False) if not keepdim else \
            _reshape(c, _argmax(c, flat, 0, False), (1,) * len(x.shape))
    t = x if x.dtype == "f32" else c.add("cast", [x], {"dtype": "f32"})
    _, idx, dims, keep = _pool_rows(c, t, [dim], negate=c.target is aten.argmin.default)
    return _reshape(c, c.add("cast", [idx], {"dtype": "i64"}), _out_shape(x, dims, keep, keepdim))


@conv(aten.amax.default, aten.amin.default)
def _amax(c, x, dims=(), keepdim=False):
    return _reduce_max(c, x, _dims(x, dims), keepdim, negate=c.target is aten.amin.default)


@conv(aten.max.dim, aten.min.dim)
def _max_dim(c, x, dim, keepdim=False):
    """torch.max/min(x, dim): values (with gradient) and the int64 index of the first extreme."""
    y, idx, dims, keep = _pool_rows(c, x, [dim], negate=c.target is aten.min.dim)
    shape = _out_shape(x, dims, keep, keepdim)
    return _reshape(c, y, shape), _reshape(c, c.add("cast", [idx], {"dtype": "i64"}), shape)


@conv(aten.max.default, aten.min.default)
def _max_all(c, x):
    return _reduce_max(c, x, _dims(x, None), False, negate=c.target is aten.min.default)



# ---- transposed convolution --------------------------------------------------------------------------
def _zero_insert(c, x: Value, dim: int, s: int) -> Value:
    """s-1 zeros after every element along dim (the last ones dropped): x's values at the
    stride-s positions of a (n-1)*s+1 long axis."""
    if s == 1:
        return x
    n = x.shape[dim]
    t = _reshape(c, x, x.shape[:dim + 1] + (1,) + x.shape[dim + 1:])
    zeros = _full(c, t.shape[:dim + 1] + (s - 1,) + t.shape[dim + 2:], 0.0)
    t = _cat(c, [t, zeros], dim + 1)
    t = _reshape(c, t, x.shape[:dim] + (n * s,) + x.shape[dim + 1:])
    return slice_value(c, t, dim, 0, (n - 1) * s + 1)


def _conv_transpose2d(c, x, w, b, stride, padding, output_padding, groups, dilation):
    """ConvTranspose2d as its textbook equivalent (DPT's reassemble upsampling): the input
    with stride-1 zeros inserted, padded by dilation*(k-1)-padding (+output_padding after),
    convolved at stride 1 with the weight flipped and its in/out channels swapped per group.
    Every piece is an existing op, so the gradients are theirs."""
    from .aten_ext import _constant_pad, _index
    (sh, sw), (ph, pw), (oh, ow), (dh, dw) = (_pair(stride), _pair(padding), _pair(output_padding),
                                              _pair(dilation))
    cin, cout_g, kh, kw = w.shape
    z = _zero_insert(c, _zero_insert(c, x, 2, sh), 3, sw)
    eh, ew = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    z = _constant_pad(c, z, [ew, ew + ow, eh, eh + oh])
    wt = _reshape(c, w, (groups, cin // groups, cout_g, kh, kw))
    wt = c.add("permute", [wt], {"perm": (0, 2, 1, 3, 4)})
    wt = _reshape(c, wt, (groups * cout_g, cin // groups, kh, kw))
    for d, k in ((2, kh), (3, kw)):
        if k > 1:
            rev = const_value(c, "flip", np.arange(k - 1, -1, -1, dtype=np.int64))
            wt = _index(c, wt, [None] * d + [rev])
    return _conv2d(c, z, wt, b, 1, 0, (dh, dw), groups)


_plain_convolution = CONVERTERS[aten.convolution.default]


@conv(aten.convolution.default)
def _convolution(c, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if not transposed:
        return _plain_convolution(c, x, w, b, stride, padding, dilation, transposed, output_padding, groups)
    if len(w.shape) == 3:  # ConvTranspose1d: a 1-high 2-D one
        one = lambda v: v[0] if isinstance(v, (list, tuple)) else v  # noqa: E731
        y = _conv_transpose2d(c, _reshape(c, x, x.shape[:2] + (1, x.shape[2])),
                              _reshape(c, w, w.shape[:2] + (1, w.shape[2])), b, (1, one(stride)),
                              (0, one(padding)), (0, one(output_padding)), groups, (1, one(dilation)))
        return _reshape(c, y, y.shape[:2] + (y.shape[3],))
    if len(w.shape) != 4:
        raise PockError(f"only 1-D and 2-D convolutions are supported ({c.source})")
    return _conv_transpose2d(c, x, w, b, stride, padding, output_padding, groups, dilation)


@conv(aten.conv_transpose2d.input, aten.conv_transpose1d.default)
def _conv_transpose(c, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    nd = len(w.shape) - 2
    one = lambda v: [v] * nd if isinstance(v, int) else list(v)  # noqa: E731
    return _convolution(c, x, w, b, one(stride), one(padding), one(dilation), True, one(output_padding), groups)



# ---- activations by composition -------------------------------------------------------------------------
def _relu_neg(c, x):
    """min(x, 0) as -relu(-x)."""
    return c.add("neg", [c.add("relu", [c.add("neg", [x])])])


@conv(aten.leaky_relu.default)
def _leaky_relu(c, x, slope=0.01):
    """(1 - slope) * relu(x) + slope * x (Swin2SR's upsampler, GAN-style heads)."""
    return c.add("add", [c.add("mul_scalar", [c.add("relu", [x])], {"c": 1.0 - float(slope)}),
                         c.add("mul_scalar", [x], {"c": float(slope)})])


def _softplus_core(c, z):
    """log(1 + exp(z)) stably: relu(z) + log(1 + exp(-|z|))."""
    tail = c.add("log", [c.add("add_scalar", [c.add("exp", [c.add("neg", [c.add("abs", [z])])])], {"c": 1.0})])
    return c.add("add", [c.add("relu", [z]), tail])


@conv(aten.softplus.default)
def _softplus(c, x, beta=1.0, threshold=20.0):
    """softplus(x) = log(1 + exp(beta x)) / beta in the overflow-free form (Mamba's time step);
    torch's linear region above `threshold` agrees within float32 rounding."""
    z = x if beta == 1 else c.add("mul_scalar", [x], {"c": float(beta)})
    y = _softplus_core(c, z)
    return y if beta == 1 else c.add("mul_scalar", [y], {"c": 1.0 / float(beta)})


@conv(aten.log1p.default)
def _log1p(c, x):
    return c.add("log", [c.add("add_scalar", [x], {"c": 1.0})])


@conv(aten.expm1.default)
def _expm1(c, x):
    return c.add("add_scalar", [c.add("exp", [x])], {"c": -1.0})


@conv(aten.elu.default)
def _elu(c, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * (relu(x) + alpha * (exp(min(x, 0) * input_scale) - 1)); also SELU/CELU."""
    neg = _relu_neg(c, x)
    if input_scale != 1:
        neg = c.add("mul_scalar", [neg], {"c": float(input_scale)})
    e = c.add("mul_scalar", [c.add("add_scalar", [c.add("exp", [neg])], {"c": -1.0})], {"c": float(alpha)})
    y = c.add("add", [c.add("relu", [x]), e])
    return y if scale == 1 else c.add("mul_scalar", [y], {"c": float(scale)})


@conv(aten.hardsigmoid.default)
def _hardsigmoid(c, x):
    return c.add("mul_scalar", [c.add("hardtanh", [c.add("add_scalar", [x], {"c": 3.0})], {"lo": 0.0, "hi": 6.0})],
                 {"c": 1.0 / 6.0})


@conv(aten.hardswish.default)
def _hardswish(c, x):
    return c.add("mul", [x, _hardsigmoid(c, x)])


@conv(aten.mish.default)
def _mish(c, x):
    return c.add("mul", [x, c.add("tanh", [_softplus_core(c, x)])])


__all__ = ["_const"]
