"""The op table: for every IR op, its output shapes/dtypes (shape inference),
its FLOPs, and which inputs it writes in place.

Inputs may be None for absent optional tensors (a missing bias); outputs may
be None when a node leaves an optional output out (a gradient not wanted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpDef:
    infer: Callable  # (inputs, attrs) -> [(shape, dtype), ...]
    flops: Callable = lambda ins, outs, a: 0
    mutates: tuple[int, ...] = ()
    view: bool = False  # output 0 aliases input 0 (no data movement)


OPS: dict[str, OpDef] = {}


def infer(op: str, inputs, attrs) -> list[tuple[tuple[int, ...], str]]:
    if op not in OPS:
        raise KeyError(f"unknown IR op '{op}'")
    return [(tuple(int(s) for s in shape), dtype) for shape, dtype in OPS[op].infer(inputs, attrs)]


def flops(node) -> int:
    return int(OPS[node.op].flops(node.inputs, node.outputs, node.attrs))


def _op(name, infer_fn, flops_fn=None, mutates=(), view=False):
    OPS[name] = OpDef(infer_fn, flops_fn or (lambda i, o, a: 0), mutates, view)


def numel(v) -> int:
    return 0 if v is None else math.prod(v.shape)


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    out = []
    for d in range(nd):
        sizes = {s[d - nd + len(s)] for s in shapes if d - nd + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def pool_out(size, k, s, p, d, ceil_mode) -> int:
    """PyTorch's pooling output size."""
    eff = size + 2 * p - d * (k - 1) - 1
    out = (eff + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def conv_out(size, k, s, p, d) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _same(i, a):
    return [(i[0].shape, i[0].dtype)]


def _ew(i, o, a):
    return numel(o[0])


# ---- dense layers ---------------------------------------------------------
def _linear(i, a):
    x, w = i[0], i[1]
    return [(x.shape[:-1] + (w.shape[0],), "f32")]


_op("linear", _linear, lambda i, o, a: 2 * numel(o[0]) * i[1].shape[1])
_op("linear_bwd_input", lambda i, a: [(tuple(a["x_shape"]), "f32")],
    lambda i, o, a: 2 * numel(o[0]) * i[1].shape[0])
_op("linear_bwd_weight", lambda i, a: [((i[0].shape[-1], a["k"]), "f32")],
    lambda i, o, a: 2 * numel(o[0]) * (numel(i[0]) // i[0].shape[-1]))
_op("bias_bwd", lambda i, a: [((i[0].shape[-1],), "f32")], lambda i, o, a: numel(i[0]))


def _matmul(i, a):
    A, B = i[0].shape, i[1].shape
    m, k = (A[-1], A[-2]) if a.get("ta") else (A[-2], A[-1])
    k2, n = (B[-1], B[-2]) if a.get("tb") else (B[-2], B[-1])
    if k != k2:
        raise ValueError(f"matmul inner dims differ: {A} @ {B}")
    return [(broadcast_shapes(A[:-2], B[:-2]) + (m, n), "f32")]


def _matmul_flops(i, o, a):
    A = i[0].shape
    return 2 * numel(o[0]) * (A[-2] if a.get("ta") else A[-1])


_op("matmul", _matmul, _matmul_flops)


def _conv(i, a):
    x, w = i[0].shape, i[1].shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return [((x[0], w[0], conv_out(x[2], w[2], sh, ph, dh), conv_out(x[3], w[3], sw, pw, dw)), "f32")]


_op("conv2d", _conv, lambda i, o, a: 2 * numel(o[0]) * math.prod(i[1].shape[1:]))
_op("conv2d_bwd_input", lambda i, a: [(tuple(a["x_shape"]), "f32")],
    lambda i, o, a: 2 * numel(i[0]) * math.prod(i[1].shape[1:]))
_op("conv2d_bwd_weight", lambda i, a: [((a["w_shape"][0], a["k"], a["w_shape"][2], a["w_shape"][3]), "f32")],
    lambda i, o, a: 2 * numel(i[0]) * a["k"] * a["w_shape"][2] * a["w_shape"][3])
_op("conv2d_bwd_bias", lambda i, a: [((i[0].shape[1],), "f32")], lambda i, o, a: numel(i[0]))

_op("embedding", lambda i, a: [(i[1].shape + (i[0].shape[1],), "f32")], _ew)
_op("embedding_bwd", lambda i, a: [((a["num_weights"], a["k"]), "f32")], lambda i, o, a: numel(i[0]))


# ---- normalisation --------------------------------------------------------
def _ln(i, a):
    x = i[0].shape
    rows = math.prod(x[: len(x) - a["normalized_ndim"]])
    return [(x, "f32"), ((rows,), "f32"), ((rows,), "f32")]


_op("layer_norm", _ln, lambda i, o, a: 8 * numel(i[0]))
_op("rms_norm", lambda i, a: [(i[0].shape, "f32"), ((math.prod(i[0].shape[:-1]),), "f32")],
    lambda i, o, a: 4 * numel(i[0]))
_op("rms_norm_bwd", lambda i, a: [(i[1].shape, "f32"), (i[1].shape[-1:], "f32")], lambda i, o, a: 8 * numel(i[0]))
_op("layer_norm_bwd", lambda i, a: [(i[1].shape, "f32"), (a["w_shape"], "f32"), (a["w_shape"], "f32")],
    lambda i, o, a: 10 * numel(i[0]))


def _bn_train(i, a):
    c = (i[0].shape[1],)
    return [(i[0].shape, "f32")] + [(c, "f32")] * 4


_op("batch_norm_train", _bn_train, lambda i, o, a: 8 * numel(i[0]))
_op("batch_norm_eval", _same, lambda i, o, a: 2 * numel(i[0]))
_op("batch_norm_train_bwd", lambda i, a: [(i[1].shape, "f32")] + [((i[1].shape[1],), "f32")] * 2,
    lambda i, o, a: 10 * numel(i[0]))
_op("batch_norm_eval_bwd", lambda i, a: [(i[1].shape, "f32")] + [((i[1].shape[1],), "f32")] * 2,
    lambda i, o, a: 4 * numel(i[0]))


# ---- pooling ----------------------------------------------------------------
def _pool(i, a):
    n, c, h, w = i[0].shape
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    oh = pool_out(h, kh, sh, ph, dh, a["ceil_mode"])
    ow = pool_out(w, kw, sw, pw, dw, a["ceil_mode"])
    return [((n, c, oh, ow), "f32")]


_op("max_pool2d", lambda i, a: _pool(i, a) + [(_pool(i, a)[0][0], "i32")],
    lambda i, o, a: numel(o[0]) * a["kernel"][0] * a["kernel"][1])
_op("max_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")], lambda i, o, a: numel(i[0]))
_op("avg_pool2d", _pool, lambda i, o, a: numel(o[0]) * a["kernel"][0] * a["kernel"][1])
_op("avg_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")],
    lambda i, o, a: numel(i[0]) * a["kernel"][0] * a["kernel"][1])
_op("adaptive_avg_pool2d", lambda i, a: [(i[0].shape[:2] + tuple(a["output_size"]), "f32")],
    lambda i, o, a: numel(i[0]))
_op("adaptive_avg_pool2d_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")], lambda i, o, a: numel(o[0]))

# ---- pointwise --------------------------------------------------------------
for _name in ("relu", "sigmoid", "tanh", "silu", "gelu", "hardtanh", "exp", "log", "sqrt", "rsqrt", "neg",
              "abs", "reciprocal", "add_scalar", "mul_scalar", "rsub_scalar", "pow_scalar"):
    _op(_name, _same, _ew)
for _name in ("relu_bwd", "sigmoid_bwd", "tanh_bwd", "silu_bwd", "gelu_bwd", "hardtanh_bwd", "pow_scalar_bwd"):
    _op(_name, _same, _ew)


def _binary(i, a):
    return [(broadcast_shapes(i[0].shape, i[1].shape), i[0].dtype)]


for _name in ("add", "sub", "mul", "div"):
    _op(_name, _binary, _ew)
_op("where", lambda i, a: [(broadcast_shapes(i[0].shape, i[1].shape, i[2].shape), "f32")], _ew)

_op("compare", lambda i, a: [(broadcast_shapes(i[0].shape, i[1].shape), "u8")], _ew)
_op("cast", lambda i, a: [(i[0].shape, a["dtype"])], _ew)
for _name in ("cos", "sin"):
    _op(_name, _same, lambda i, o, a: 8 * numel(o[0]))
_op("cumsum", lambda i, a: [(i[0].shape, "f32" if i[0].dtype == "f32" else "i64")], _ew)


# ---- reductions ---------------------------------------------------------------
def _reduce(i, a):
    x = i[0].shape
    dims = set(a["dims"])
    if a.get("keepdim"):
        return [(tuple(1 if d in dims else s for d, s in enumerate(x)), "f32")]
    return [(tuple(s for d, s in enumerate(x) if d not in dims), "f32")]


_op("sum", _reduce, lambda i, o, a: numel(i[0]))
_op("mean", _reduce, lambda i, o, a: numel(i[0]))
_op("sum_to", lambda i, a: [(tuple(a["shape"]), "f32")], lambda i, o, a: numel(i[0]))
_op("softmax", _same, lambda i, o, a: 5 * numel(i[0]))
_op("log_softmax", _same, lambda i, o, a: 5 * numel(i[0]))
_op("softmax_bwd", _same, lambda i, o, a: 4 * numel(i[0]))
_op("log_softmax_bwd", _same, lambda i, o, a: 4 * numel(i[0]))


# ---- attention ----------------------------------------------------------------
def _sdpa(i, a):
    q, k, v = i[0].shape, i[1].shape, i[2].shape
    return [(q[:-1] + (v[-1],), "f32"), (q[:-1] + (k[-2],), "f32")]


def _sdpa_flops(i, o, a):
    q, k, v = i[0].shape, i[1].shape, i[2].shape
    b = math.prod(q[:-2])
    return 2 * b * q[-2] * k[-2] * (q[-1] + v[-1]) + 5 * b * q[-2] * k[-2]


_op("sdpa", _sdpa, _sdpa_flops)
_op("sdpa_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32"), (i[3].shape, "f32"),
                              ((i[1].shape[-2] * i[2].shape[-2],), "f32")],
    lambda i, o, a: 2 * _sdpa_flops(i[1:4], o, a))

# ---- layout -----------------------------------------------------------------------
_op("reshape", lambda i, a: [(tuple(a["shape"]), i[0].dtype)], view=True)
_op("permute", lambda i, a: [(tuple(i[0].shape[p] for p in a["perm"]), i[0].dtype)])
_op("expand", lambda i, a: [(tuple(a["shape"]), i[0].dtype)])


def _slice(i, a):
    shape = list(i[0].shape)
    shape[a["dim"]] = len(range(a["start"], a["end"], a["step"]))
    return [(tuple(shape), i[0].dtype)]


_op("slice", _slice)
_op("slice_bwd", lambda i, a: [(tuple(a["x_shape"]), "f32")])


def _cat(i, a):
    shape = list(i[0].shape)
    shape[a["dim"]] = sum(v.shape[a["dim"]] for v in i)
    return [(tuple(shape), i[0].dtype)]


_op("cat", _cat)
_op("full", lambda i, a: [(tuple(a["shape"]), a.get("dtype", "f32"))])


# ---- recurrent layers ------------------------------------------------------------
def _lstm(i, a):
    x = i[0].shape
    b, t, h, p = x[0], x[1], a["hidden"], a["proj"]
    return [((b, t, p), "f32"), ((b, p), "f32"), ((b, h), "f32"), ((t, b, 4 * h), "f32"), ((t, b, h), "f32"),
            ((t, b, h), "f32")]


def _lstm_flops(i, o, a):
    b, t, n_in = i[0].shape
    h, p = a["hidden"], a["proj"]
    return 2 * b * t * (4 * h * (n_in + p) + (p * h if a["proj"] != h else 0)) + 10 * b * t * h


def _lstm_bwd(i, a):
    x = i[3].shape
    b, t, h, p = x[0], x[1], a["hidden"], a["proj"]
    return [(x, "f32"), ((b, p), "f32"), ((b, h), "f32"), ((4 * h, a["k_ih"]), "f32"),
            ((4 * h, a["k_hh"]), "f32"), ((4 * h,), "f32"), ((4 * h,), "f32"), ((p, a["k_hr"]), "f32"),
            ((t * b * 4 * h + b * h + (t * b * p + b * h if p != h else b * p),), "f32")]  # lstm_bwd_scratch_floats


def _lstm_bwd_flops(i, o, a):
    """What the kernel computes: backpropagation through time (always: dh through W_hh and,
    with a projection, W_hr; the gate math), plus dx and each weight gradient's [:, :k] only
    when wanted (o[0] absent: no dx; k_* = 0: no weight gradient)."""
    b, t, n_in = i[3].shape
    h, p, g = a["hidden"], a["proj"], 4 * a["hidden"]
    bt = b * t
    total = 2 * bt * g * p + (2 * bt * p * h if p != h else 0) + 12 * bt * h
    total += 2 * bt * g * n_in if o[0] is not None else 0
    total += 2 * bt * g * (a["k_ih"] + a["k_hh"]) + 2 * bt * p * a["k_hr"]
    return total


_op("lstm", _lstm, _lstm_flops)
_op("lstm_bwd", _lstm_bwd, _lstm_bwd_flops)


def _gru(i, a):
    b, t, _ = i[0].shape
    h = a["hidden"]
    return [((b, t, h), "f32"), ((b, h), "f32"), ((t, b, 4 * h), "f32")]


def _gru_flops(i, o, a):
    b, t, n_in = i[0].shape
    return 2 * b * t * 3 * a["hidden"] * (n_in + a["hidden"]) + 10 * b * t * a["hidden"]


def _gru_bwd(i, a):
    x = i[2].shape
    b, t, h = x[0], x[1], a["hidden"]
    return [(x, "f32"), ((b, h), "f32"), ((3 * h, a["k_ih"]), "f32"), ((3 * h, a["k_hh"]), "f32"),
            ((3 * h,), "f32"), ((3 * h,), "f32"), ((t * b * 4 * h + b * h,), "f32")]  # gru_bwd_scratch_floats


_op("gru", _gru, _gru_flops)
_op("gru_bwd", _gru_bwd, lambda i, o, a: 2 * _gru_flops(i[2:3], o, a))

# ---- dropout and losses --------------------------------------------------------------
_op("dropout", lambda i, a: [(i[0].shape, "f32"), (i[0].shape, "u8")], _ew)
_op("dropout_bwd", lambda i, a: [(i[0].shape, "f32")], _ew)
_op("cross_entropy", lambda i, a: [((), "f32")], lambda i, o, a: 5 * numel(i[0]))
_op("cross_entropy_bwd", lambda i, a: [(i[1].shape, "f32")], lambda i, o, a: 5 * numel(i[1]))
_op("nll_loss", lambda i, a: [((), "f32")], lambda i, o, a: i[0].shape[0])
_op("nll_loss_bwd", lambda i, a: [((i[1].shape[0], a["classes"]), "f32")], lambda i, o, a: numel(o[0]))
_op("mse_loss", lambda i, a: [((), "f32")], lambda i, o, a: 3 * numel(i[0]))
_op("mse_loss_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32")], lambda i, o, a: 3 * numel(i[1]))

# ---- in place -----------------------------------------------------------------------------
# The inputs an op may overwrite with its first output (same shape, dtype and element order;
# output element i depends only on input element i, or, for cross_entropy_bwd, on a row
# the kernel reads completely before writing it). The memory planner uses this when such an
# input dies at the node.
INPLACE: dict[str, tuple[int, ...]] = {
    **{op: (0,) for op in ("relu", "sigmoid", "tanh", "silu", "gelu", "hardtanh", "exp", "log", "sqrt", "rsqrt",
                           "neg", "abs", "reciprocal", "add_scalar", "mul_scalar", "rsub_scalar", "pow_scalar",
                           "dropout_bwd")},
    **{op: (0, 1) for op in ("relu_bwd", "sigmoid_bwd", "tanh_bwd", "silu_bwd", "gelu_bwd", "hardtanh_bwd",
                             "pow_scalar_bwd", "add", "sub", "mul", "div")},
    "cross_entropy_bwd": (1,),
}

# ---- state writes ----------------------------------------------------------------------
_op("assign", lambda i, a: [], lambda i, o, a: 0, mutates=(0,))
_op("sgd_update", lambda i, a: [], lambda i, o, a: 4 * numel(i[1]), mutates=(0, 2))
_op("adamw_update", lambda i, a: [], lambda i, o, a: 12 * numel(i[1]), mutates=(0, 2, 3))

# ---- data movement between backends ---------------------------------------------------------
# Inserted by the partitioner (passes/partition.py) after autodiff, so they need no gradient
# rule; the accelerator backend on either end emits them (backends/vulkan.py), never the CPU
# backend alone.
_op("transfer", lambda i, a: [(i[0].shape, i[0].dtype)], lambda i, o, a: 0)
_op("state_transfer", lambda i, a: [], lambda i, o, a: 0)
TRANSFER_OPS = ("transfer", "state_transfer")
