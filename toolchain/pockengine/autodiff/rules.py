"""The gradient rules: one table, op -> rule(b, node, gouts, need) -> one
gradient (or None) per input.

`gouts[i]` is the gradient flowing into output i (None: nothing flows).
`need[i]` is None (input i needs no gradient), FULL, or an int k: only the
first k slices along dim 1 of that parameter are trained (sparse update), so
the rule returns a gradient of shape (shape[0], k, *shape[2:]). Only the ops
listed in PARTIAL handle k themselves (computing just that slice and saving
just the slice of the activation it needs); for every other op the driver
asks for FULL and slices the result.
"""
from __future__ import annotations

import math

FULL = "full"
RULES: dict = {}
PARTIAL = {"linear": {1}, "conv2d": {1}, "embedding": {0}, "lstm": {3, 4, 7}, "gru": {2, 3}}


def rule(*ops):
    def deco(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


def _k(need, full_size):
    return full_size if need is FULL else need


# ---- dense layers ------------------------------------------------------------
@rule("linear")
def _linear(b, n, g, need):
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


@rule("matmul")
def _matmul(b, n, g, need):
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


def _conv_attrs(n):
    return {k: n.attrs[k] for k in ("stride", "padding", "dilation", "groups")}


@rule("conv2d")
def _conv2d(b, n, g, need):
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


@rule("embedding")
def _embedding(b, n, g, need):
    w, idx = n.inputs
    k = _k(need[0], w.shape[1])
    return [b.add("embedding_bwd", [g[0], idx], {"num_weights": w.shape[0], "k": k,
                                                  "padding_idx": n.attrs["padding_idx"]}), None]


# ---- normalisation ----------------------------------------------------------------
@rule("layer_norm")
def _layer_norm(b, n, g, need):
    x, w, bias = n.inputs
    y, mean, rstd = n.outputs
    w_shape = x.shape[len(x.shape) - n.attrs["normalized_ndim"]:]
    return b.add("layer_norm_bwd", [g[0], x, mean, rstd, w], {"w_shape": w_shape},
                 wanted=[bool(need[0]), bool(need[1]), bool(need[2])])


@rule("rms_norm")
def _rms_norm(b, n, g, need):
    x, w = n.inputs
    return b.add("rms_norm_bwd", [g[0], x, n.outputs[1], w], {}, wanted=[bool(need[0]), bool(need[1])])


@rule("swiglu")
def _swiglu(b, n, g, need):
    gate, up = n.inputs
    return b.add("swiglu_bwd", [g[0], gate, up], {}, wanted=[bool(need[0]), bool(need[1])])


@rule("batch_norm_train")
def _bn_train(b, n, g, need):
    x, w = n.inputs[:2]
    _, mean, invstd = n.outputs[:3]
    dx, dw, db = b.add("batch_norm_train_bwd", [g[0], x, mean, invstd, w], {},
                       wanted=[bool(need[0]), bool(need[1]), bool(need[2])])
    return [dx, dw, db, None, None]


@rule("batch_norm_eval")
def _bn_eval(b, n, g, need):
    x, w, _, rm, rv = n.inputs
    dx, dw, db = b.add("batch_norm_eval_bwd", [g[0], x, rm, rv, w], {"eps": n.attrs["eps"]},
                       wanted=[bool(need[0]), bool(need[1]), bool(need[2])])
    return [dx, dw, db, None, None]


# ---- pooling ---------------------------------------------------------------------------
@rule("max_pool2d")
def _max_pool(b, n, g, need):
    return [b.add("max_pool2d_bwd", [g[0], n.outputs[1]], n.attrs | {"x_shape": n.inputs[0].shape})]


@rule("avg_pool2d")
def _avg_pool(b, n, g, need):
    return [b.add("avg_pool2d_bwd", [g[0]], n.attrs | {"x_shape": n.inputs[0].shape})]


@rule("adaptive_avg_pool2d")
def _adaptive(b, n, g, need):
    return [b.add("adaptive_avg_pool2d_bwd", [g[0]], {"x_shape": n.inputs[0].shape})]


# ---- pointwise ----------------------------------------------------------------------------
def _uses_output(bwd_op):
    return lambda b, n, g, need: [b.add(bwd_op, [g[0], n.outputs[0]], n.attrs)]


def _uses_input(bwd_op):
    return lambda b, n, g, need: [b.add(bwd_op, [g[0], n.inputs[0]], n.attrs)]


# hardtanh reads its output too: for y = clamp(x, lo, hi), lo < y < hi exactly when lo < x < hi,
# so a fused conv/BN + ReLU6 never needs the pre-activation
for _op in ("relu", "sigmoid", "tanh", "hardtanh"):
    RULES[_op] = _uses_output(f"{_op}_bwd")
for _op in ("silu", "gelu", "pow_scalar"):
    RULES[_op] = _uses_input(f"{_op}_bwd")
RULES["exp"] = lambda b, n, g, need: [b.add("mul", [g[0], n.outputs[0]])]
RULES["log"] = lambda b, n, g, need: [b.add("div", [g[0], n.inputs[0]])]
RULES["sqrt"] = lambda b, n, g, need: [b.add("mul_scalar", [b.add("div", [g[0], n.outputs[0]])], {"c": 0.5})]
RULES["rsqrt"] = lambda b, n, g, need: [b.add("pow_scalar_bwd", [g[0], n.inputs[0]], {"e": -0.5})]
RULES["neg"] = lambda b, n, g, need: [b.add("neg", [g[0]])]
# d|x| = sign(x): x / (|x| + 1e-30) is exactly +-1 for any normal float32 and 0 at 0, as torch.sign
RULES["abs"] = lambda b, n, g, need: [
    b.add("mul", [g[0], b.add("div", [n.inputs[0], b.add("add_scalar", [n.outputs[0]], {"c": 1e-30})])])]
RULES["reciprocal"] = lambda b, n, g, need: [
    b.add("neg", [b.add("mul", [g[0], b.add("mul", [n.outputs[0], n.outputs[0]])])])]
RULES["add_scalar"] = lambda b, n, g, need: [g[0]]
RULES["mul_scalar"] = lambda b, n, g, need: [b.add("mul_scalar", [g[0]], n.attrs)]
RULES["rsub_scalar"] = lambda b, n, g, need: [b.add("neg", [g[0]])]


@rule("add", "sub")
def _add_sub(b, n, g, need):
    a, c = n.inputs
    da = b.sum_to(g[0], a.shape) if need[0] else None
    dc = None
    if need[1]:
        dc = b.sum_to(g[0], c.shape)
        dc = b.add("neg", [dc]) if n.op == "sub" else dc
    return [da, dc]


@rule("mul")
def _mul(b, n, g, need):
    a, c = n.inputs
    da = b.sum_to(b.add("mul", [g[0], c]), a.shape) if need[0] else None
    dc = b.sum_to(b.add("mul", [g[0], a]), c.shape) if need[1] else None
    return [da, dc]


@rule("div")
def _div(b, n, g, need):
    a, c = n.inputs
    ga = b.add("div", [g[0], c])
    da = b.sum_to(ga, a.shape) if need[0] else None
    dc = b.add("neg", [b.sum_to(b.add("mul", [ga, n.outputs[0]]), c.shape)]) if need[1] else None
    return [da, dc]


RULES["compare"] = lambda b, n, g, need: [None, None]  # a boolean result carries no gradient
RULES["cast"] = lambda b, n, g, need: [None]  # only integer/boolean casts are emitted
RULES["cos"] = lambda b, n, g, need: [b.add("neg", [b.add("mul", [g[0], b.add("sin", [n.inputs[0]])])])]
RULES["sin"] = lambda b, n, g, need: [b.add("mul", [g[0], b.add("cos", [n.inputs[0]])])]
RULES["cumsum"] = lambda b, n, g, need: [  # d(prefix sums) = suffix sums of the gradient
    b.add("cumsum", [g[0]], {"dim": n.attrs["dim"], "reverse": not n.attrs.get("reverse", False)})]


@rule("where")
def _where(b, n, g, need):
    cond, a, c = n.inputs
    zero = b.add("full", [], {"shape": (), "value": 0.0, "dtype": "f32"})
    da = b.sum_to(b.add("where", [cond, g[0], zero]), a.shape) if need[1] else None
    dc = b.sum_to(b.add("where", [cond, zero, g[0]]), c.shape) if need[2] else None
    return [None, da, dc]


# ---- reductions and softmax --------------------------------------------------------------------
@rule("sum", "mean")
def _sum(b, n, g, need):
    x = n.inputs[0]
    dims = n.attrs["dims"]
    kept = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    gy = b.reshape(g[0], kept)
    if n.op == "mean":
        gy = b.add("mul_scalar", [gy], {"c": 1.0 / math.prod(x.shape[d] for d in dims)})
    return [b.expand(gy, x.shape)]


RULES["sum_to"] = lambda b, n, g, need: [b.expand(b.reshape(g[0], _kept_shape(n)), n.inputs[0].shape)]


def _kept_shape(n):
    x, shape = n.inputs[0].shape, n.attrs["shape"]
    return (1,) * (len(x) - len(shape)) + tuple(shape)


RULES["softmax"] = _uses_output("softmax_bwd")
RULES["log_softmax"] = _uses_output("log_softmax_bwd")


@rule("sdpa")
def _sdpa(b, n, g, need):
    q, k, v, mask = n.inputs
    dmask = None
    if need[3]:  # a learned additive bias (Swin's relative positions): dS = P * (dP - rowsum(dP * P))
        probs = n.outputs[1]
        dp = b.add("matmul", [g[0], v], {"ta": False, "tb": True})
        ds = b.add("softmax_bwd", [dp, probs], {"dim": len(probs.shape) - 1})
        dmask = b.sum_to(ds, mask.shape)
    dq, dk, dv, _ = b.add("sdpa_bwd", [g[0], q, k, v, n.outputs[1], mask], n.attrs,
                          wanted=[bool(need[0]), bool(need[1]), bool(need[2]), True])
    return [dq, dk, dv, dmask]


# ---- layout ---------------------------------------------------------------------------------------
@rule("reshape")
def _reshape(b, n, g, need):
    if n.attrs.get("stop_gradient"):
        return [None]
    return [b.reshape(g[0], n.inputs[0].shape)]


@rule("permute")
def _permute(b, n, g, need):
    perm = n.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.add("permute", [g[0]], {"perm": inverse})]


RULES["expand"] = lambda b, n, g, need: [b.sum_to(g[0], n.inputs[0].shape)]
RULES["slice"] = lambda b, n, g, need: [b.add("slice_bwd", [g[0]], n.attrs | {"x_shape": n.inputs[0].shape})]
RULES["full"] = lambda b, n, g, need: []


@rule("cat")
def _cat(b, n, g, need):
    dim, start, grads = n.attrs["dim"], 0, []
    for x, nd in zip(n.inputs, need):
        size = x.shape[dim]
        grads.append(b.add("slice", [g[0]], {"dim": dim, "start": start, "end": start + size, "step": 1})
                     if nd else None)
        start += size
    return grads


# ---- recurrent layers ------------------------------------------------------------------------------
@rule("lstm")
def _lstm(b, n, g, need):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = n.inputs
    y, hn, cn, gates, cells, hraw = n.outputs
    attrs = n.attrs | {"k_ih": _k(need[3], w_ih.shape[1]) if need[3] else 0,
                       "k_hh": _k(need[4], w_hh.shape[1]) if need[4] else 0,
                       "k_hr": _k(need[7], w_hr.shape[1]) if need[7] else 0,
                       "has_bias": b_ih is not None}
    gy = g[0] if g[0] is not None else b.zeros(y.shape)
    outs = b.add("lstm_bwd", [gy, g[1], g[2], x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, hraw], attrs,
                 wanted=[bool(need[0]), bool(need[1]), bool(need[2]), bool(need[3]), bool(need[4]),
                         bool(need[5]), bool(need[6]), bool(need[7]), True])
    dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr, _ = outs
    return [dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr]


@rule("gru")
def _gru(b, n, g, need):
    x, h0, w_ih, w_hh, b_ih, b_hh = n.inputs
    y, hn, saved = n.outputs
    attrs = n.attrs | {"k_ih": _k(need[2], w_ih.shape[1]) if need[2] else 0,
                       "k_hh": _k(need[3], w_hh.shape[1]) if need[3] else 0,
                       "has_bias": b_ih is not None}
    gy = g[0] if g[0] is not None else b.zeros(y.shape)
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh, _ = b.add(
        "gru_bwd", [gy, g[1], x, h0, w_ih, w_hh, y, saved], attrs,
        wanted=[bool(need[0]), bool(need[1]), bool(need[2]), bool(need[3]), bool(need[4]), bool(need[5]), True])
    return [dx, dh0, dw_ih, dw_hh, db_ih, db_hh]


# ---- dropout and losses --------------------------------------------------------------------------------
RULES["dropout"] = lambda b, n, g, need: [b.add("dropout_bwd", [g[0], n.outputs[1]], n.attrs)]
RULES["cross_entropy"] = lambda b, n, g, need: [
    b.add("cross_entropy_bwd", [g[0], n.inputs[0], n.inputs[1]], n.attrs), None]
RULES["nll_loss"] = lambda b, n, g, need: [
    b.add("nll_loss_bwd", [g[0], n.inputs[1]], n.attrs | {"classes": n.inputs[0].shape[1]}), None]


@rule("mse_loss")
def _mse(b, n, g, need):
    return b.add("mse_loss_bwd", [g[0], n.inputs[0], n.inputs[1]], {}, wanted=[bool(need[0]), bool(need[1])])
