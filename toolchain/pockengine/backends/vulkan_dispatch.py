"""The Vulkan backend's dispatch primitives: a Dispatch record (shader, workgroups, push
constants), the op -> emitter table both emitter modules (backends/vulkan.py and
backends/vulkan_conv.py) register into, and the dispatches several emitters share
(reductions, strided copies and fills)."""
from __future__ import annotations

import math
import struct
from collections import namedtuple

from ..ir.graph import Value
from ..ops.cpp import _fit

Dispatch = namedtuple("Dispatch", "shader groups push")
NONE = 0xFFFFFFFF
WG = 64
EMITTERS: dict = {}
WORDS = {"f32": 1, "i32": 1, "i64": 2}


def emitter(*ops):
    def deco(fn):
        for op in ops:
            EMITTERS[op] = fn
        return fn
    return deco


def fbits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def ibits(x: int) -> int:
    return int(x) & 0xFFFFFFFF


def grid(n: int) -> tuple[int, int, int]:
    """Workgroups of 64 for n invocations (over y too when x would pass 65535)."""
    groups = max(1, math.ceil(n / WG))
    return (groups, 1, 1) if groups <= 65535 else (65535, math.ceil(groups / 65535), 1)


def _n(v: Value) -> int:
    return math.prod(v.shape)


def _f32(*vs) -> None:
    for v in vs:
        if v is not None and v.dtype != "f32":
            raise NotImplementedError(f"Vulkan kernels take f32 here, not {v.dtype}")


# ---- reductions ---------------------------------------------------------------------------------
def reduce_dispatch(x, y, shape, flags, scale):
    dims = [(s, r) for s, r in zip(shape, flags) if s != 1] or [(1, False)]
    merged = [list(dims[0])]
    for s, r in dims[1:]:
        if merged[-1][1] == r:
            merged[-1][0] *= s
        else:
            merged.append([s, r])
    if len(merged) > 6:
        raise NotImplementedError("reduction over more than 6 dims")
    mask = sum(1 << d for d, (_, r) in enumerate(merged) if r)
    nout = math.prod(s for s, r in merged if not r)
    shp = [s for s, _ in merged] + [1] * (6 - len(merged))
    return Dispatch("reduce", grid(nout), [x, y, len(merged), *shp, mask, fbits(scale)])


# ---- layout: strided copies and fills (copy.comp) -----------------------------------------------------
def copy_dispatch(dtype, x, y, shape, in_strides, in_offset, out_strides, out_offset):
    if dtype not in WORDS:
        raise NotImplementedError(f"no Vulkan copy for {dtype}")
    nd, shp, (si, so) = _fit(shape, in_strides, out_strides)
    return Dispatch("copy", grid(math.prod(shape)), [0, x, y, nd, *shp, *si, *so, in_offset, out_offset,
                                                     WORDS[dtype], 0])


def fill_dispatch(dtype, y, count, value):
    if dtype not in WORDS:
        raise NotImplementedError(f"no Vulkan fill for {dtype}")
    bits = fbits(value) if dtype == "f32" else ibits(int(value))
    return Dispatch("copy", grid(count * WORDS[dtype]), [1, 0, y, 1, count] + [1] * 5 + [0] * 14 + [WORDS[dtype], bits])
