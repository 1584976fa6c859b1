"""Vulkan emitters for the convolutional ops (shaders conv2d.comp, batch_norm.comp,
pool.comp), forward and backward side by side, and the state bookkeeping a
BatchNorm step does (assign, int64 add_scalar).  Registered into
backends/vulkan_dispatch.py's EMITTERS table (backends/vulkan.py imports this module)."""
from __future__ import annotations

import math

from .vulkan_dispatch import NONE, WORDS, Dispatch, _f32, _n, copy_dispatch, emitter, fbits, grid, ibits, reduce_dispatch

ACT = {None: 0, "relu": 1, "relu6": 2}


# ---- conv2d: forward, input gradient, weight gradient, bias gradient ------------------------------
def conv_dispatch(mode, count, in0, in1, bias, out, x_shape, w_shape, y_shape, a, act=0, k=0, xc=0):
    N, C, H, W = x_shape
    O, _, KH, KW = w_shape
    OH, OW = y_shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    push = [mode, in0, in1, bias, out, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, a["groups"], act, k, xc]
    return Dispatch("conv2d", grid(count), push)


@emitter("conv2d")
def _conv(e, n):             # y = act(conv2d(x, w) + b)
    x, w, bias = n.inputs
    _f32(x, w, bias)
    y = n.outputs[0]
    return [conv_dispatch(0, _n(y), e.w(x), e.w(w), e.w(bias), e.w(y), x.shape, w.shape, y.shape, n.attrs,
                          act=ACT[n.attrs.get("act")])]


@emitter("conv2d_bwd_input")
def _conv_bi(e, n):          # dx = conv_transpose(dy, w)
    dy, w = n.inputs
    a = n.attrs
    return [conv_dispatch(1, math.prod(a["x_shape"]), e.w(dy), e.w(w), NONE, e.w(n.outputs[0]), a["x_shape"],
                          a["w_shape"], dy.shape, a)]


@emitter("conv2d_bwd_weight")
def _conv_bw(e, n):          # dw[O, k, KH, KW] = sum over n, oh, ow of dy * x (first k input channels per group)
    dy, xs = n.inputs
    a = n.attrs
    dw = n.outputs[0]
    return [conv_dispatch(2, _n(dw), e.w(dy), e.w(xs), NONE, e.w(dw), a["x_shape"], a["w_shape"], dy.shape, a,
                          k=a["k"], xc=xs.shape[1])]


@emitter("conv2d_bwd_bias")
def _conv_bb(e, n):          # db[O] = sum over N, OH, OW of dy
    dy = n.inputs[0]
    N, O = dy.shape[:2]
    return [reduce_dispatch(e.w(dy), e.w(n.outputs[0]), [N, O, math.prod(dy.shape[2:])], [True, False, True], 1.0)]


# ---- batch norm: one workgroup per channel --------------------------------------------------------
def bn_dispatch(mode, x, C, *, w=NONE, b=NONE, rm=NONE, rv=NONE, y=NONE, mean=NONE, invstd=NONE, nrm=NONE,
                nrv=NONE, momentum=0.0, eps=0.0, act=0, dy=NONE, dw=NONE, db=NONE, act_out=NONE, shape=()):
    if C > 65535:
        raise NotImplementedError("batch norm over more than 65535 channels")
    N, S = shape[0], math.prod(shape[2:])
    push = [mode, x, w, b, rm, rv, y, mean, invstd, nrm, nrv, N, C, S, fbits(momentum), fbits(eps), act, dy, dw, db,
            act_out]
    return Dispatch("batch_norm", (C, 1, 1), push)


@emitter("batch_norm_train")
def _bn_train(e, n):         # batch statistics, running-stat update, y = act((x - mean) invstd w + b)
    x, w, b, rm, rv = n.inputs
    _f32(x, w, b, rm, rv)
    y, mean, invstd, nrm, nrv = n.outputs
    a = n.attrs
    return [bn_dispatch(0, e.w(x), x.shape[1], w=e.w(w), b=e.w(b), rm=e.w(rm), rv=e.w(rv), y=e.w(y),
                        mean=e.w(mean), invstd=e.w(invstd), nrm=e.w(nrm), nrv=e.w(nrv), momentum=a["momentum"],
                        eps=a["eps"], act=ACT[a.get("act")], shape=x.shape)]


@emitter("batch_norm_train_bwd")
def _bn_train_bwd(e, n):     # dx, dw, db from the saved mean and invstd (dy through a fused relu/relu6)
    dy, x, mean, invstd, w, *act_out = n.inputs
    dx, dw, db = n.outputs
    return [bn_dispatch(1, e.w(x), x.shape[1], w=e.w(w), y=e.w(dx), mean=e.w(mean), invstd=e.w(invstd),
                        dy=e.w(dy), dw=e.w(dw), db=e.w(db), act=ACT[n.attrs.get("act")],
                        act_out=e.w(act_out[0]) if act_out else NONE, shape=x.shape)]


@emitter("batch_norm_eval")
def _bn_eval(e, n):          # y = act((x - rm) / sqrt(rv + eps) w + b)
    x, w, b, rm, rv = n.inputs
    _f32(x, w, b, rm, rv)
    return [bn_dispatch(2, e.w(x), x.shape[1], w=e.w(w), b=e.w(b), rm=e.w(rm), rv=e.w(rv), y=e.w(n.outputs[0]),
                        eps=n.attrs["eps"], act=ACT[n.attrs.get("act")], shape=x.shape)]


@emitter("batch_norm_eval_bwd")
def _bn_eval_bwd(e, n):      # the statistics are constants
    dy, x, rm, rv, w = n.inputs
    dx, dw, db = n.outputs
    return [bn_dispatch(3, e.w(x), x.shape[1], w=e.w(w), rm=e.w(rm), rv=e.w(rv), y=e.w(dx), dy=e.w(dy),
                        dw=e.w(dw), db=e.w(db), eps=n.attrs["eps"], shape=x.shape)]


# ---- pooling ----------------------------------------------------------------------------------------
def pool_dispatch(mode, count, in0, out, x_shape, y_shape, a=None, idx_in=NONE, idx_out=NONE):
    N, C, H, W = x_shape
    OH, OW = y_shape[2:]
    push = [mode, in0, idx_in, out, idx_out, N, C, H, W, OH, OW]
    if a is not None:
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
        dh, dw = a.get("dilation", (1, 1))
        push += [kh, kw, sh, sw, ph, pw, dh, dw, int(a.get("count_include_pad", True)),
                 ibits(a.get("divisor_override") or 0)]
    return Dispatch("pool", grid(count), push)


@emitter("max_pool2d")
def _max_pool(e, n):         # y = window max, idx = its flat h*W + w
    x = n.inputs[0]
    _f32(x)
    y, idx = n.outputs
    return [pool_dispatch(0, _n(y), e.w(x), e.w(y), x.shape, y.shape, n.attrs, idx_out=e.w(idx))]


@emitter("max_pool2d_bwd")
def _max_pool_bwd(e, n):     # dx[idx] += dy, gathered per input
    dy, idx = n.inputs
    a = n.attrs
    return [pool_dispatch(1, math.prod(a["x_shape"]), e.w(dy), e.w(n.outputs[0]), a["x_shape"], dy.shape, a,
                          idx_in=e.w(idx))]


@emitter("avg_pool2d")
def _avg_pool(e, n):
    x, y = n.inputs[0], n.outputs[0]
    _f32(x)
    return [pool_dispatch(2, _n(y), e.w(x), e.w(y), x.shape, y.shape, n.attrs)]


@emitter("avg_pool2d_bwd")
def _avg_pool_bwd(e, n):
    dy, a = n.inputs[0], n.attrs
    return [pool_dispatch(3, math.prod(a["x_shape"]), e.w(dy), e.w(n.outputs[0]), a["x_shape"], dy.shape, a)]


@emitter("adaptive_avg_pool2d")
def _adaptive(e, n):
    x, y = n.inputs[0], n.outputs[0]
    _f32(x)
    return [pool_dispatch(4, _n(y), e.w(x), e.w(y), x.shape, y.shape)]


@emitter("adaptive_avg_pool2d_bwd")
def _adaptive_bwd(e, n):
    dy, xs = n.inputs[0], n.attrs["x_shape"]
    return [pool_dispatch(5, math.prod(xs), e.w(dy), e.w(n.outputs[0]), xs, dy.shape)]


# ---- state bookkeeping: assign (running statistics), int64 counters -----------------------------------
@emitter("assign")
def _assign(e, n):           # state dst = src (the device's state mirror; copied back at the end of the step)
    dst, src = n.inputs
    if src.dtype not in WORDS or dst.dtype != src.dtype:
        raise NotImplementedError(f"no Vulkan assign for {src.dtype}")
    count = _n(src)
    return [copy_dispatch(src.dtype, e.w(src), e.w(dst), [count], [1], 0, [1], 0)]


def add_i64(e, n):           # y = x + c over int64 (num_batches_tracked += 1)
    x, y, c = n.inputs[0], n.outputs[0], int(n.attrs.get("c", 0))
    if not -2**31 <= c < 2**31:
        raise NotImplementedError("int64 add_scalar with a constant beyond 32 bits")
    return [Dispatch("copy", grid(_n(x)), [2, e.w(x), e.w(y), 1, _n(x)] + [1] * 5 + [0] * 14 + [2, ibits(c)])]
