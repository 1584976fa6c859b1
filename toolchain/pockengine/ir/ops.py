"""The op table as the IR sees it: for every IR op, its output shapes/dtypes (shape
inference), its FLOPs, and which inputs it writes in place. A view of the op records
(pockengine/ops: one `OpRecord` per op, grouped by family).

Inputs may be None for absent optional tensors (a missing bias); outputs may
be None when a node leaves an optional output out (a gradient not wanted).
"""
from __future__ import annotations

from ..ops import REGISTRY, OpRecord, flops, infer
from ..ops.shape import broadcast_shapes, conv_out, numel, pool_out

OpDef = OpRecord  # the record's infer/flops/mutates/view are what OpDef held
OPS: dict[str, OpRecord] = REGISTRY

# The inputs an op may overwrite with its first output (same shape, dtype and element order;
# output element i depends only on input element i, or, for cross_entropy_bwd, on a row
# the kernel reads completely before writing it). The memory planner uses this when such an
# input dies at the node.
INPLACE: dict[str, tuple[int, ...]] = {name: r.inplace for name, r in REGISTRY.items() if r.inplace}

# Data movement between backends: inserted by the partitioner (passes/partition.py) after
# autodiff; the accelerator backend on either end emits them, never the CPU backend alone.
TRANSFER_OPS = tuple(name for name, r in REGISTRY.items() if r.transfer)

__all__ = ["OPS", "OpDef", "INPLACE", "TRANSFER_OPS", "infer", "flops", "numel", "broadcast_shapes", "pool_out",
           "conv_out"]
