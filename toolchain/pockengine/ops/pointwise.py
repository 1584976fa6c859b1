"""Pointwise ops: activations and their backward ops, unary maths, scalar ops, broadcast
binary ops, where/compare/cast, cos/sin, cumsum and the SwiGLU gate."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cpp import CTYPE, _fit, _n, _odi, arr, b, bcast_strides, fl
from .record import OpRecord, bwd, register
from .shape import broadcast_shapes, ew as _ew, numel, same as _same


# ---- activations -----------------------------------------------------------------------
def _uses_output(bwd_op):
    return lambda b, n, g, need: [b.add(bwd_op, [g[0], n.outputs[0]], n.attrs)]


def _uses_input(bwd_op):
    return lambda b, n, g, need: [b.add(bwd_op, [g[0], n.inputs[0]], n.attrs)]


def _clamp_torch(x, a):
    lo, hi = a["lo"], a["hi"]
    if lo == 0.0 and hi == 6.0:
        return F.hardtanh(x, 0.0, 6.0)
    return torch.clamp(x, None if math.isinf(lo) else lo, None if math.isinf(hi) else hi)


def _kernel_fwd(op):
    return lambda e, n, x, y: f"pk::{op}_fwd({x}, {y}, {_n(n.inputs[0])});"


def _kernel_bwd(op):
    return lambda e, n, dy, v, dx: f"pk::{op}_bwd({dy}, {v}, {dx}, {_n(n.inputs[0])});"


# hardtanh reads its output too: for y = clamp(x, lo, hi), lo < y < hi exactly when lo < x < hi,
# so a fused conv/BN + ReLU6 never needs the pre-activation
_ACTIVATIONS = {  # op: (gradient rule, torch reference, CPU call of the forward, CPU call of the backward)
    "relu": (_uses_output("relu_bwd"), lambda i, a: F.relu(i[0]), _kernel_fwd("relu"), _kernel_bwd("relu")),
    "sigmoid": (_uses_output("sigmoid_bwd"), lambda i, a: torch.sigmoid(i[0]), _kernel_fwd("sigmoid"),
                _kernel_bwd("sigmoid")),
    "tanh": (_uses_output("tanh_bwd"), lambda i, a: torch.tanh(i[0]), _kernel_fwd("tanh"), _kernel_bwd("tanh")),
    "silu": (_uses_input("silu_bwd"), lambda i, a: F.silu(i[0]), _kernel_fwd("silu"), _kernel_bwd("silu")),
    "gelu": (_uses_input("gelu_bwd"),
             lambda i, a: F.gelu(i[0], approximate="tanh" if a.get("approximate") else "none"),
             lambda e, n, x, y: f"pk::gelu_fwd({x}, {y}, {_n(n.inputs[0])}, {b(n.attrs['approximate'])});",
             lambda e, n, dy, x, dx:
                 f"pk::gelu_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, {b(n.attrs['approximate'])});"),
    "hardtanh": (_uses_output("hardtanh_bwd"), lambda i, a: _clamp_torch(i[0], a),
                 lambda e, n, x, y:
                     f"pk::hardtanh_fwd({x}, {y}, {_n(n.inputs[0])}, {fl(n.attrs['lo'])}, {fl(n.attrs['hi'])});",
                 lambda e, n, dy, x, dx: f"pk::hardtanh_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, "
                                         f"{fl(n.attrs['lo'])}, {fl(n.attrs['hi'])});"),
}
for _name, (_grad, _torch, _fwd, _bwd) in _ACTIVATIONS.items():
    register(OpRecord(_name, _same, _ew, inplace=(0,), float_only=True, grad=_grad, torch=_torch, cpu=_fwd),
             bwd(f"{_name}_bwd", _same, _ew, inplace=(0, 1), cpu=_bwd))


# ---- unary maths -------------------------------------------------------------------------
def _unary_cpu(en):
    return lambda e, n, x, y: f"pk::unary(pk::Unary::{en}, {x}, {y}, {_n(n.inputs[0])});"


_UNARY = {  # op: (float only, gradient rule, torch reference, pk::Unary enum)
    "exp": (True, lambda b, n, g, need: [b.add("mul", [g[0], n.outputs[0]])], lambda i, a: torch.exp(i[0]), "Exp"),
    "log": (True, lambda b, n, g, need: [b.add("div", [g[0], n.inputs[0]])], lambda i, a: torch.log(i[0]), "Log"),
    "sqrt": (True, lambda b, n, g, need: [b.add("mul_scalar", [b.add("div", [g[0], n.outputs[0]])], {"c": 0.5})],
             lambda i, a: torch.sqrt(i[0]), "Sqrt"),
    "rsqrt": (True, lambda b, n, g, need: [b.add("pow_scalar_bwd", [g[0], n.inputs[0]], {"e": -0.5})],
              lambda i, a: torch.rsqrt(i[0]), "Rsqrt"),
    "neg": (False, lambda b, n, g, need: [b.add("neg", [g[0]])], lambda i, a: -i[0], "Neg"),
    # d|x| = sign(x): x / (|x| + 1e-30) is exactly +-1 for any normal float32 and 0 at 0, as torch.sign
    "abs": (False, lambda b, n, g, need: [
        b.add("mul", [g[0], b.add("div", [n.inputs[0], b.add("add_scalar", [n.outputs[0]], {"c": 1e-30})])])],
        lambda i, a: torch.abs(i[0]), "Abs"),
    "reciprocal": (True, lambda b, n, g, need: [
        b.add("neg", [b.add("mul", [g[0], b.add("mul", [n.outputs[0], n.outputs[0]])])])],
        lambda i, a: torch.reciprocal(i[0]), "Reciprocal"),
}
for _name, (_float, _grad, _torch, _enum) in _UNARY.items():
    register(OpRecord(_name, _same, _ew, inplace=(0,), float_only=_float, grad=_grad, torch=_torch,
                      cpu=_unary_cpu(_enum)))


# ---- scalar ops ------------------------------------------------------------------------------
def _scalar_cpu(e, n, x, y):
    c = n.attrs.get("c", n.attrs.get("e"))
    if n.inputs[0].dtype != "f32":  # integer bookkeeping, e.g. num_batches_tracked += 1
        expr = {"add_scalar": f"x[i] + {int(c)}", "mul_scalar": f"x[i] * {int(c)}",
                "rsub_scalar": f"{int(c)} - x[i]"}[n.op]
        t = CTYPE[n.inputs[0].dtype]
        return (f"{{ const {t}* x = {x}; {t}* y = {y}; "
                f"for (int64_t i = 0; i < {_n(n.inputs[0])}; ++i) y[i] = {expr}; }}")
    return f"pk::{n.op}({x}, {y}, {_n(n.inputs[0])}, {fl(c)});"


register(
    OpRecord("add_scalar", _same, _ew, inplace=(0,), grad=lambda b, n, g, need: [g[0]],
             torch=lambda i, a: i[0] + a["c"], cpu=_scalar_cpu),
    OpRecord("mul_scalar", _same, _ew, inplace=(0,), grad=lambda b, n, g, need: [b.add("mul_scalar", [g[0]], n.attrs)],
             torch=lambda i, a: i[0] * a["c"], cpu=_scalar_cpu),
    OpRecord("rsub_scalar", _same, _ew, inplace=(0,), grad=lambda b, n, g, need: [b.add("neg", [g[0]])],
             torch=lambda i, a: a["c"] - i[0], cpu=_scalar_cpu),
    OpRecord("pow_scalar", _same, _ew, inplace=(0,), grad=_uses_input("pow_scalar_bwd"),
             torch=lambda i, a: torch.pow(i[0], a["e"]), cpu=_scalar_cpu),
    bwd("pow_scalar_bwd", _same, _ew, inplace=(0, 1),
        cpu=lambda e, n, dy, x, dx: f"pk::pow_scalar_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, {fl(n.attrs['e'])});"),
)


# ---- broadcast binary ops ------------------------------------------------------------------------
def _binary(i, a):
    return [(broadcast_shapes(i[0].shape, i[1].shape), i[0].dtype)]


def _add_sub_grad(b, n, g, need):
    a, c = n.inputs
    da = b.sum_to(g[0], a.shape) if need[0] else None
    dc = None
    if need[1]:
        dc = b.sum_to(g[0], c.shape)
        dc = b.add("neg", [dc]) if n.op == "sub" else dc
    return [da, dc]


def _mul_grad(b, n, g, need):
    a, c = n.inputs
    da = b.sum_to(b.add("mul", [g[0], c]), a.shape) if need[0] else None
    dc = b.sum_to(b.add("mul", [g[0], a]), c.shape) if need[1] else None
    return [da, dc]


def _div_grad(b, n, g, need):
    a, c = n.inputs
    ga = b.add("div", [g[0], c])
    da = b.sum_to(ga, a.shape) if need[0] else None
    dc = b.add("neg", [b.sum_to(b.add("mul", [ga, n.outputs[0]]), c.shape)]) if need[1] else None
    return [da, dc]


def _binary_cpu(e, n, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (sa, sc) = _fit(out, bcast_strides(n.inputs[0].shape, out), bcast_strides(n.inputs[1].shape, out))
    op = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}[n.op]
    if n.inputs[0].dtype != "f32":  # integer bookkeeping (position ids from masks)
        return (f"pk::ibinary<{CTYPE[n.inputs[0].dtype]}>(pk::Binary::{op}, {a}, {c}, {y}, "
                f"{{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});")
    return f"pk::binary(pk::Binary::{op}, {a}, {c}, {y}, {{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});"


register(
    OpRecord("add", _binary, _ew, inplace=(0, 1), grad=_add_sub_grad, torch=lambda i, a: i[0] + i[1],
             cpu=_binary_cpu),
    OpRecord("sub", _binary, _ew, inplace=(0, 1), grad=_add_sub_grad, torch=lambda i, a: i[0] - i[1],
             cpu=_binary_cpu),
    OpRecord("mul", _binary, _ew, inplace=(0, 1), grad=_mul_grad, torch=lambda i, a: i[0] * i[1], cpu=_binary_cpu),
    OpRecord("div", _binary, _ew, inplace=(0, 1), grad=_div_grad, torch=lambda i, a: i[0] / i[1], cpu=_binary_cpu),
)


# ---- where, compare, cast --------------------------------------------------------------------------
def _where_grad(b, n, g, need):
    cond, a, c = n.inputs
    zero = b.add("full", [], {"shape": (), "value": 0.0, "dtype": "f32"})
    da = b.sum_to(b.add("where", [cond, g[0], zero]), a.shape) if need[1] else None
    dc = b.sum_to(b.add("where", [cond, zero, g[0]]), c.shape) if need[2] else None
    return [None, da, dc]


def _where_cpu(e, n, cond, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (s0, s1, s2) = _fit(out, *(bcast_strides(v.shape, out) for v in n.inputs))
    return f"pk::where({cond}, {a}, {c}, {y}, {{{nd}, {arr(shape)}, {arr(s0)}, {arr(s1)}, {arr(s2)}}});"


def _compare_cpu(e, n, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (sa, sc) = _fit(out, bcast_strides(n.inputs[0].shape, out), bcast_strides(n.inputs[1].shape, out))
    op = n.attrs["cmp"].capitalize()
    return (f"pk::compare<{CTYPE[n.inputs[0].dtype]}>(pk::Compare::{op}, {a}, {c}, {y}, "
            f"{{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});")


def _cast_cpu(e, n, x, y):
    return f"pk::cast<{CTYPE[n.inputs[0].dtype]}, {CTYPE[n.outputs[0].dtype]}>({x}, {y}, {_n(n.inputs[0])});"


register(
    OpRecord("where", lambda i, a: [(broadcast_shapes(i[0].shape, i[1].shape, i[2].shape), "f32")], _ew,
             grad=_where_grad, torch=lambda i, a: torch.where(i[0].bool(), i[1], i[2]), cpu=_where_cpu),
    OpRecord("compare", lambda i, a: [(broadcast_shapes(i[0].shape, i[1].shape), "u8")], _ew,
             grad=lambda b, n, g, need: [None, None],  # a boolean result carries no gradient
             cpu=_compare_cpu),
    OpRecord("cast", lambda i, a: [(i[0].shape, a["dtype"])], _ew,
             grad=lambda b, n, g, need: [None],  # only integer/boolean casts are emitted
             cpu=_cast_cpu),
)


# ---- cos, sin, cumsum ------------------------------------------------------------------------------
register(
    OpRecord("cos", _same, lambda i, o, a: 8 * numel(o[0]),
             grad=lambda b, n, g, need: [b.add("neg", [b.add("mul", [g[0], b.add("sin", [n.inputs[0]])])])],
             cpu=lambda e, n, x, y: f"pk::trig(pk::Trig::Cos, {x}, {y}, {_n(n.inputs[0])});"),
    OpRecord("sin", _same, lambda i, o, a: 8 * numel(o[0]),
             grad=lambda b, n, g, need: [b.add("mul", [g[0], b.add("cos", [n.inputs[0]])])],
             cpu=lambda e, n, x, y: f"pk::trig(pk::Trig::Sin, {x}, {y}, {_n(n.inputs[0])});"),
    OpRecord("cumsum", lambda i, a: [(i[0].shape, "f32" if i[0].dtype == "f32" else "i64")], _ew,
             grad=lambda b, n, g, need: [  # d(prefix sums) = suffix sums of the gradient
                 b.add("cumsum", [g[0]], {"dim": n.attrs["dim"], "reverse": not n.attrs.get("reverse", False)})],
             cpu=lambda e, n, x, y: (
                 f"pk::cumsum<{CTYPE[n.inputs[0].dtype]}, {CTYPE[n.outputs[0].dtype]}>({x}, {y}, "
                 f"{_odi(n.inputs[0], n.attrs['dim'])}, {b(n.attrs.get('reverse', False))});")),
)


# ---- swiglu -------------------------------------------------------------------------------------------
def _swiglu_grad(b, n, g, need):
    gate, up = n.inputs
    return b.add("swiglu_bwd", [g[0], gate, up], {}, wanted=[bool(need[0]), bool(need[1])])


register(
    OpRecord("swiglu", lambda i, a: [(i[0].shape, "f32")], lambda i, o, a: 6 * numel(i[0]), grad=_swiglu_grad,
             cpu=lambda e, n, gate, up, y: f"pk::swiglu_fwd({gate}, {up}, {y}, {_n(n.inputs[0])});"),
    bwd("swiglu_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32")], lambda i, o, a: 10 * numel(i[0]),
        cpu=lambda e, n, dy, gate, up, dgate, dup:
            f"pk::swiglu_bwd({dy}, {gate}, {up}, {dgate}, {dup}, {_n(n.inputs[1])});"),
)
