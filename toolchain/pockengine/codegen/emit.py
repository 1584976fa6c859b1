"""The CPU's lines of a step: a node as a C++ call of the kernel library
(native/runtime/include/pock_kernels.h) at fixed offsets. The call of each op is its
record's `cpu` builder (pockengine/ops); this module holds the pointer expressions
(Emit), the EmitOptions a step is emitted under and the non-finite guard's lines around
the optimizer updates. Every step backend's CPU nodes go through it (codegen._blocks)."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Node, Value
from ..memory.plan import root_of
from ..ops import REGISTRY
from ..ops.cpp import MACRO, _n, cstr


@dataclass(frozen=True)
class EmitOptions:
    """How a step is emitted, passed explicitly to codegen and the step backends (part of
    the Program's source cache key; the text, and so its structural hash, follows from it)."""
    nonfinite_guard: bool = True  # a loss check before the backward pass, a gradient check per
    #                               update (always on for users; bench/guard_cost.py measures it off)
    exact_skip: bool = True  # the exact guard: every gradient checked before any update (Program.exact_skip)
    fuse_updates: bool = True  # an update fused into its weight gradient's GEMM (steps without the exact guard)
    chunk_nodes: int = 128  # a longer step (or inference pass) is emitted as functions of this many nodes
    update_check: str = "kernel"  # without the exact guard, where an update's gradient is checked:
    #                               "kernel" (inside the update kernel) or "separate" (pk::all_finite first)

    def __post_init__(self):
        if self.update_check not in ("kernel", "separate"):
            raise ValueError(f"update_check must be 'kernel' or 'separate', got {self.update_check!r}")


class Emit:
    """Pointer expressions for the values of one plan: a named buffer (`namer(v)`, see
    codegen.BufferNames) when a namer is given, else the offset itself (F32(A, 128)); and
    the EmitOptions the lines are emitted under."""

    def __init__(self, arena_offset, state_offset, namer=None, options: EmitOptions | None = None):
        self.arena_offset = arena_offset  # Value -> int
        self.state_offset = state_offset  # name -> int
        self.namer = namer
        self.options = options if options is not None else EmitOptions()

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

    def pointers(self, n: Node) -> list[str]:
        """The pointer expressions a record's C++ builder takes: n's inputs, then its outputs."""
        return [self.p(v) for v in (*n.inputs, *n.outputs)]

    def node(self, n: Node) -> list[str]:
        fn = REGISTRY[n.op].cpu if n.op in REGISTRY else None
        if fn is None:
            raise NotImplementedError(f"no CPU emitter for op '{n.op}'")
        out = fn(self, n, *self.pointers(n))
        return [out] if isinstance(out, str) else list(out)

    def finite(self, n: Node) -> tuple[list[str], str]:
        """(lines, C++ condition) of node n computed by a kernel that also tells whether its
        output holds no NaN/inf: the record's cpu_finite (codegen.kernel_checks picks such nodes)."""
        lines, cond = REGISTRY[n.op].cpu_finite(self, n, *self.pointers(n))
        return list(lines), cond

    def update(self, n: Node, call: str) -> tuple[str, ...]:
        """An optimizer update's lines around its kernel call (the records of sgd_update and
        adamw_update call this)."""
        return _update(self, n, call)


def _gradient_of(u: Node) -> str:
    return cstr(f"the gradient of {u.inputs[0].name!r}")


def finite_guard(n: Node, g: str) -> str:
    """The non-finite check of an update's gradient on its own, for the exact guard
    (codegen._blocks emits it right after the gradient is computed, and every update of
    an exact step runs after all of them, so a skipped step changes nothing)."""
    return f"if (!pk::all_finite({g}, {_n(n.inputs[1])})) return pock_nonfinite({_gradient_of(n)}, 0);"


def checked_node(e: Emit, n: Node, u: Node) -> list[str]:
    """Node n's lines with the exact guard's check of its output made by its own kernel (as
    it stores it: no second pass), u the update reading it (named in the error)."""
    lines, cond = e.finite(n)
    return [*lines, f"if (!{cond})", f"  return pock_nonfinite({_gradient_of(u)}, 0);"]


def _update(e, n, call: str) -> tuple[str, ...]:
    """An update node's lines.  Exact guard (options.exact_skip, the default): the gradient
    was checked earlier (finite_guard), the update runs unchecked.  Otherwise the check is
    folded into the update kernel: a NaN/inf gradient skips this update and every later
    one of the step (ctx->updates_done counts the ones already run); update_check="separate"
    checks it with pk::all_finite before the kernel instead (the guard before the folded one,
    kept for bench/guard_cost.py's comparison)."""
    if not e.options.nonfinite_guard or e.options.exact_skip:
        return f"{call});", "++ctx->updates_done;"
    if e.options.update_check == "separate":
        g = call.split("(", 1)[1].split(", ")[1]
        return (f"if (!pk::all_finite({g}, {_n(n.inputs[1])})) return pock_nonfinite({_gradient_of(n)}, "
                f"ctx->updates_done);", f"{call});", "++ctx->updates_done;")
    return (f"if (!{call}, true)) return pock_nonfinite({_gradient_of(n)}, ctx->updates_done);",
            "++ctx->updates_done;")
