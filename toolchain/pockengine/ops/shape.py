"""Shape helpers shared by the op records' shape inference and FLOP counts."""
from __future__ import annotations

import math


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


def same(i, a):
    """Shape inference of an op whose output is like its first input."""
    return [(i[0].shape, i[0].dtype)]


def ew(i, o, a):
    """FLOPs of an elementwise op: one per output element."""
    return numel(o[0])
