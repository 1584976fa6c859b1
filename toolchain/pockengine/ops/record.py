"""One record per IR op, in one registry.

An `OpRecord` holds everything the compiler knows about an op: its shape inference
and FLOPs, which inputs it writes (state updates) or may overwrite in place
(the memory planner), whether its output aliases its input (a view), its gradient rule
(autodiff), its torch reference (the frozen prefix's module, HTP/ONNX export), and the
C++ call of the reference runtime's kernel (codegen/emit.py). The records live by
family in this package (dense.py, conv.py, norm.py, ...), each op's forward and backward
side by side; every pass reads REGISTRY (or `ops.get(name)`) directly, there is no other
table of ops. docs/adding_an_op.md lists the files an op touches.

Signatures:
  infer(inputs, attrs) -> [(shape, dtype), ...]      (an input may be None: absent)
  flops(inputs, outputs, attrs) -> int
  grad(b, node, gouts, need) -> one gradient (or None) per input   (autodiff/backward.py)
  torch(inputs, attrs) -> tensor or list; torch_outputs = how many leading outputs it computes
  torch_train(inputs, attrs) -> tensor or list (every output)
  cpu(e, node, *input pointers, *output pointers) -> C++ line(s)   (codegen/emit.py Emit)
  cpu_finite(e, node, *input pointers, *output pointers) -> (C++ lines, condition): the same
      computation, the condition (C++) true when its output holds no NaN/inf (codegen's exact
      guard); it may assume its `inplace` inputs were checked where they were made
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FULL = "full"  # a parameter trained whole (autodiff: need[i] is None, FULL or a slice count k)


def _no_flops(i, o, a):
    return 0


@dataclass(frozen=True)
class OpRecord:
    name: str
    infer: Callable  # (inputs, attrs) -> [(shape, dtype), ...]
    flops: Callable = _no_flops  # (inputs, outputs, attrs) -> int
    mutates: tuple[int, ...] = ()  # inputs it writes (state updates)
    view: bool = False  # output 0 aliases input 0 (no data movement)
    inplace: tuple[int, ...] = ()  # inputs its first output may overwrite (memory/plan.py)
    float_only: bool = False  # its kernel takes float32 inputs only (program.check_float_ops)
    grad: Callable | None = None  # the gradient rule (autodiff/backward.py)
    differentiable: bool = True  # False: no gradient rule by design (backward ops, updates, transfers)
    partial: frozenset = frozenset()  # inputs whose sparse slice count k the rule handles itself
    torch: Callable | None = None  # the torch reference, eval semantics (backends/prefix_torch.py)
    torch_outputs: int = 1  # the number of leading outputs `torch` computes
    torch_train: Callable | None = None  # the torch reference of an op only a training step runs (losses,
    #                         train-mode batch norm): the reference backend's; the frozen prefix takes `torch` only
    cpu: Callable | None = None  # the C++ kernel call (codegen/emit.py)
    cpu_finite: Callable | None = None  # the call that also checks its output (the exact guard, codegen._blocks)
    transfer: bool = False  # data movement between backends: inserted by the partitioner, emitted by
    #                         the accelerator backend on either end, never by the CPU backend alone
    layout: bool = False  # only moves data (a frozen prefix of such ops is not worth splitting off)
    act_epilogue: bool = False  # its kernel can apply a following ReLU/ReLU6 (attrs["act"], passes/fuse.py)
    lowp_inputs: tuple[int, ...] = ()  # inputs its kernel reads as a low-precision frozen weight (passes/lowp.py)


REGISTRY: dict[str, OpRecord] = {}


def register(*records: OpRecord) -> None:
    for r in records:
        if r.name in REGISTRY:
            raise ValueError(f"IR op '{r.name}' registered twice")
        REGISTRY[r.name] = r


def infer(op: str, inputs, attrs) -> list[tuple[tuple[int, ...], str]]:
    if op not in REGISTRY:
        raise KeyError(f"unknown IR op '{op}'")
    return [(tuple(int(s) for s in shape), dtype) for shape, dtype in REGISTRY[op].infer(inputs, attrs)]


def flops(node) -> int:
    return int(REGISTRY[node.op].flops(node.inputs, node.outputs, node.attrs))


def k_of(need, full_size):
    """The slice count a rule computes for need[i] (FULL: the whole dim)."""
    return full_size if need is FULL else need


def bwd(name: str, infer, flops=_no_flops, **fields) -> OpRecord:
    """The record of a backward op: emitted by a gradient rule, never differentiated itself."""
    return OpRecord(name, infer, flops, differentiable=False, **fields)
