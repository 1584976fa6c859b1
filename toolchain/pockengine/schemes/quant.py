"""Low-precision storage of frozen weights (compile(frozen_dtype=...)): the
rounding done at compile time, and the exact fp32 values the kernels see.

    fp32  unchanged
    bf16  round-to-nearest-even to bfloat16 (stored as its 16 bits, uint16)
    fp16  round-to-nearest-even to IEEE half (float16)
    int8  weight-only, per output channel (row of dim 0):
          scale[n] = max_k |w[n, k]| / 127 (fp32; 1 for an all-zero row),
          q = clip(rint(w / scale), -127, 127), w' = float(q) * scale[n]
    q4    GGUF Q4_1-style blocks of 32 along a row (K a multiple of 32): per block
          m = min, d = (max - min) / 15 (fp32; a constant block has d = 0),
          q = clip(rint((w - m) / d), 0, 15), w' = float(q) * d + m (two roundings, no FMA);
          stored as uint8 [N, K / 2] (byte j of a block: q[j] | q[j + 16] << 4, as in
          GGUF) with scale f32 [N, K / 32, 2] = (d, m) per block.  With frozen_dtype="q4" an
          embedding table (and a head tied to it) is stored in int8 (passes/lowp.py), as
          GGUF Q4_1 models keep token_embd in Q8_0

`dequantize(stored, d, scale)` of `quantize(w, d)` is what the kernels compute (native/runtime/
kernels/lowp.cpp), so a torch model holding `round_trip(w, d)` in fp32 is the
exact reference.
"""
from __future__ import annotations

import numpy as np

from ..errors import PockError

FROZEN_DTYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "i8", "q4": "q4"}
Q4_BLOCK = 32


def check_frozen_dtype(frozen_dtype) -> str:
    if frozen_dtype not in FROZEN_DTYPES:
        raise PockError(f"frozen_dtype must be one of {sorted(FROZEN_DTYPES)}, got {frozen_dtype!r}")
    return FROZEN_DTYPES[frozen_dtype]


def quantize(w, ir_dtype: str):
    """(stored array, per-row fp32 scale or None) of an fp32 weight."""
    w = np.ascontiguousarray(w, np.float32)
    if ir_dtype == "bf16":
        bits = w.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16), None
    if ir_dtype == "f16":
        return w.astype(np.float16), None
    if ir_dtype == "i8":
        rows = w.reshape(w.shape[0], -1)
        scale = (np.abs(rows).max(axis=1) / np.float32(127)).astype(np.float32)
        scale[scale == 0] = 1
        q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
        return q.reshape(w.shape), scale
    if ir_dtype == "q4":
        if w.ndim != 2 or w.shape[1] % Q4_BLOCK:
            raise PockError(f"q4 needs a 2-D weight whose rows are a multiple of {Q4_BLOCK} long, got {w.shape}")
        blocks = w.reshape(w.shape[0], -1, Q4_BLOCK)
        m = blocks.min(axis=2)
        d = ((blocks.max(axis=2) - m) / np.float32(15)).astype(np.float32)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
        q = np.clip(np.rint((blocks - m[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        return packed.reshape(w.shape[0], -1), np.stack([d, m], axis=-1).astype(np.float32)
    raise PockError(f"no low-precision format {ir_dtype!r}")


def dequantize(stored, ir_dtype: str, scale=None) -> np.ndarray:
    stored = np.asarray(stored)
    if ir_dtype == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    if ir_dtype == "f16":
        return stored.astype(np.float32)
    if ir_dtype == "i8":
        rows = stored.reshape(stored.shape[0], -1).astype(np.float32) * np.asarray(scale, np.float32)[:, None]
        return rows.reshape(stored.shape)
    if ir_dtype == "q4":
        packed = stored.reshape(stored.shape[0], -1, Q4_BLOCK // 2)
        q = np.concatenate([packed & 15, packed >> 4], axis=2).astype(np.float32)
        dm = np.asarray(scale, np.float32).reshape(stored.shape[0], -1, 2)
        prod = (q * dm[..., :1]).astype(np.float32)  # rounded, then the min added: as the kernel does
        return (prod + dm[..., 1:]).astype(np.float32).reshape(stored.shape[0], -1)
    return np.asarray(stored, np.float32)


def round_trip(w, frozen_dtype: str) -> np.ndarray:
    """The fp32 values a frozen weight has once stored as frozen_dtype."""
    d = check_frozen_dtype(frozen_dtype)
    if d == "f32":
        return np.asarray(w, np.float32)
    stored, scale = quantize(w, d)
    return dequantize(stored, d, scale)
