"""One converter per ATen op: fx node arguments → IR nodes.

A converter gets the context and the fx node's args/kwargs (fx nodes already
replaced by IR Values) and returns a Value or a tuple of Values.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import torch

from ..errors import PockError
from ..ir.graph import Graph, Value

aten = torch.ops.aten
CONVERTERS: dict = {}
_DTYPES = {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "u8", torch.uint8: "u8"}
_BIG = 2**62


def to_ir_dtype(dtype, what: str) -> str:
    if dtype not in _DTYPES:
        raise PockError(f"{what} has dtype {dtype}; PockEngine compiles float32 models with int64 indices")
    return _DTYPES[dtype]


def module_path(fx_node) -> str:
    stack = fx_node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    path = path.split("L['self'].", 1)[-1]
    path = path[len("model."):] if path.startswith("model.") else ("" if path == "model" else path)
    cls_name = getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1].strip("'>"))
    if cls_name in ("_TrainStep", "_TrainStepAndOutputs"):
        return "loss"
    return f"{path} ({cls_name})" if path else cls_name


class Ctx:
    def __init__(self, g: Graph):
        self.g = g
        self.env: dict = {}
        self.unbound: dict = {}  # fx name -> state name of a compile-time tensor of a dtype the step cannot hold
        self.source = ""

    # -- values ---------------------------------------------------------
    def get(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.get(x) for x in a)
        return a

    def value(self, a) -> Value:
        v = self.get(a)
        if not isinstance(v, Value):
            raise PockError(f"expected a tensor, got {v!r} in {self.source}")
        return v

    def add(self, op, inputs, attrs=None, **kw):
        return self.g.add(op, inputs, attrs, source=self.source, **kw)

    # -- the walk -----------------------------------------------------------
    def convert(self, node):
        self.source = module_path(node)
        target = node.target
        if target is operator.getitem:
            seq, idx = self.get(node.args[0]), node.args[1]
            self.env[node.name] = seq[idx]
            return
        self.target = target
        self.target_name = getattr(target, "__name__", str(target))
        fn = CONVERTERS.get(target)
        if fn is None:
            where = f" in module {self.source}" if self.source else ""
            raise PockError(f"unsupported op {target}{where}; see README 'Supported ops'")
        args, kwargs = self.get(node.args), self.get(node.kwargs)
        try:
            out = fn(self, *args, **kwargs)
        except PockError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AssertionError) as e:
            raise PockError(f"cannot compile {target} in {self.source or 'the model'}: {e}") from e
        _check_shapes(node, out, self.source)
        self.env[node.name] = out


def _check_shapes(node, out, source):
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    outs = out if isinstance(out, (tuple, list)) else [out]
    for v, o in zip(vals, outs):
        if isinstance(o, Value) and isinstance(v, torch.Tensor) and tuple(v.shape) != o.shape:
            raise PockError(f"internal shape mismatch for {node.target} in {source}: torch {tuple(v.shape)}, "
                            f"ours {o.shape}")


def conv(*ops):
    def deco(fn):
        for op in ops:
            CONVERTERS[op] = fn
        return fn
    return deco


def _dim(d, nd):
    return d + nd if d < 0 else d


def _pair(x):
    return (x, x) if isinstance(x, int) else tuple(x) * (2 if len(x) == 1 else 1)


def _reshape(c: Ctx, x: Value, shape) -> Value:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.numel // known if known else 0
    if tuple(shape) == x.shape:
        return x
    return c.add("reshape", [x], {"shape": tuple(shape)})


def _full(c: Ctx, shape, value, dtype="f32"):
    return c.add("full", [], {"shape": tuple(shape), "value": float(value), "dtype": dtype})


def const_value(c: Ctx, what: str, data) -> Value:
    """A constant computed at conversion time, as a named state tensor (f32, or i64 for integer
    data): const:<module>.<what><n>."""
    name = f"const:{c.source.split(' ')[0] or 'model'}.{what}"
    name += str(sum(n.startswith(name) for n in c.g.state))
    data = np.asarray(data)
    data = np.ascontiguousarray(data.astype(np.float32 if data.dtype.kind == "f" else np.int64))
    return c.g.add_state(name, data.shape, "f32" if data.dtype.kind == "f" else "i64", "const", data=data)


def is_zero_fill(v) -> bool:
    return isinstance(v, Value) and v.producer is not None and v.producer.op == "full" \
        and v.producer.attrs["value"] == 0.0


# ---- dense layers ----------------------------------------------------------
@conv(aten.linear.default)
def _linear(c, x, w, b=None):
    return c.add("linear", [x, w, b])


@conv(aten.conv2d.default)
def _conv2d(c, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    if x.shape.__len__() != 4:
        raise PockError(f"conv2d in {c.source} needs a batched NCHW input, got shape {x.shape}")
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        else:
            d, k = _pair(dilation), w.shape[2:]
            if any(s != 1 for s in _pair(stride)) or any((d[i] * (k[i] - 1)) % 2 for i in range(2)):
                raise PockError(f"padding='same' with asymmetric padding is not supported in {c.source}")
            padding = tuple(d[i] * (k[i] - 1) // 2 for i in range(2))
    return c.add("conv2d", [x, w, b], {"stride": _pair(stride), "padding": _pair(padding),
                                        "dilation": _pair(dilation), "groups": int(groups)})


@conv(aten.convolution.default)
def _convolution(c, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed or len(w.shape) != 4:
        raise PockError(f"only 2-D non-transposed convolution is supported ({c.source})")
    return _conv2d(c, x, w, b, stride, padding, dilation, groups)


@conv(aten.embedding.default)
def _embedding(c, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise PockError(f"Embedding(scale_grad_by_freq=True) is not supported ({c.source})")
    if idx.dtype != "i64":
        raise PockError(f"embedding indices must be int64 in {c.source}, got {idx.dtype}")
    return c.add("embedding", [w, idx], {"padding_idx": int(padding_idx) if padding_idx is not None else -1})


@conv(aten.layer_norm.default, aten.native_layer_norm.default)
def _layer_norm(c, x, shape, w=None, b=None, eps=1e-5, cudnn=False):
    y, mean, rstd = c.add("layer_norm", [x, w, b], {"normalized_ndim": len(shape), "eps": float(eps)})
    return y if c.target is aten.layer_norm.default else (y, mean, rstd)


@conv(aten._native_batch_norm_legit_functional.default)
def _bn_functional(c, x, w, b, rm, rv, training, momentum, eps):
    if not training:
        y = c.add("batch_norm_eval", [x, w, b, rm, rv], {"eps": float(eps)})
        return y, None, None, rm, rv
    return tuple(c.add("batch_norm_train", [x, w, b, rm, rv], {"momentum": float(momentum), "eps": float(eps)}))


@conv(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(c, x, w, b, rm, rv, momentum, eps):
    return c.add("batch_norm_eval", [x, w, b, rm, rv], {"eps": float(eps)}), None, None


# ---- pooling ---------------------------------------------------------------
def _pool_attrs(kernel, stride, padding, ceil_mode, dilation=1):
    k = _pair(kernel)
    return {"kernel": k, "stride": _pair(stride) if stride else k, "padding": _pair(padding),
            "dilation": _pair(dilation), "ceil_mode": bool(ceil_mode)}


@conv(aten.max_pool2d.default)
def _max_pool(c, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    return c.add("max_pool2d", [x], _pool_attrs(kernel, stride, padding, ceil_mode, dilation))[0]


@conv(aten.max_pool2d_with_indices.default)
def _max_pool_idx(c, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    y = _max_pool(c, x, kernel, stride, padding, dilation, ceil_mode)
    return y, None


@conv(aten.avg_pool2d.default)
def _avg_pool(c, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    attrs = _pool_attrs(kernel, stride, padding, ceil_mode)
    attrs.update(count_include_pad=bool(count_include_pad), divisor_override=int(divisor_override or 0))
    return c.add("avg_pool2d", [x], attrs)


@conv(aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default)
def _adaptive_avg(c, x, output_size):
    out = tuple(x.shape[2 + i] if s is None else int(s) for i, s in enumerate(_pair(output_size)))
    return c.add("adaptive_avg_pool2d", [x], {"output_size": out})


# ---- pointwise -----------------------------------------------------------------
for _aten, _ir in [(aten.relu.default, "relu"), (aten.sigmoid.default, "sigmoid"), (aten.tanh.default, "tanh"),
                   (aten.silu.default, "silu"), (aten.exp.default, "exp"), (aten.log.default, "log"),
                   (aten.sqrt.default, "sqrt"), (aten.rsqrt.default, "rsqrt"), (aten.neg.default, "neg"),
                   (aten.abs.default, "abs"), (aten.reciprocal.default, "reciprocal")]:
    CONVERTERS[_aten] = (lambda ir: lambda c, x: c.add(ir, [x]))(_ir)


@conv(aten.relu6.default)
def _relu6(c, x):
    return c.add("hardtanh", [x], {"lo": 0.0, "hi": 6.0})


@conv(aten.hardtanh.default)
def _hardtanh(c, x, lo=-1.0, hi=1.0):
    return c.add("hardtanh", [x], {"lo": float(lo), "hi": float(hi)})


@conv(aten.clamp.default)
def _clamp(c, x, lo=None, hi=None):
    return c.add("hardtanh", [x], {"lo": -math.inf if lo is None else float(lo),
                                   "hi": math.inf if hi is None else float(hi)})


@conv(aten.gelu.default)
def _gelu(c, x, approximate="none"):
    return c.add("gelu", [x], {"approximate": approximate == "tanh"})


def _scalar(x):
    return not isinstance(x, Value)


def _binary(c, op, a, b):
    if _scalar(a) and _scalar(b):
        raise PockError(f"{op} of two Python scalars in {c.source}")
    if _scalar(b):
        if op == "add":
            return c.add("add_scalar", [a], {"c": float(b)})
        if op == "sub":
            return c.add("add_scalar", [a], {"c": -float(b)})
        if op == "mul":
            return c.add("mul_scalar", [a], {"c": float(b)})
        return c.add("mul_scalar", [a], {"c": 1.0 / float(b)})
    if _scalar(a):
        if op in ("add", "mul"):
            return _binary(c, op, b, a)
        if op == "sub":
            return c.add("rsub_scalar", [b], {"c": float(a)})
        return c.add("mul_scalar", [c.add("reciprocal", [b])], {"c": float(a)})
    if a.dtype != "f32" and b.dtype != "f32" and op != "div":  # integer bookkeeping (position ids)
        if a.dtype != b.dtype:
            a, b = (v if v.dtype == "i64" else c.add("cast", [v], {"dtype": "i64"}) for v in (a, b))
        return c.add(op, [a, b])
    if a.dtype != b.dtype and "f32" in (a.dtype, b.dtype):  # torch's promotion: int/bool + float is float
        a, b = (v if v.dtype == "f32" else c.add("cast", [v], {"dtype": "f32"}) for v in (a, b))
    if a.dtype != b.dtype or a.dtype != "f32":
        raise PockError(f"{op} needs two float32 tensors in {c.source}, got {a.dtype} and {b.dtype}")
    return c.add(op, [a, b])


@conv(aten.add.Tensor, aten.add.Scalar)
def _add(c, a, b, alpha=1):
    if alpha != 1:
        b = _binary(c, "mul", b, alpha)
    return _binary(c, "add", a, b)


@conv(aten.sub.Tensor, aten.sub.Scalar)
def _sub(c, a, b, alpha=1):
    if alpha != 1:
        b = _binary(c, "mul", b, alpha)
    return _binary(c, "sub", a, b)


@conv(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(c, a, b, alpha=1):
    return _sub(c, b, a, alpha) if alpha == 1 else _binary(c, "sub", b, _binary(c, "mul", a, alpha))


@conv(aten.mul.Tensor, aten.mul.Scalar)
def _mul(c, a, b):
    return _binary(c, "mul", a, b)


@conv(aten.div.Tensor, aten.div.Scalar)
def _div(c, a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise PockError(f"div with rounding_mode={rounding_mode!r} is not supported ({c.source})")
    return _binary(c, "div", a, b)


@conv(aten.pow.Tensor_Scalar)
def _pow(c, x, e):
    if e == 2:
        return c.add("mul", [x, x])
    return c.add("pow_scalar", [x], {"e": float(e)})


@conv(aten.where.self)
def _where(c, cond, a, b):
    a = a if isinstance(a, Value) else _full(c, (), a)
    b = b if isinstance(b, Value) else _full(c, (), b)
    return c.add("where", [cond, a, b])


@conv(aten.bitwise_not.default, aten.logical_not.default)
def _not(c, m):
    if m.dtype != "u8":
        raise PockError(f"bitwise not is supported on bool tensors only ({c.source})")
    return c.add("rsub_scalar", [m], {"c": 1.0})


@conv(aten.masked_fill.Scalar)
def _masked_fill(c, x, mask, value):
    return c.add("where", [mask, _full(c, (), value), x])


# ---- reductions and softmax --------------------------------------------------------
def _dims(x, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(len(x.shape)))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(_dim(d, len(x.shape)) for d in dims))


@conv(aten.sum.dim_IntList, aten.sum.default)
def _sum(c, x, dims=None, keepdim=False, dtype=None):
    return c.add("sum", [x], {"dims": _dims(x, dims), "keepdim": bool(keepdim)})


@conv(aten.mean.dim, aten.mean.default)
def _mean(c, x, dims=None, keepdim=False, dtype=None):
    return c.add("mean", [x], {"dims": _dims(x, dims), "keepdim": bool(keepdim)})


@conv(aten._softmax.default, aten.softmax.int)
def _softmax(c, x, dim, half_to_float=False):
    return c.add("softmax", [x], {"dim": _dim(dim, len(x.shape))})


@conv(aten._log_softmax.default, aten.log_softmax.int)
def _log_softmax(c, x, dim, half_to_float=False):
    return c.add("log_softmax", [x], {"dim": _dim(dim, len(x.shape))})


@conv(aten.scaled_dot_product_attention.default)
def _sdpa(c, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise PockError(f"scaled_dot_product_attention with dropout_p={dropout_p} is not supported in "
                        f"{c.source}; pass dropout_p=0.0 (or self.training and 0.0)")
    k, v = _kv_heads(c, q, k, enable_gqa), _kv_heads(c, q, v, enable_gqa)
    attrs = {"causal": bool(is_causal), "scale": float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])}
    if attn_mask is not None and attn_mask.dtype == "i64":
        raise PockError(f"attn_mask must be bool or float ({c.source})")
    if attn_mask is not None:
        batch, mb = q.shape[:-2], attn_mask.shape[:-2]
        mb = (1,) * (len(batch) - len(mb)) + tuple(mb)
        if math.prod(mb) != 1 and tuple(mb) != tuple(batch):  # one stride must walk the flattened batch
            attn_mask = _expand(c, attn_mask, batch + attn_mask.shape[-2:])
    return tuple(c.add("sdpa", [q, k, v, attn_mask], attrs))[0]


def _kv_heads(c, q, kv, gqa):
    """k or v with q's batch dims: broadcast ones expanded (Falcon's multi-query k/v), and
    under enable_gqa each of Hk heads repeated H/Hk times (repeat_interleave on dim -3)."""
    bq, bk = q.shape[:-2], kv.shape[:-2]
    if bq == bk:
        return kv
    if gqa and len(bq) == len(bk) >= 1 and bk[:-1] == bq[:-1] and bk[-1] and bq[-1] % bk[-1] == 0:
        g = bq[-1] // bk[-1]
        y = _reshape(c, kv, bk + (1,) + kv.shape[-2:])
        y = c.add("expand", [y], {"shape": bk + (g,) + kv.shape[-2:]})
        return _reshape(c, y, bq + kv.shape[-2:])
    if len(bk) <= len(bq) and all(s in (1, t) for s, t in zip(bk[::-1], bq[::-1])):
        y = _reshape(c, kv, (1,) * (len(bq) - len(bk)) + kv.shape)
        return c.add("expand", [y], {"shape": bq + kv.shape[-2:]})
    raise PockError(f"scaled_dot_product_attention needs k/v batch dims {bk} that broadcast to q's {bq} "
                    f"({c.source})")


# ---- matrix products -----------------------------------------------------------------
@conv(aten.matmul.default)
def _matmul(c, a, b):
    if len(a.shape) == 1 or len(b.shape) == 1:
        a2 = _reshape(c, a, (1,) + a.shape) if len(a.shape) == 1 else a
        b2 = _reshape(c, b, b.shape + (1,)) if len(b.shape) == 1 else b
        y = _matmul(c, a2, b2)
        shape = y.shape[:-2] + ((y.shape[-2],) if len(a.shape) > 1 else ()) + ((y.shape[-1],) if len(b.shape) > 1 else ())
        return _reshape(c, y, shape)
    return _batched_mm(c, a, b)


def _batched_mm(c, a, b):
    ba, bb = a.shape[:-2], b.shape[:-2]
    if math.prod(bb) == 1 and len(ba) >= 1:  # fold a's batch into its rows: one GEMM
        y = c.add("matmul", [_reshape(c, a, (math.prod(ba) * a.shape[-2], a.shape[-1])),
                             _reshape(c, b, b.shape[-2:])])
        return _reshape(c, y, ba + (a.shape[-2], b.shape[-1]))
    if ba != bb and math.prod(ba) != 1:
        from ..ops.shape import broadcast_shapes
        full = broadcast_shapes(ba, bb)
        a = a if ba == full else c.add("expand", [_reshape(c, a, (1,) * (len(full) - len(ba)) + a.shape)],
                                        {"shape": full + a.shape[-2:]})
        b = b if bb == full else c.add("expand", [_reshape(c, b, (1,) * (len(full) - len(bb)) + b.shape)],
                                        {"shape": full + b.shape[-2:]})
    return c.add("matmul", [a, b])


@conv(aten.mm.default, aten.bmm.default)
def _mm(c, a, b):
    return c.add("matmul", [a, b])


@conv(aten.addmm.default)
def _addmm(c, bias, a, b, beta=1, alpha=1):
    y = _binary(c, "mul", c.add("matmul", [a, b]), alpha) if alpha != 1 else c.add("matmul", [a, b])
    return _add(c, y, bias if beta == 1 else _binary(c, "mul", bias, beta))


# ---- layout ---------------------------------------------------------------------------
@conv(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _view(c, x, shape):
    return _reshape(c, x, shape)


@conv(aten.flatten.using_ints)
def _flatten(c, x, start=0, end=-1):
    nd = len(x.shape)
    if nd == 0:
        return _reshape(c, x, (1,))
    s, e = _dim(start, nd), _dim(end, nd)
    return _reshape(c, x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


@conv(aten.unsqueeze.default)
def _unsqueeze(c, x, d):
    d = _dim(d, len(x.shape) + 1)
    return _reshape(c, x, x.shape[:d] + (1,) + x.shape[d:])


@conv(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(c, x, dims=None):
    dims = _dims(x, dims) if dims is not None else tuple(range(len(x.shape)))
    return _reshape(c, x, tuple(s for i, s in enumerate(x.shape) if not (i in dims and s == 1)))


@conv(aten.permute.default)
def _permute(c, x, perm):
    perm = tuple(_dim(p, len(x.shape)) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return c.add("permute", [x], {"perm": perm})


@conv(aten.transpose.int)
def _transpose(c, x, d0, d1):
    perm = list(range(len(x.shape)))
    d0, d1 = _dim(d0, len(perm)), _dim(d1, len(perm))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(c, x, perm)


@conv(aten.t.default)
def _t(c, x):
    return _permute(c, x, (1, 0)) if len(x.shape) == 2 else x


@conv(aten.expand.default)
def _expand(c, x, shape, implicit=False):
    nd = len(shape)
    xs = (1,) * (nd - len(x.shape)) + x.shape
    shape = tuple(xs[i] if s == -1 else s for i, s in enumerate(shape))
    if shape == x.shape:
        return x
    return c.add("expand", [_reshape(c, x, xs)], {"shape": shape})


def slice_value(c, x, dim, start, end, step=1):
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None or end >= _BIG else end
    start, end = (start + n if start < 0 else start), (end + n if end < 0 else end)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    if start == 0 and end == n and step == 1:
        return x
    return c.add("slice", [x], {"dim": dim, "start": start, "end": max(end, start), "step": int(step)})


@conv(aten.slice.Tensor)
def _slice(c, x, dim=0, start=None, end=None, step=1):
    return slice_value(c, x, _dim(dim, len(x.shape)), start, end, step)


@conv(aten.select.int)
def _select(c, x, dim, index):
    dim = _dim(dim, len(x.shape))
    index = index + x.shape[dim] if index < 0 else index
    y = slice_value(c, x, dim, index, index + 1)
    return _reshape(c, y, x.shape[:dim] + x.shape[dim + 1:])


@conv(aten.split.Tensor, aten.split_with_sizes.default)
def _split(c, x, size, dim=0):
    dim = _dim(dim, len(x.shape))
    n = x.shape[dim]
    sizes = list(size) if isinstance(size, (list, tuple)) else [min(size, n - i) for i in range(0, n, size)]
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_value(c, x, dim, start, start + s))
        start += s
    return tuple(outs)


@conv(aten.cat.default)
def _cat(c, xs, dim=0):
    xs = [x for x in xs if x.numel > 0 or len(x.shape) > 1]
    if len(xs) == 1:
        return xs[0]
    return c.add("cat", list(xs), {"dim": _dim(dim, len(xs[0].shape))})


@conv(aten.clone.default, aten.contiguous.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(c, x, **kw):
    return x


@conv(aten.detach.default)
def _detach(c, x):
    return c.add("reshape", [x], {"shape": x.shape, "stop_gradient": True})


@conv(aten._to_copy.default)
def _to_copy(c, x, dtype=None, **kw):
    if dtype is None or to_ir_dtype(dtype, "tensor") == x.dtype:
        return x
    raise PockError(f"dtype conversion to {dtype} is not supported ({c.source})")


@conv(aten.full.default, aten.zeros.default, aten.ones.default, aten.full_like.default, aten.zeros_like.default,
      aten.ones_like.default, aten.scalar_tensor.default, aten.new_zeros.default, aten.new_ones.default)
def _fill(c, *args, dtype=None, **kw):
    name = c.target_name
    like = isinstance(args[0], Value)
    if name.startswith("scalar_tensor"):
        shape, value = (), args[0]
    elif like and name.startswith("new_"):
        shape, value = tuple(args[1]), 0.0 if "zeros" in name else 1.0
    elif like:
        shape = args[0].shape
        value = args[1] if name.startswith("full") else (0.0 if "zeros" in name else 1.0)
        dtype = dtype or _torch_dtype(args[0].dtype)
    else:
        shape = tuple(args[0])
        value = args[1] if name.startswith("full") else (0.0 if "zeros" in name else 1.0)
    ir_dtype = to_ir_dtype(dtype, "constant") if dtype is not None else "f32"
    return _full(c, shape, value, ir_dtype)


def _torch_dtype(ir):
    return {v: k for k, v in _DTYPES.items()}[ir]


# ---- recurrent layers -------------------------------------------------------------------
def _rnn_common(c, x, params, num_layers, batch_first, bidirectional):
    if bidirectional:
        raise PockError(f"bidirectional RNNs are not supported ({c.source})")
    if not batch_first:
        x = _permute(c, x, (1, 0, 2))
    per_layer = len(params) // num_layers
    return x, [params[i * per_layer:(i + 1) * per_layer] for i in range(num_layers)]


def _layer_state(c, h, layer):
    if h is None or is_zero_fill(h):
        return None
    return _select(c, h, 0, layer)


def _stack_layers(c, states):
    return _cat(c, [_reshape(c, s, (1,) + s.shape) for s in states], 0)


def _maybe_dropout(c, y, p, train, layer, num_layers):
    if p and train and layer < num_layers - 1:
        return c.add("dropout", [y], {"p": float(p)})[0]
    return y


@conv(aten.lstm.input)
def _lstm(c, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    x, layers = _rnn_common(c, x, params, num_layers, batch_first, bidirectional)
    hns, cns = [], []
    for l, ps in enumerate(layers):
        w_ih, w_hh = ps[0], ps[1]
        b_ih, b_hh = (ps[2], ps[3]) if has_biases else (None, None)
        w_hr = ps[-1] if len(ps) == 2 + 2 * bool(has_biases) + 1 else None
        hidden = w_ih.shape[0] // 4
        proj = w_hr.shape[0] if w_hr is not None else hidden
        y, hn, cn, *_ = c.add("lstm", [x, _layer_state(c, hx[0], l), _layer_state(c, hx[1], l), w_ih, w_hh, b_ih,
                                       b_hh, w_hr], {"hidden": hidden, "proj": proj},
                              wanted=[True] * 5 + [w_hr is not None])
        hns.append(hn)
        cns.append(cn)
        x = _maybe_dropout(c, y, dropout, train, l, num_layers)
    y = x if batch_first else _permute(c, x, (1, 0, 2))
    return y, _stack_layers(c, hns), _stack_layers(c, cns)


@conv(aten.gru.input)
def _gru(c, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    x, layers = _rnn_common(c, x, params, num_layers, batch_first, bidirectional)
    hns = []
    for l, ps in enumerate(layers):
        b_ih, b_hh = (ps[2], ps[3]) if has_biases else (None, None)
        y, hn, _ = c.add("gru", [x, _layer_state(c, hx, l), ps[0], ps[1], b_ih, b_hh],
                         {"hidden": ps[0].shape[0] // 3})
        hns.append(hn)
        x = _maybe_dropout(c, y, dropout, train, l, num_layers)
    y = x if batch_first else _permute(c, x, (1, 0, 2))
    return y, _stack_layers(c, hns)


# ---- dropout and losses ------------------------------------------------------------------
@conv(aten.native_dropout.default)
def _native_dropout(c, x, p, train):
    if not train or not p:
        return x, None
    return c.add("dropout", [x], {"p": float(p)})[0], None


@conv(aten.dropout.default)
def _dropout(c, x, p, train):
    return _native_dropout(c, x, p, train)[0]


def _check_class_target(c, logits, target, what):
    if len(logits.shape) != 2 or target.shape != logits.shape[:1]:
        raise PockError(f"{what} needs logits [N, C] and class indices [N] ({c.source}); got {logits.shape} and "
                        f"{target.shape}")
    if target.dtype != "i64":
        raise PockError(f"{what} targets must be int64 class indices, got {target.dtype}")


@conv(aten.cross_entropy_loss.default)
def _cross_entropy(c, logits, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if weight is not None or reduction != 1:
        raise PockError(f"cross_entropy supports reduction='mean' without class weights ({c.source})")
    _check_class_target(c, logits, target, "cross_entropy")
    return c.add("cross_entropy", [logits, target], {"ignore_index": int(ignore_index),
                                                     "label_smoothing": float(label_smoothing)})


@conv(aten.nll_loss_forward.default)
def _nll_forward(c, logp, target, weight, reduction, ignore_index):
    return _nll(c, logp, target, weight, reduction, ignore_index), None


@conv(aten.nll_loss.default, aten.nll_loss_nd.default)
def _nll(c, logp, target, weight=None, reduction=1, ignore_index=-100):
    if weight is not None or reduction != 1:
        raise PockError(f"nll_loss supports reduction='mean' without class weights ({c.source})")
    _check_class_target(c, logp, target, "nll_loss")
    return c.add("nll_loss", [logp, target], {"ignore_index": int(ignore_index)})


@conv(aten.mse_loss.default)
def _mse(c, a, b, reduction=1):
    if reduction != 1:
        raise PockError(f"mse_loss supports reduction='mean' only ({c.source})")
    if a.shape != b.shape:
        from ..ops.shape import broadcast_shapes
        shape = broadcast_shapes(a.shape, b.shape)
        a = _expand(c, a, shape)
        b = _expand(c, b, shape)
    return c.add("mse_loss", [a, b])


@conv(aten.broadcast_tensors.default)
def _broadcast(c, xs):
    from ..ops.shape import broadcast_shapes
    shape = broadcast_shapes(*[x.shape for x in xs])
    return tuple(_expand(c, x, shape) for x in xs)
