"""CPU backend: one emitter per IR op, turning a node into a C++ call of the
kernel library (codegen/runtime/include/pock_kernels.h) at fixed offsets."""
from __future__ import annotations

import math

from ..ir.graph import Node, Value
from ..ir.ops import OPS, TRANSFER_OPS
from ..memory.plan import root_of

CTYPE = {"f32": "float", "i64": "int64_t", "i32": "int32_t", "u8": "uint8_t", "bf16": "uint16_t", "f16": "uint16_t",
         "i8": "int8_t", "q4": "uint8_t"}
MACRO = {"f32": "F32", "i64": "I64", "i32": "I32", "u8": "U8", "bf16": "BF16", "f16": "F16", "i8": "I8", "q4": "U8"}
def cstr(s: str) -> str:
    """s as a C string literal: printable ASCII as is, any other byte of its
    UTF-8 as an octal escape (never a trigraph: '?' is escaped too)."""
    out = []
    for byte in str(s).encode():
        ch = chr(byte)
        out.append("\\" + ch if ch in '"\\?' else ch if 32 <= byte < 127 else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


EMITTERS: dict = {}
# The non-finite guard in the generated step (a loss check before the backward pass,
# a gradient check before each update).  Always on for users; bench/guard_cost.py
# turns it off to measure what it costs.
NONFINITE_GUARD = True


def emitter(*ops):
    def deco(fn):
        for op in ops:
            EMITTERS[op] = fn
        return fn
    return deco


def fl(x: float) -> str:
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"{float(x)!r}f"


def b(x: bool) -> str:
    return "true" if x else "false"


def strides(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


class Emit:
    """Pointer expressions for the values of one plan: a named buffer (`namer(v)`, see
    codegen.BufferNames) when a namer is given, else the offset itself (F32(A, 128))."""

    def __init__(self, arena_offset, state_offset, namer=None):
        self.arena_offset = arena_offset  # Value -> int
        self.state_offset = state_offset  # name -> int
        self.namer = namer
        self.exact_skip = False  # the training step's guard mode (codegen.render sets it; see _update)

    def p(self, v: Value | None) -> str:
        if v is None:
            return "nullptr"
        if self.namer is not None:
            return self.namer(v)
        if v.in_state:
            return f"{MACRO[v.dtype]}(S, {self.state_offset[v.name]})"
        root = root_of(v)
        if root.in_state:  # a view of a state tensor (Conv1d's weight seen as 2-D)
            return f"{MACRO[v.dtype]}(S, {self.state_offset[root.name]})"
        return f"{MACRO[v.dtype]}(A, {self.arena_offset(v)})"

    def node(self, n: Node) -> list[str]:
        fn = EMITTERS.get(n.op)
        if fn is None:
            raise NotImplementedError(f"no CPU emitter for op '{n.op}'")
        out = fn(self, n, *[self.p(v) for v in n.inputs], *[self.p(o) for o in n.outputs])
        return [out] if isinstance(out, str) else list(out)


def _n(v) -> int:
    return math.prod(v.shape)


# ---- dense -------------------------------------------------------------------
ACT = {"relu": "pk::Act::Relu", "relu6": "pk::Act::Relu6"}


def _act(n: Node) -> tuple[str, str]:
    """(kernel name suffix, extra argument) for a node with a fused activation epilogue."""
    act = n.attrs.get("act")
    return ("_act", f", {ACT[act]}") if act else ("", "")


LOWP = {"bf16": "pk::LowpDtype::BF16", "f16": "pk::LowpDtype::F16", "i8": "pk::LowpDtype::I8",
        "q4": "pk::LowpDtype::Q4"}


def _lowp(e, w: Value) -> str:
    """'w, dtype, scale' for a frozen weight stored in low precision (passes/lowp.py)."""
    scale = f"F32(S, {e.state_offset[w.name + ':scale']})" if w.dtype in ("i8", "q4") else "nullptr"
    return f"{e.p(w)}, {LOWP[w.dtype]}, {scale}"


def _wshape(w: Value) -> tuple[int, int]:
    """(rows, columns) of a weight as the model sees it (q4 stores two columns a byte)."""
    rows, cols = w.shape
    return (rows, 2 * cols) if w.dtype == "q4" else (rows, cols)


@emitter("linear")
def _linear(e, n, x, w, bias, y):
    N, K = _wshape(n.inputs[1])
    if n.inputs[1].dtype in LOWP:
        act = ACT[n.attrs["act"]] if n.attrs.get("act") else "pk::Act::None"
        return (f"pk::linear_fwd_lowp({x}, {_lowp(e, n.inputs[1])}, {bias}, {y}, {_n(n.inputs[0]) // K}, {N}, "
                f"{K}, {act});")
    suffix, arg = _act(n)
    return f"pk::linear_fwd{suffix}({x}, {w}, {bias}, {y}, {_n(n.inputs[0]) // K}, {N}, {K}{arg});"


@emitter("linear_bwd_input")
def _linear_bi(e, n, dy, w, dx):
    N, K = _wshape(n.inputs[1])
    if n.inputs[1].dtype in LOWP:
        return f"pk::linear_bwd_input_lowp({dy}, {_lowp(e, n.inputs[1])}, {dx}, {_n(n.inputs[0]) // N}, {N}, {K});"
    return f"pk::linear_bwd_input({dy}, {w}, {dx}, {_n(n.inputs[0]) // N}, {N}, {K});"


@emitter("linear_bwd_weight")
def _linear_bw(e, n, dy, xs, dw):
    N = n.inputs[0].shape[-1]
    ldx = n.inputs[1].shape[-1]
    return f"pk::linear_bwd_weight({dy}, {xs}, {dw}, {_n(n.inputs[0]) // N}, {N}, {n.attrs['k']}, {ldx});"


@emitter("bias_bwd")
def _bias_bwd(e, n, dy, db):
    N = n.inputs[0].shape[-1]
    return f"pk::bias_bwd({dy}, {db}, {_n(n.inputs[0]) // N}, {N});"


@emitter("matmul")
def _matmul(e, n, a, bb, c):
    A, B, C = n.inputs[0].shape, n.inputs[1].shape, n.outputs[0].shape
    M, N = C[-2:]
    K = A[-2] if n.attrs.get("ta") else A[-1]
    batch = math.prod(C[:-2])
    sa = M * K if math.prod(A[:-2]) > 1 else 0
    sb = K * N if math.prod(B[:-2]) > 1 else 0
    return (f"pk::gemm({a}, {bb}, {c}, {{{batch}, {M}, {N}, {K}, {b(n.attrs.get('ta', False))}, "
            f"{b(n.attrs.get('tb', False))}, {sa}, {sb}, {M * N}, 0.0f}});")


def conv_params(x_shape, w_shape, y_shape, a) -> str:
    N, C, H, W = x_shape
    O, _, KH, KW = w_shape
    OH, OW = y_shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return f"{{{N}, {C}, {H}, {W}, {O}, {KH}, {KW}, {OH}, {OW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {a['groups']}}}"


@emitter("conv2d")
def _conv(e, n, x, w, bias, y):
    p = conv_params(n.inputs[0].shape, n.inputs[1].shape, n.outputs[0].shape, n.attrs)
    suffix, arg = _act(n)
    return f"pk::conv2d_fwd{suffix}({x}, {w}, {bias}, {y}, {p}{arg});"


@emitter("conv2d_bwd_input")
def _conv_bi(e, n, dy, w, dx):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_input({dy}, {w}, {dx}, {p});"


@emitter("conv2d_bwd_weight")
def _conv_bw(e, n, dy, xs, dw):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_weight({dy}, {xs}, {dw}, {p}, {n.attrs['k']}, {n.inputs[1].shape[1]});"


@emitter("conv2d_bwd_bias")
def _conv_bb(e, n, dy, db):
    p = conv_params(n.attrs["x_shape"], n.attrs["w_shape"], n.inputs[0].shape, n.attrs)
    return f"pk::conv2d_bwd_bias({dy}, {db}, {p});"


def _origin(v: Value) -> str:
    """'ids' and the graph inputs/targets it is computed from, for error messages."""
    found, seen, todo = [], set(), [v]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if x.kind in ("input", "target"):
            found.append(f"{x.kind} {x.name!r}")
        elif x.producer is not None:
            todo.extend(x.producer.inputs)
    return f"{v.name!r}" + (f" (computed from {', '.join(sorted(found))})" if found and found != [
        f"{v.kind} {v.name!r}"] else "")


def index_check(n: Node, idx: str, what: str, hi: int, ignore: int | None = None) -> str:
    """The check a gather runs on its indices before it reads: a clear error, never an
    out-of-bounds read, however the indices were computed (cat, arithmetic, ...)."""
    v = n.inputs[1]
    where = f"{what} in {n.source}" if n.source else what
    return (f"if (const pk::i64 bad = pk::first_bad_index({idx}, {_n(v)}, 0, {hi}, {ignore or 0}, "
            f"{b(ignore is not None)}); bad >= 0) return pock_index_error({cstr(where)}, {cstr(_origin(v))}, "
            f"{idx}, bad, 0, {hi});")


@emitter("embedding")
def _embedding(e, n, w, idx, y):
    V, D = _wshape(n.inputs[0])
    if n.inputs[0].dtype in LOWP:
        return [index_check(n, idx, "embedding", V),
                f"pk::embedding_fwd_lowp({_lowp(e, n.inputs[0])}, {idx}, {y}, {_n(n.inputs[1])}, {V}, {D});"]
    return [index_check(n, idx, "embedding", V),
            f"pk::embedding_fwd({w}, {idx}, {y}, {_n(n.inputs[1])}, {V}, {D});"]


@emitter("embedding_bwd")
def _embedding_bwd(e, n, dy, idx, dw):
    a = n.attrs
    D = n.inputs[0].shape[-1]
    return (f"pk::embedding_bwd({dy}, {idx}, {dw}, {_n(n.inputs[1])}, {a['num_weights']}, {D}, {a['k']}, "
            f"{a['padding_idx']});")


# ---- normalisation --------------------------------------------------------------
def _rows_cols(x: Value, nd: int):
    cols = math.prod(x.shape[len(x.shape) - nd:])
    return _n(x) // cols, cols


@emitter("layer_norm")
def _ln(e, n, x, w, bias, y, mean, rstd):
    rows, cols = _rows_cols(n.inputs[0], n.attrs["normalized_ndim"])
    return f"pk::layer_norm_fwd({x}, {w}, {bias}, {y}, {mean}, {rstd}, {rows}, {cols}, {fl(n.attrs['eps'])});"


EMITTERS["rms_norm"] = lambda e, n, x, w, y, rstd: (
    f"pk::rms_norm_fwd({x}, {w}, {y}, {rstd}, {n.outputs[1].shape[0]}, {n.inputs[0].shape[-1]}, "
    f"{fl(n.attrs['eps'])});")
EMITTERS["rms_norm_bwd"] = lambda e, n, dy, x, rstd, w, dx, dw: (
    f"pk::rms_norm_bwd({dy}, {x}, {rstd}, {w}, {dx}, {dw}, {n.inputs[2].shape[0]}, {n.inputs[1].shape[-1]});")


EMITTERS["swiglu"] = lambda e, n, gate, up, y: f"pk::swiglu_fwd({gate}, {up}, {y}, {_n(n.inputs[0])});"
EMITTERS["swiglu_bwd"] = lambda e, n, dy, gate, up, dgate, dup: \
    f"pk::swiglu_bwd({dy}, {gate}, {up}, {dgate}, {dup}, {_n(n.inputs[1])});"


@emitter("layer_norm_bwd")
def _ln_bwd(e, n, dy, x, mean, rstd, w, dx, dw, db):
    rows, cols = _rows_cols(n.inputs[1], len(n.attrs["w_shape"]))
    return f"pk::layer_norm_bwd({dy}, {x}, {mean}, {rstd}, {w}, {dx}, {dw}, {db}, {rows}, {cols});"


def _ncs(x: Value) -> str:
    return f"{x.shape[0]}, {x.shape[1]}, {math.prod(x.shape[2:])}"


@emitter("batch_norm_train")
def _bn_train(e, n, x, w, bias, rm, rv, y, mean, invstd, nrm, nrv):
    a = n.attrs
    suffix, arg = _act(n)
    return (f"pk::batch_norm_train_fwd{suffix}({x}, {w}, {bias}, {rm}, {rv}, {y}, {mean}, {invstd}, {nrm}, {nrv}, "
            f"{_ncs(n.inputs[0])}, {fl(a['momentum'])}, {fl(a['eps'])}{arg});")


@emitter("batch_norm_eval")
def _bn_eval(e, n, x, w, bias, rm, rv, y):
    suffix, arg = _act(n)
    return (f"pk::batch_norm_eval_fwd{suffix}({x}, {w}, {bias}, {rm}, {rv}, {y}, {_ncs(n.inputs[0])}, "
            f"{fl(n.attrs['eps'])}{arg});")


@emitter("batch_norm_train_bwd")
def _bn_train_bwd(e, n, dy, x, mean, invstd, w, dx, dw, db):
    return f"pk::batch_norm_train_bwd({dy}, {x}, {mean}, {invstd}, {w}, {dx}, {dw}, {db}, {_ncs(n.inputs[1])});"


@emitter("batch_norm_eval_bwd")
def _bn_eval_bwd(e, n, dy, x, rm, rv, w, dx, dw, db):
    return (f"pk::batch_norm_eval_bwd({dy}, {x}, {rm}, {rv}, {w}, {dx}, {dw}, {db}, {_ncs(n.inputs[1])}, "
            f"{fl(n.attrs['eps'])});")


# ---- pooling ---------------------------------------------------------------------
def pool_params(x_shape, y_shape, a) -> str:
    N, C, H, W = x_shape
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    return (f"{{{N}, {C}, {H}, {W}, {y_shape[2]}, {y_shape[3]}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, "
            f"{b(a.get('count_include_pad', True))}, {a.get('divisor_override', 0)}}}")


@emitter("max_pool2d")
def _max_pool(e, n, x, y, idx):
    return f"pk::max_pool2d_fwd({x}, {y}, {idx}, {pool_params(n.inputs[0].shape, n.outputs[0].shape, n.attrs)});"


@emitter("max_pool2d_bwd")
def _max_pool_bwd(e, n, dy, idx, dx):
    return f"pk::max_pool2d_bwd({dy}, {idx}, {dx}, {pool_params(n.attrs['x_shape'], n.inputs[0].shape, n.attrs)});"


@emitter("avg_pool2d")
def _avg_pool(e, n, x, y):
    return f"pk::avg_pool2d_fwd({x}, {y}, {pool_params(n.inputs[0].shape, n.outputs[0].shape, n.attrs)});"


@emitter("avg_pool2d_bwd")
def _avg_pool_bwd(e, n, dy, dx):
    return f"pk::avg_pool2d_bwd({dy}, {dx}, {pool_params(n.attrs['x_shape'], n.inputs[0].shape, n.attrs)});"


@emitter("adaptive_avg_pool2d")
def _adaptive(e, n, x, y):
    N, C, H, W = n.inputs[0].shape
    OH, OW = n.attrs["output_size"]
    return f"pk::adaptive_avg_pool2d_fwd({x}, {y}, {N}, {C}, {H}, {W}, {OH}, {OW});"


@emitter("adaptive_avg_pool2d_bwd")
def _adaptive_bwd(e, n, dy, dx):
    N, C, H, W = n.attrs["x_shape"]
    OH, OW = n.inputs[0].shape[2:]
    return f"pk::adaptive_avg_pool2d_bwd({dy}, {dx}, {N}, {C}, {H}, {W}, {OH}, {OW});"


# ---- pointwise ---------------------------------------------------------------------
for _op in ("relu", "sigmoid", "tanh", "silu"):
    EMITTERS[_op] = (lambda op: lambda e, n, x, y: f"pk::{op}_fwd({x}, {y}, {_n(n.inputs[0])});")(_op)
for _op in ("relu", "sigmoid", "tanh", "silu"):
    EMITTERS[f"{_op}_bwd"] = (lambda op: lambda e, n, dy, v, dx: f"pk::{op}_bwd({dy}, {v}, {dx}, {_n(n.inputs[0])});")(_op)
EMITTERS["gelu"] = lambda e, n, x, y: f"pk::gelu_fwd({x}, {y}, {_n(n.inputs[0])}, {b(n.attrs['approximate'])});"
EMITTERS["gelu_bwd"] = lambda e, n, dy, x, dx: \
    f"pk::gelu_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, {b(n.attrs['approximate'])});"
EMITTERS["hardtanh"] = lambda e, n, x, y: \
    f"pk::hardtanh_fwd({x}, {y}, {_n(n.inputs[0])}, {fl(n.attrs['lo'])}, {fl(n.attrs['hi'])});"
EMITTERS["hardtanh_bwd"] = lambda e, n, dy, x, dx: \
    f"pk::hardtanh_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, {fl(n.attrs['lo'])}, {fl(n.attrs['hi'])});"
for _op, _enum in (("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"), ("rsqrt", "Rsqrt"), ("neg", "Neg"),
                   ("abs", "Abs"), ("reciprocal", "Reciprocal")):
    EMITTERS[_op] = (lambda en: lambda e, n, x, y: f"pk::unary(pk::Unary::{en}, {x}, {y}, {_n(n.inputs[0])});")(_enum)


@emitter("add_scalar", "mul_scalar", "rsub_scalar", "pow_scalar")
def _scalar(e, n, x, y):
    c = n.attrs.get("c", n.attrs.get("e"))
    if n.inputs[0].dtype != "f32":  # integer bookkeeping, e.g. num_batches_tracked += 1
        expr = {"add_scalar": f"x[i] + {int(c)}", "mul_scalar": f"x[i] * {int(c)}",
                "rsub_scalar": f"{int(c)} - x[i]"}[n.op]
        t = CTYPE[n.inputs[0].dtype]
        return (f"{{ const {t}* x = {x}; {t}* y = {y}; "
                f"for (int64_t i = 0; i < {_n(n.inputs[0])}; ++i) y[i] = {expr}; }}")
    return f"pk::{n.op}({x}, {y}, {_n(n.inputs[0])}, {fl(c)});"


EMITTERS["pow_scalar_bwd"] = lambda e, n, dy, x, dx: \
    f"pk::pow_scalar_bwd({dy}, {x}, {dx}, {_n(n.inputs[0])}, {fl(n.attrs['e'])});"


def bcast_strides(shape, out_shape) -> list[int]:
    nd = len(out_shape)
    padded = (1,) * (nd - len(shape)) + tuple(shape)
    st = strides(padded)
    return [0 if padded[d] == 1 and out_shape[d] != 1 else st[d] for d in range(nd)]


def arr(xs) -> str:
    return "{" + ", ".join(str(x) for x in xs) + "}"


def _fit(shape, *stride_lists):
    """Merge adjacent dims that are contiguous in every stride list; pad to kMaxDims."""
    dims = [(s, [sl[d] for sl in stride_lists]) for d, s in enumerate(shape) if s != 1] or [(1, [0] * len(stride_lists))]
    merged = [dims[0]]
    for s, st in dims[1:]:
        ps, pst = merged[-1]
        if all(pst[i] == st[i] * s for i in range(len(st))):
            merged[-1] = (ps * s, st)
        else:
            merged.append((s, st))
    if len(merged) > 6:
        raise NotImplementedError(f"tensor of shape {shape} needs more than 6 strided dims")
    shape_out = [m[0] for m in merged] + [1] * (6 - len(merged))
    lists = [[m[1][i] for m in merged] + [0] * (6 - len(merged)) for i in range(len(stride_lists))]
    return len(merged), shape_out, lists


@emitter("add", "sub", "mul", "div")
def _binary(e, n, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (sa, sc) = _fit(out, bcast_strides(n.inputs[0].shape, out), bcast_strides(n.inputs[1].shape, out))
    op = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}[n.op]
    if n.inputs[0].dtype != "f32":  # integer bookkeeping (position ids from masks)
        return (f"pk::ibinary<{CTYPE[n.inputs[0].dtype]}>(pk::Binary::{op}, {a}, {c}, {y}, "
                f"{{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});")
    return f"pk::binary(pk::Binary::{op}, {a}, {c}, {y}, {{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});"


@emitter("where")
def _where(e, n, cond, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (s0, s1, s2) = _fit(out, *(bcast_strides(v.shape, out) for v in n.inputs))
    return f"pk::where({cond}, {a}, {c}, {y}, {{{nd}, {arr(shape)}, {arr(s0)}, {arr(s1)}, {arr(s2)}}});"


@emitter("compare")
def _compare(e, n, a, c, y):
    out = n.outputs[0].shape
    nd, shape, (sa, sc) = _fit(out, bcast_strides(n.inputs[0].shape, out), bcast_strides(n.inputs[1].shape, out))
    op = n.attrs["cmp"].capitalize()
    return (f"pk::compare<{CTYPE[n.inputs[0].dtype]}>(pk::Compare::{op}, {a}, {c}, {y}, "
            f"{{{nd}, {arr(shape)}, {arr(sa)}, {arr(sc)}}});")


@emitter("cast")
def _cast(e, n, x, y):
    return f"pk::cast<{CTYPE[n.inputs[0].dtype]}, {CTYPE[n.outputs[0].dtype]}>({x}, {y}, {_n(n.inputs[0])});"


EMITTERS["cos"] = lambda e, n, x, y: f"pk::trig(pk::Trig::Cos, {x}, {y}, {_n(n.inputs[0])});"
EMITTERS["sin"] = lambda e, n, x, y: f"pk::trig(pk::Trig::Sin, {x}, {y}, {_n(n.inputs[0])});"
EMITTERS["cumsum"] = lambda e, n, x, y: (
    f"pk::cumsum<{CTYPE[n.inputs[0].dtype]}, {CTYPE[n.outputs[0].dtype]}>({x}, {y}, "
    f"{_odi(n.inputs[0], n.attrs['dim'])}, {b(n.attrs.get('reverse', False))});")


def _reduce_call(x_shape, reduce_flags, scale, x, y):
    dims = [(s, r) for s, r in zip(x_shape, reduce_flags) if s != 1] or [(1, False)]
    merged = [dims[0]]
    for s, r in dims[1:]:
        if merged[-1][1] == r:
            merged[-1] = (merged[-1][0] * s, r)
        else:
            merged.append((s, r))
    shape = [m[0] for m in merged] + [1] * (6 - len(merged))
    flags = [b(m[1]) for m in merged] + ["false"] * (6 - len(merged))
    return f"pk::reduce_sum({x}, {y}, {{{len(merged)}, {arr(shape)}, {{{', '.join(flags)}}}, {fl(scale)}}});"


@emitter("sum", "mean")
def _sum(e, n, x, y):
    shape, dims = n.inputs[0].shape, n.attrs["dims"]
    count = math.prod(shape[d] for d in dims)
    scale = 1.0 / count if n.op == "mean" and count else 1.0
    return _reduce_call(shape, [d in dims for d in range(len(shape))], scale, x, y)


@emitter("sum_to")
def _sum_to(e, n, x, y):
    xs, target = n.inputs[0].shape, n.attrs["shape"]
    padded = (1,) * (len(xs) - len(target)) + tuple(target)
    return _reduce_call(xs, [padded[d] == 1 and xs[d] != 1 for d in range(len(xs))], 1.0, x, y)


def _odi(v: Value, dim: int) -> str:
    return f"{math.prod(v.shape[:dim])}, {v.shape[dim]}, {math.prod(v.shape[dim + 1:])}"


EMITTERS["softmax"] = lambda e, n, x, y: f"pk::softmax_fwd({x}, {y}, {_odi(n.inputs[0], n.attrs['dim'])});"
EMITTERS["log_softmax"] = lambda e, n, x, y: f"pk::log_softmax_fwd({x}, {y}, {_odi(n.inputs[0], n.attrs['dim'])});"
EMITTERS["softmax_bwd"] = lambda e, n, dy, y, dx: \
    f"pk::softmax_bwd({dy}, {y}, {dx}, {_odi(n.inputs[0], n.attrs['dim'])});"
EMITTERS["log_softmax_bwd"] = lambda e, n, dy, y, dx: \
    f"pk::log_softmax_bwd({dy}, {y}, {dx}, {_odi(n.inputs[0], n.attrs['dim'])});"


def sdpa_params(q: Value, k: Value, v: Value, mask: Value | None, a) -> str:
    B = math.prod(q.shape[:-2])
    L, E = q.shape[-2:]
    S, Ev = k.shape[-2], v.shape[-1]
    kind, sb, sl, ss = 0, 0, 0, 0
    if mask is not None:
        kind = 1 if mask.dtype == "u8" else 2
        full = q.shape[:-2] + (L, S)
        st = bcast_strides(mask.shape, full)
        sl, ss = st[-2], st[-1]
        padded = (1,) * (len(full) - len(mask.shape)) + mask.shape
        # the frontend made the mask's batch dims all 1 or all equal to q's: one stride walks them
        sb = 0 if math.prod(padded[:-2]) == 1 else padded[-2] * padded[-1]
    return (f"{{{B}, {L}, {S}, {E}, {Ev}, {fl(a['scale'])}, {b(a['causal'])}, {kind}, {sb}, {sl}, {ss}}}")


@emitter("sdpa")
def _sdpa(e, n, q, k, v, mask, out, probs):
    return f"pk::sdpa_fwd({q}, {k}, {v}, {mask}, {out}, {probs}, {sdpa_params(*n.inputs, n.attrs)});"


@emitter("sdpa_bwd")
def _sdpa_bwd(e, n, dout, q, k, v, probs, mask, dq, dk, dv, scratch):
    p = sdpa_params(*n.inputs[1:4], n.inputs[5], n.attrs)
    return f"pk::sdpa_bwd({dout}, {q}, {k}, {v}, {probs}, {dq}, {dk}, {dv}, {scratch}, {p});"


# ---- layout ----------------------------------------------------------------------------
def strided_copy(dtype, x, y, shape, in_strides, in_offset, out_strides, out_offset) -> str:
    nd, shp, (si, so) = _fit(shape, in_strides, out_strides)
    return (f"pk::strided_copy<{CTYPE[dtype]}>({x}, {y}, {{{nd}, {arr(shp)}, {arr(si)}, {in_offset}, "
            f"{arr(so)}, {out_offset}}});")


@emitter("reshape")
def _reshape(e, n, x, y):
    return f"// view: {n.outputs[0].name} aliases {n.inputs[0].name}"


@emitter("permute")
def _permute(e, n, x, y):
    xs = strides(n.inputs[0].shape)
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, [xs[p] for p in n.attrs["perm"]], 0, strides(out), 0)


@emitter("expand")
def _expand(e, n, x, y):
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, bcast_strides(n.inputs[0].shape, out), 0, strides(out), 0)


@emitter("slice")
def _slice(e, n, x, y):
    a, xs = n.attrs, strides(n.inputs[0].shape)
    ins = list(xs)
    ins[a["dim"]] *= a["step"]
    out = n.outputs[0].shape
    return strided_copy(n.outputs[0].dtype, x, y, out, ins, a["start"] * xs[a["dim"]], strides(out), 0)


@emitter("slice_bwd")
def _slice_bwd(e, n, dy, dx):
    a = n.attrs
    xs = strides(a["x_shape"])
    outs = list(xs)
    outs[a["dim"]] *= a["step"]
    dy_shape = n.inputs[0].shape
    return [f"pk::fill<float>({dx}, {math.prod(a['x_shape'])}, 0.0f);",
            strided_copy("f32", dy, dx, dy_shape, strides(dy_shape), 0, outs, a["start"] * xs[a["dim"]])]


@emitter("cat")
def _cat(e, n, *ptrs):
    ins, y = ptrs[:-1], ptrs[-1]
    dim, ys = n.attrs["dim"], strides(n.outputs[0].shape)
    lines, at = [], 0
    for v, p in zip(n.inputs, ins):
        lines.append(strided_copy(v.dtype, p, y, v.shape, strides(v.shape), 0, ys, at * ys[dim]))
        at += v.shape[dim]
    return lines


@emitter("full")
def _full(e, n, y):
    v = n.outputs[0]
    value = fl(n.attrs["value"]) if v.dtype == "f32" else str(int(n.attrs["value"]))
    return f"pk::fill<{CTYPE[v.dtype]}>({y}, {_n(v)}, {CTYPE[v.dtype]}({value}));"


# ---- recurrent -------------------------------------------------------------------------
def lstm_params(x: Value, a) -> str:
    B, T, I = x.shape
    return f"{{{B}, {T}, {I}, {a['hidden']}, {a['proj']}, {b(a.get('has_bias', True))}, {b(a['proj'] != a['hidden'])}}}"


@emitter("lstm")
def _lstm(e, n, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y, hn, cn, gates, cells, hraw):
    p = lstm_params(n.inputs[0], n.attrs | {"has_bias": n.inputs[5] is not None})
    return (f"pk::lstm_fwd({x}, {h0}, {c0}, {w_ih}, {w_hh}, {b_ih}, {b_hh}, {w_hr}, {y}, {hn}, {cn}, {gates}, "
            f"{cells}, {hraw}, {p});")


@emitter("lstm_bwd")
def _lstm_bwd(e, n, dy, dhn, dcn, x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, hraw,
              dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr, scratch):
    a = n.attrs
    p = lstm_params(n.inputs[3], a)
    return (f"pk::lstm_bwd({dy}, {dhn}, {dcn}, {x}, {h0}, {c0}, {w_ih}, {w_hh}, {w_hr}, {y}, {gates}, {cells}, "
            f"{hraw}, {dx}, {dh0}, {dc0}, {dw_ih}, {dw_hh}, {db_ih}, {db_hh}, {dw_hr}, {scratch}, {p}, "
            f"{a['k_ih']}, {a['k_hh']}, {a['k_hr']});")


def gru_params(x: Value, a, has_bias) -> str:
    B, T, I = x.shape
    return f"{{{B}, {T}, {I}, {a['hidden']}, {b(has_bias)}}}"


@emitter("gru")
def _gru(e, n, x, h0, w_ih, w_hh, b_ih, b_hh, y, hn, saved):
    p = gru_params(n.inputs[0], n.attrs, n.inputs[4] is not None)
    return f"pk::gru_fwd({x}, {h0}, {w_ih}, {w_hh}, {b_ih}, {b_hh}, {y}, {hn}, {saved}, {p});"


@emitter("gru_bwd")
def _gru_bwd(e, n, dy, dhn, x, h0, w_ih, w_hh, y, saved, dx, dh0, dw_ih, dw_hh, db_ih, db_hh, scratch):
    a = n.attrs
    p = gru_params(n.inputs[2], a, a["has_bias"])
    return (f"pk::gru_bwd({dy}, {dhn}, {x}, {h0}, {w_ih}, {w_hh}, {y}, {saved}, {dx}, {dh0}, {dw_ih}, {dw_hh}, "
            f"{db_ih}, {db_hh}, {scratch}, {p}, {a['k_ih']}, {a['k_hh']});")


# ---- dropout, losses, state writes ---------------------------------------------------------
@emitter("dropout")
def _dropout(e, n, x, y, mask):
    salt = int.from_bytes(n.outputs[0].name.encode()[-8:].ljust(8, b"\0"), "little")
    return (f"pk::dropout_fwd({x}, {y}, {mask}, {_n(n.inputs[0])}, {fl(n.attrs['p'])}, "
            f"ctx->seed ^ {salt}ull);")


EMITTERS["dropout_bwd"] = lambda e, n, dy, mask, dx: \
    f"pk::dropout_bwd({dy}, {mask}, {dx}, {_n(n.inputs[0])}, {fl(n.attrs['p'])});"


@emitter("cross_entropy")
def _ce(e, n, logits, target, loss):
    N, C = n.inputs[0].shape
    a = n.attrs
    return [index_check(n, target, "cross_entropy target", C, a["ignore_index"]),
            f"pk::cross_entropy_fwd({logits}, {target}, {loss}, {N}, {C}, {a['ignore_index']}, "
            f"{fl(a['label_smoothing'])});"]


@emitter("cross_entropy_bwd")
def _ce_bwd(e, n, dloss, logits, target, dlogits):
    N, C = n.inputs[1].shape
    a = n.attrs
    return (f"pk::cross_entropy_bwd({dloss}, {logits}, {target}, {dlogits}, {N}, {C}, {a['ignore_index']}, "
            f"{fl(a['label_smoothing'])});")


@emitter("nll_loss")
def _nll(e, n, logp, target, loss):
    N, C = n.inputs[0].shape
    return [index_check(n, target, "nll_loss target", C, n.attrs["ignore_index"]),
            f"pk::nll_loss_fwd({logp}, {target}, {loss}, {N}, {C}, {n.attrs['ignore_index']});"]


@emitter("nll_loss_bwd")
def _nll_bwd(e, n, dloss, target, dlogp):
    N, C = n.outputs[0].shape
    return f"pk::nll_loss_bwd({dloss}, {target}, {dlogp}, {N}, {C}, {n.attrs['ignore_index']});"


EMITTERS["mse_loss"] = lambda e, n, a, c, loss: f"pk::mse_loss_fwd({a}, {c}, {loss}, {_n(n.inputs[0])});"
EMITTERS["mse_loss_bwd"] = lambda e, n, dl, a, c, da, dc: \
    f"pk::mse_loss_bwd({dl}, {a}, {c}, {da}, {dc}, {_n(n.inputs[1])});"


@emitter("assign")
def _assign(e, n, dst, src):
    return f"std::memcpy({dst}, {src}, {n.inputs[0].nbytes});"


def finite_guard(n: Node, g: str) -> str:
    """The non-finite check of an update's gradient on its own, for the exact guard
    (codegen._blocks emits it right after the gradient is computed, and every update of
    an exact step runs after all of them, so a skipped step changes nothing)."""
    what = cstr(f"the gradient of {n.inputs[0].name!r}")
    return f"if (!pk::all_finite({g}, {_n(n.inputs[1])})) return pock_nonfinite({what}, 0);"


def _update(e, n, call: str) -> tuple[str, ...]:
    """An update node's lines.  Exact guard (e.exact_skip, the default): the gradient was
    checked earlier (finite_guard), the update runs unchecked.  Otherwise the check is
    folded into the update kernel: a NaN/inf gradient skips this update and every later
    one of the step (ctx->updates_done counts the ones already run)."""
    if not NONFINITE_GUARD or getattr(e, "exact_skip", False):
        return f"{call});", "++ctx->updates_done;"
    what = cstr(f"the gradient of {n.inputs[0].name!r}")
    return f"if (!{call}, true)) return pock_nonfinite({what}, ctx->updates_done);", "++ctx->updates_done;"


@emitter("sgd_update")
def _sgd(e, n, p, g, buf):
    a = n.attrs
    return _update(e, n, f"pk::sgd_update({p}, {g}, {buf}, {arr(a['region'])}, ctx->lr, {fl(a['momentum'])}, "
                   f"{fl(a['dampening'])}, {fl(a['weight_decay'])}, {b(a['nesterov'])}, ctx->step == 0")


@emitter("adamw_update")
def _adamw(e, n, p, g, m, v):
    a = n.attrs
    return _update(e, n, f"pk::adamw_update({p}, {g}, {m}, {v}, {arr(a['region'])}, ctx->lr, {fl(a['beta1'])}, "
                   f"{fl(a['beta2'])}, {fl(a['eps'])}, {fl(a['weight_decay'])}, ctx->step + 1")


def check_coverage():
    """The ops without a CPU emitter (transfers between backends are emitted by the accelerator backend)."""
    missing = sorted(op for op in OPS if op not in EMITTERS and op not in TRANSFER_OPS)
    return missing


# ---- registration (backends/__init__.py): cpu runs every op; its step is rendered by codegen.emit_cpu
from . import Backend, Device, register  # noqa: E402

register(Backend(
    "cpu", Device(flops_per_s=20e9, dispatch_s=0.3e-6),  # a phone-class core (the partitioner's cost model)
    platforms=("host", "android", "ios"), doc="every op, as C++ kernels (codegen/runtime/kernels)"))
