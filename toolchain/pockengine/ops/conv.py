"""Convolution and pooling: conv2d, max/avg/adaptive-avg pooling, with their backward ops."""
from __future__ import annotations

import math

import torch.nn.functional as F

from .cpp import _act, b
from .record import OpRecord, bwd, k_of as _k, register
from .shape import conv_out, numel, pool_out
from .torchref import act as _torch_act


# ---- conv2d ----------------------------------------------------------------------------
def _conv(i, a):
    x, w = i[0].shape, i[1].shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return [((x[0], w[0], conv_out(x[2], w[2], sh, ph, dh), conv_out(x[3], w[3], sw, pw, dw)), "f32")]


def _conv_attrs(n):
    return {k: n.attrs[k] for k in ("stride", "padding", "dilation", "groups")}


def _conv2d_grad(b, n, g, need):
    x, w, _ = n.inputs
    gy = g[0]
    attrs = _conv_attrs(n) | {"x_shape": x.shape, "w_shape": w.shape}
    dx = b.add("conv2d_bwd_input", [gy, w], attrs) if need[0] else None
    dw = None
    if need[1]:
        k = _k(need[1], w.shape[1])
        xs = b.saved_slice(x, 1, k) if n.attrs["groups"] == 1 else x
        dw = b.add("conv2d_bwd_weight", [gy, xs], attrs | {"k": k})
    db = b.add("conv2d_bwd_bias", [gy], attrs) if need[2] else None
    return [dx, dw, db]


def conv_params(x_shape, w_shape, y_shape, a) -> str:
    N, C, H, W = x_shape
    O, _, KH, KW = w_shape
    OH, OW = y_shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return f"{{{N}, {C}, {H}, {W}, {O}, {KH}, {KW}, {OH}, {OW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {a['groups']}}}"


def _conv_cpu(e, n, x, w, bias, y):
    p = conv_params(n.inputs[0].shape, n.inputs[1].shape, n.outputs[0].shape, n.attrs)
    suffix, arg = _act(n)
    return f"pk::conv2d_fwd{suffix}({x}, {w}, {bias}, {y}, {p}{arg});"


def _conv_bi_cpu(e, n, dy, w, dx):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_input({dy}, {w}, {dx}, {p});"


def _conv_bw_cpu(e, n, dy, xs, dw):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_weight({dy}, {xs}, {dw}, {p}, {n.attrs['k']}, {n.inputs[1].shape[1]});"


def _conv_bb_cpu(e, n, dy, db):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_bias({dy}, {db}, {p});"


register(
    OpRecord("conv2d", _conv, lambda i, o, a: 2 * numel(o[0]) * math.prod(i[1].shape[1:]), float_only=True,
             act_epilogue=True,
             grad=_conv2d_grad, partial=frozenset({1}),
             torch=lambda i, a: _torch_act(F.conv2d(i[0], i[1], i[2], a["stride"], a["padding"], a["dilation"],
                                                    a["groups"]), a),
             cpu=_conv_cpu),
    bwd("conv2d_bwd_input", lambda i, a: [(tuple(a["x_shape"]), "f32")],
        lambda i, o, a: 2 * numel(i[0]) * math.prod(i[1].shape[1:]), cpu=_conv_bi_cpu),
    bwd("conv2d_bwd_weight", lambda i, a: [((a["w_shape"][0], a["k"], a["w_shape"][2], a["w_shape"][3]), "f32")],
        lambda i, o, a: 2 * numel(i[0]) * a["k"] * a["w_shape"][2] * a["w_shape"][3], cpu=_conv_bw_cpu),
    bwd("conv2d_bwd_bias", lambda i, a: [((i[0].shape[1],), "f32")], lambda i, o, a: numel(i[0]),
        cpu=_conv_bb_cpu),
)


# ---- pooling -------------------------------------------------------------------------------
def _pool(i, a):
    n, c, h, w = i[0].shape
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    oh = pool_out(h, kh, sh, ph, dh, a["ceil_mode"])
    ow = pool_out(w, kw, sw, pw, dw, a["ceil_mode"])
    return [((n, c, oh, ow), "f32")]


def pool_params(x_shape, y_shape, a) -> str:
    N, C, H, W = x_shape
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    return (f"{{{N}, {C}, {H}, {W}, {y_shape[2]}, {y_shape[3]}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, "
            f"{b(a.get('count_include_pad', True))}, {a.get('divisor_override', 0)}}}")


def _avg_pool_torch(x, a):
    return F.avg_pool2d(x, a["kernel"], a["stride"], a["padding"], a["ceil_mode"],
                        a.get("count_include_pad", True), a.get("divisor_override") or None)


def _max_pool_cpu(e, n, x, y, idx):
    return f"pk::max_pool2d_fwd({x}, {y}, {idx}, {pool_params(n.inputs[0].shape, n.outputs[0].shape, n.attrs)});"


def _max_pool_bwd_cpu(e, n, dy, idx, dx):
    return f"pk::max_pool2d_bwd({dy}, {idx}, {dx}, {pool_params(n.attrs['x_shape'], n.inputs[0].shape, n.attrs)});"


def _avg_pool_cpu(e, n, x, y):
    return f"pk::avg_pool2d_fwd({x}, {y}, {pool_params(n.inputs[0].shape, n.outputs[0].shape, n.attrs)});"


def _avg_pool_bwd_cpu(e, n, dy, dx):
    return f"pk::avg_pool2d_bwd({dy}, {dx}, {pool_params(n.attrs['x_shape'], n.inputs[0].shape, n.attrs)});"


def _adaptive_cpu(e, n, x, y):
    N, C, H, W = n.inputs[0].shape
    OH, OW = n.attrs["output_size"]
    return f"pk::adaptive_avg_pool2d_fwd({x}, {y}, {N}, {C}, {H}, {W}, {OH}, {OW});"


def _adaptive_bwd_cpu(e, n, dy, dx):
    N, C, H, W = n.attrs["x_shape"]
    OH, OW = n.inputs[0].shape[2:]
    return f"pk::adaptive_avg_pool2d_bwd({dy}, {dx}, {N}, {C}, {H}, {W}, {OH}, {OW});"


register(
    OpRecord("max_pool2d", lambda i, a: _pool(i, a) + [(_pool(i, a)[0][0], "i32")],
             lambda i, o, a: numel(o[0]) * a["kernel"][0] * a["kernel"][1], float_only=True,
             grad=lambda b, n, g, need: [b.add("max_pool2d_bwd", [g[0], n.outputs[1]],
                                               n.attrs | {"x_shape": n.inputs[0].shape})],
             torch=lambda i, a: F.max_pool2d(i[0], a["kernel"], a["stride"], a["padding"], a.get("dilation", 1),
                                             a["ceil_mode"]),
             cpu=_max_pool_cpu),
    bwd("max_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")], lambda i, o, a: numel(i[0]),
        cpu=_max_pool_bwd_cpu),
    OpRecord("avg_pool2d", _pool, lambda i, o, a: numel(o[0]) * a["kernel"][0] * a["kernel"][1], float_only=True,
             grad=lambda b, n, g, need: [b.add("avg_pool2d_bwd", [g[0]], n.attrs | {"x_shape": n.inputs[0].shape})],
             torch=lambda i, a: _avg_pool_torch(i[0], a), cpu=_avg_pool_cpu),
    bwd("avg_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")],
        lambda i, o, a: numel(i[0]) * a["kernel"][0] * a["kernel"][1], cpu=_avg_pool_bwd_cpu),
    OpRecord("adaptive_avg_pool2d", lambda i, a: [(i[0].shape[:2] + tuple(a["output_size"]), "f32")],
             lambda i, o, a: numel(i[0]),
             grad=lambda b, n, g, need: [b.add("adaptive_avg_pool2d_bwd", [g[0]], {"x_shape": n.inputs[0].shape})],
             torch=lambda i, a: F.adaptive_avg_pool2d(i[0], a["output_size"]), cpu=_adaptive_cpu),
    bwd("adaptive_avg_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")], lambda i, o, a: numel(o[0]),
        cpu=_adaptive_bwd_cpu),
)
