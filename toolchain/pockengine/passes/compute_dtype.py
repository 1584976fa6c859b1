"""Products over frozen weights in bf16 or fp16 (compile(compute_dtype=...)).

A linear whose weight is frozen (its forward, and linear_bwd_input: the activation gradient
flowing back through it) multiplies in the compute dtype with fp32 accumulation
(kernels/lowp.cpp's *_cd kernels: both operands rounded to bf16/fp16, products exact in
fp32; fp16 scales the activation operand by a power of two per call, so gradients neither
flush to zero nor overflow). On arm64 the arithmetic is the hardware's: bf16 on BFMMLA where the
CPU has BF16 (fp32 accumulation, as above), fp16 on FMLA where it has fp16 vector arithmetic:
fp16 sums over 16 depth steps added in fp32 (fmla_matmul below emulates it exactly; error at most
(18 u16 + ceil(K / 16) u32) sum |a w|, u16 = 2^-11, below bf16's 2^-7 sum |a w|). Everything else stays fp32: trained tensors (a partly trained
weight included) and their weight gradients, the optimizer and its state, the loss, the
normalizations, attention's activation-by-activation products.

The frozen weights those products read are stored in the compute dtype (passes/lowp.py,
products only: a table that is only looked up stays fp32), or, with frozen_dtype int8/q4
(or the other 16-bit format), stay in that storage and are dequantized straight into the
compute dtype. The nodes carry attrs["compute"] = "bf16" | "f16"; ops/dense.py emits the
*_cd kernels for them.
"""
from __future__ import annotations

import numpy as np

from ..errors import PockError
from ..ir.graph import Graph
from .lowp import store_frozen_lowp

COMPUTE_DTYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
PRODUCTS = ("linear", "linear_bwd_input")  # input 1: the (frozen) weight
STORED = ("bf16", "f16", "i8", "q4")  # formats the lowp kernels dequantize


def check_compute_dtype(compute_dtype) -> str:
    if compute_dtype not in COMPUTE_DTYPES:
        raise PockError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {compute_dtype!r}")
    return COMPUTE_DTYPES[compute_dtype]


def apply_compute_dtype(graphs: list[Graph], trained, compute_dtype: str, frozen_ir: str) -> list[str]:
    """Store and mark the frozen-weight products of every graph; returns the weights' names."""
    cd = check_compute_dtype(compute_dtype)
    if cd == "f32":
        return []
    if frozen_ir == "f32":
        store_frozen_lowp(graphs, trained, cd, products_only=True)
    names = set()
    for g in graphs:
        for n in g.nodes:
            w = n.inputs[1] if n.op in PRODUCTS and len(n.inputs) > 1 else None
            if w is not None and w.kind == "param" and w.dtype in STORED and w.name not in trained:
                n.attrs["compute"] = cd
                names.add(w.name)
    return sorted(names)


def round_to(a, cd: str) -> np.ndarray:
    """a (fp32) rounded to bf16 / f16 (round-to-nearest-even), as fp32: the kernels' rounding."""
    a = np.ascontiguousarray(a, np.float32)
    if cd == "bf16":
        from ..schemes.quant import dequantize, quantize
        return dequantize(quantize(a, "bf16")[0], "bf16")
    if cd == "f16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    return a


def operand_scale(a, cd: str) -> float:
    """The power of two the kernels multiply the activation operand by before rounding it: 1 for
    bf16; for fp16 the one that puts max |a| in [2^13, 2^14) (1 when a is all zeros or not finite)."""
    amax = float(np.max(np.abs(a))) if np.size(a) else 0.0
    if cd != "f16" or not (amax > 0) or not np.isfinite(amax):
        return 1.0
    return float(np.ldexp(1.0, 14 - np.frexp(np.float32(amax))[1]))


def round_operand(a, cd: str) -> np.ndarray:
    """The activation operand as a *_cd kernel multiplies it, scaled back (float64: exact)."""
    s = operand_scale(a, cd)
    return round_to(np.asarray(a, np.float32) * np.float32(s), cd).astype(np.float64) / s


# ---- arm64 fp16 FMLA (kernels/lowp_fmla.cpp): the kernels' numerics, emulated exactly
FMLA_CHUNK = 16  # depth steps summed in fp16 before the fp32 accumulator


def fmla_operand_scale(a, wmax: float) -> float:
    """The power of two the FMLA path multiplies the activation operand by: operand_scale's,
    lowered so that max |a| max |w| < 2^11 (16 products of a chunk then sum below 2^15)."""
    s = operand_scale(a, "f16")
    wmax = float(wmax)
    if not (wmax > 0) or not np.isfinite(wmax):
        return s
    ew = int(np.frexp(np.float32(wmax))[1])
    return float(np.ldexp(s, -3 - ew)) if ew > -3 else s


def fmla_matmul(a16, b16) -> np.ndarray:
    """C = A @ B as lowp_fmla.cpp computes it: per output, fp16 fused multiply-adds over chunks of
    FMLA_CHUNK depth steps in order (each rounded to fp16 once), the chunk sums added in fp32.
    a16 [M, D] and b16 [D, N] are float16."""
    a = np.asarray(a16, np.float16).astype(np.float64)
    b = np.asarray(b16, np.float16).astype(np.float64)
    M, D = a.shape
    acc = np.zeros((M, b.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for l0 in range(0, D, FMLA_CHUNK):
            h = np.zeros_like(acc, dtype=np.float16)
            for l in range(l0, min(l0 + FMLA_CHUNK, D)):
                # a * b is exact in fp64 (11 x 11 bits) and so is the sum with h but in rare
                # far-apart cases: one rounding to fp16, as the fused instruction
                h = (np.outer(a[:, l], b[l]) + h.astype(np.float64)).astype(np.float16)
            acc = acc + h.astype(np.float32)
    return acc


def fmla_linear(x, wd, b=None) -> np.ndarray:
    """linear_fwd_lowp_cd(cd=fp16) on the FMLA path: y = x @ w^T (+ b), float64 of the fp32 result."""
    wr = round_to(wd, "f16")
    with np.errstate(over="ignore"):
        s = fmla_operand_scale(x, np.max(np.abs(wr), initial=0.0))
        xa = (np.asarray(x, np.float32) * np.float32(s)).astype(np.float16)
    y = fmla_matmul(wr.astype(np.float16), xa.T).T * np.float32(1.0 / s)
    return (y + np.asarray(b, np.float32) if b is not None else y).astype(np.float64)


def fmla_linear_bwd_input(dy, wd) -> np.ndarray:
    """linear_bwd_input_lowp_cd(cd=fp16) on the FMLA path: dx = dy @ w."""
    wr = round_to(wd, "f16")
    with np.errstate(over="ignore"):
        s = fmla_operand_scale(dy, np.max(np.abs(wr), initial=0.0))
        dya = (np.asarray(dy, np.float32) * np.float32(s)).astype(np.float16)
    return (fmla_matmul(dya, wr.astype(np.float16)) * np.float32(1.0 / s)).astype(np.float64)
