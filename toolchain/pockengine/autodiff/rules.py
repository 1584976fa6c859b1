"""The gradient rules: op -> rule(b, node, gouts, need) -> one gradient (or None) per
input. Each rule lives in its op's record (pockengine/ops, `OpRecord.grad`); RULES and
PARTIAL are views of the registry.

`gouts[i]` is the gradient flowing into output i (None: nothing flows).
`need[i]` is None (input i needs no gradient), FULL, or an int k: only the
first k slices along dim 1 of that parameter are trained (sparse update), so
the rule returns a gradient of shape (shape[0], k, *shape[2:]). Only the ops
listed in PARTIAL handle k themselves (computing just that slice and saving
just the slice of the activation it needs); for every other op the driver
asks for FULL and slices the result.
"""
from __future__ import annotations

from ..ops import FULL, REGISTRY

RULES: dict = {name: r.grad for name, r in REGISTRY.items() if r.grad is not None}
PARTIAL = {name: set(r.partial) for name, r in REGISTRY.items() if r.partial}

__all__ = ["FULL", "RULES", "PARTIAL"]
