"""C++ text helpers for the op records' CPU kernel calls (the reference runtime's
kernel signatures, native/runtime/include/pock_kernels.h): literals, pointer-free
shape/stride arguments, index checks, used by the records' builders and codegen/emit.py."""
from __future__ import annotations

import math

from ..ir.graph import Node, Value

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


def _n(v) -> int:
    return math.prod(v.shape)


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


def _odi(v: Value, dim: int) -> str:
    return f"{math.prod(v.shape[:dim])}, {v.shape[dim]}, {math.prod(v.shape[dim + 1:])}"


def strided_copy(dtype, x, y, shape, in_strides, in_offset, out_strides, out_offset) -> str:
    nd, shp, (si, so) = _fit(shape, in_strides, out_strides)
    return (f"pk::strided_copy<{CTYPE[dtype]}>({x}, {y}, {{{nd}, {arr(shp)}, {arr(si)}, {in_offset}, "
            f"{arr(so)}, {out_offset}}});")

