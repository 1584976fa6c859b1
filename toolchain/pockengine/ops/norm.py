"""Normalisation: layer_norm, rms_norm, batch_norm (train and eval), with their backward ops."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ir.graph import Value
from .cpp import ACT, _act, _n, fl
from .record import OpRecord, bwd, register
from .shape import numel, same as _same
from .torchref import act as _torch_act


def _rows_cols(x: Value, nd: int):
    cols = math.prod(x.shape[len(x.shape) - nd:])
    return _n(x) // cols, cols


# ---- layer_norm --------------------------------------------------------------------------
def _ln(i, a):
    x = i[0].shape
    rows = math.prod(x[: len(x) - a["normalized_ndim"]])
    return [(x, "f32"), ((rows,), "f32"), ((rows,), "f32")]


def _layer_norm_grad(b, n, g, need):
    x, w, bias = n.inputs
    y, mean, rstd = n.outputs
    w_shape = x.shape[len(x.shape) - n.attrs["normalized_ndim"]:]
    return b.add("layer_norm_bwd", [g[0], x, mean, rstd, w], {"w_shape": w_shape},
                 wanted=[bool(need[0]), bool(need[1]), bool(need[2])])


def _ln_cpu(e, n, x, w, bias, y, mean, rstd):
    rows, cols = _rows_cols(n.inputs[0], n.attrs["normalized_ndim"])
    return f"pk::layer_norm_fwd({x}, {w}, {bias}, {y}, {mean}, {rstd}, {rows}, {cols}, {fl(n.attrs['eps'])});"


def _ln_bwd_cpu(e, n, dy, x, mean, rstd, w, dx, dw, db):
    rows, cols = _rows_cols(n.inputs[1], len(n.attrs["w_shape"]))
    return f"pk::layer_norm_bwd({dy}, {x}, {mean}, {rstd}, {w}, {dx}, {dw}, {db}, {rows}, {cols});"


register(
    OpRecord("layer_norm", _ln, lambda i, o, a: 8 * numel(i[0]), float_only=True, grad=_layer_norm_grad,
             torch=lambda i, a: F.layer_norm(i[0], i[0].shape[i[0].dim() - a["normalized_ndim"]:], i[1], i[2],
                                             a["eps"]),
             cpu=_ln_cpu),
    bwd("layer_norm_bwd", lambda i, a: [(i[1].shape, "f32"), (a["w_shape"], "f32"), (a["w_shape"], "f32")],
        lambda i, o, a: 10 * numel(i[0]), cpu=_ln_bwd_cpu),
)


# ---- rms_norm ------------------------------------------------------------------------------
def _rms_norm_grad(b, n, g, need):
    x, w = n.inputs
    return b.add("rms_norm_bwd", [g[0], x, n.outputs[1], w], {}, wanted=[bool(need[0]), bool(need[1])])


register(
    OpRecord("rms_norm", lambda i, a: [(i[0].shape, "f32"), ((math.prod(i[0].shape[:-1]),), "f32")],
             lambda i, o, a: 4 * numel(i[0]), grad=_rms_norm_grad,
             cpu=lambda e, n, x, w, y, rstd: (
                 f"pk::rms_norm_fwd({x}, {w}, {y}, {rstd}, {n.outputs[1].shape[0]}, {n.inputs[0].shape[-1]}, "
                 f"{fl(n.attrs['eps'])});")),
    bwd("rms_norm_bwd", lambda i, a: [(i[1].shape, "f32"), (i[1].shape[-1:], "f32")],
        lambda i, o, a: 8 * numel(i[0]),
        cpu=lambda e, n, dy, x, rstd, w, dx, dw: (
            f"pk::rms_norm_bwd({dy}, {x}, {rstd}, {w}, {dx}, {dw}, {n.inputs[2].shape[0]}, "
            f"{n.inputs[1].shape[-1]});")),
)


# ---- batch_norm ------------------------------------------------------------------------------
def _bn_train(i, a):
    c = (i[0].shape[1],)
    return [(i[0].shape, "f32")] + [(c, "f32")] * 4


def _bn_train_grad(b, n, g, need):
    x, w = n.inputs[:2]
    _, mean, invstd = n.outputs[:3]
    dx, dw, db = b.add("batch_norm_train_bwd", [g[0], x, mean, invstd, w], {},
                       wanted=[bool(need[0]), bool(need[1]), bool(need[2])])
    return [dx, dw, db, None, None]


def _bn_eval_grad(b, n, g, need):
    x, w, _, rm, rv = n.inputs
    dx, dw, db = b.add("batch_norm_eval_bwd", [g[0], x, rm, rv, w], {"eps": n.attrs["eps"]},
                       wanted=[bool(need[0]), bool(need[1]), bool(need[2])])
    return [dx, dw, db, None, None]


def _ncs(x: Value) -> str:
    return f"{x.shape[0]}, {x.shape[1]}, {math.prod(x.shape[2:])}"


def _bn_train_cpu(e, n, x, w, bias, rm, rv, y, mean, invstd, nrm, nrv):
    a = n.attrs
    suffix, arg = _act(n)
    return (f"pk::batch_norm_train_fwd{suffix}({x}, {w}, {bias}, {rm}, {rv}, {y}, {mean}, {invstd}, {nrm}, {nrv}, "
            f"{_ncs(n.inputs[0])}, {fl(a['momentum'])}, {fl(a['eps'])}{arg});")


def _bn_eval_cpu(e, n, x, w, bias, rm, rv, y):
    suffix, arg = _act(n)
    return (f"pk::batch_norm_eval_fwd{suffix}({x}, {w}, {bias}, {rm}, {rv}, {y}, {_ncs(n.inputs[0])}, "
            f"{fl(n.attrs['eps'])}{arg});")


def _bn_train_bwd_cpu(e, n, dy, x, mean, invstd, w, *rest):
    *y, dx, dw, db = rest  # y: the fused activation's output (passes.fuse.fuse_activation_grads), if any
    if y:
        return (f"pk::batch_norm_train_bwd_act({dy}, {y[0]}, {x}, {mean}, {invstd}, {w}, {dx}, {dw}, {db}, "
                f"{_ncs(n.inputs[1])}, {ACT[n.attrs['act']]});")
    return f"pk::batch_norm_train_bwd({dy}, {x}, {mean}, {invstd}, {w}, {dx}, {dw}, {db}, {_ncs(n.inputs[1])});"


def _bn_eval_bwd_cpu(e, n, dy, x, rm, rv, w, dx, dw, db):
    return (f"pk::batch_norm_eval_bwd({dy}, {x}, {rm}, {rv}, {w}, {dx}, {dw}, {db}, {_ncs(n.inputs[1])}, "
            f"{fl(n.attrs['eps'])});")


def _bn_train_torch(i, a):
    """(y, batch mean, batch invstd, new running mean, new running var), as the IR op."""
    x, w, b, rm, rv = i[:5]
    dims = [d for d in range(x.dim()) if d != 1]
    n = x.numel() // x.shape[1]
    mean = x.mean(dims)
    var = x.var(dims, unbiased=False)
    m = a["momentum"]
    with torch.no_grad():
        new_rm = None if rm is None else (1 - m) * rm + m * mean.detach()
        new_rv = None if rv is None else (1 - m) * rv + m * var.detach() * (n / max(n - 1, 1))
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + a["eps"])
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    return [_torch_act(y, a), mean, torch.rsqrt(var + a["eps"]), new_rm, new_rv]


register(
    OpRecord("batch_norm_train", _bn_train, lambda i, o, a: 8 * numel(i[0]), float_only=True, grad=_bn_train_grad,
             act_epilogue=True, torch_train=_bn_train_torch,
             cpu=_bn_train_cpu),
    OpRecord("batch_norm_eval", _same, lambda i, o, a: 2 * numel(i[0]), float_only=True, grad=_bn_eval_grad,
             act_epilogue=True,
             torch=lambda i, a: _torch_act(F.batch_norm(i[0], i[3], i[4], i[1], i[2], False, 0.0, a["eps"]), a),
             cpu=_bn_eval_cpu),
    bwd("batch_norm_train_bwd", lambda i, a: [(i[1].shape, "f32")] + [((i[1].shape[1],), "f32")] * 2,
        lambda i, o, a: 10 * numel(i[0]), cpu=_bn_train_bwd_cpu),
    bwd("batch_norm_eval_bwd", lambda i, a: [(i[1].shape, "f32")] + [((i[1].shape[1],), "f32")] * 2,
        lambda i, o, a: 4 * numel(i[0]), cpu=_bn_eval_bwd_cpu),
)
