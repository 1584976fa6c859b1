"""Helpers shared by the op records' torch references (eval semantics)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

TORCH_DTYPE = {"f32": torch.float32, "i64": torch.int64, "i32": torch.int32, "u8": torch.bool}


def act(y, a):
    """A fused activation epilogue (attrs['act'])."""
    act = a.get("act")
    if act == "relu":
        return F.relu(y)
    if act == "relu6":
        return F.hardtanh(y, 0.0, 6.0)
    return y
