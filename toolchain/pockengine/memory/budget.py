"""What a compiled step costs in private memory (issue 36), and the compiler's choice of what
to recompute so that it fits `pe.compile(..., memory_budget_mb=N)`.

Private memory is what the OS charges the app: the arena and every state tensor a step
writes (trained parameters, buffers, optimizer state).  The frozen parameters and constants
are mapped read-only from the checkpoint file (codegen/runtime/checkpoint.cpp): clean pages
the OS may drop and re-read, counted as mapped_bytes.
"""
from __future__ import annotations

import math

from .plan import is_mapped


def memory_stats(prog) -> dict:
    """{"private_bytes", "mapped_bytes", "recompute_flops"} of a Program."""
    from ..program import written_state
    written = written_state(prog.graph, prog.trained)
    mapped = sum(v.nbytes for v in prog.state.values() if is_mapped(v, written))
    state = sum(v.nbytes for v in prog.state.values())
    return {"private_bytes": prog.plan.arena_bytes + state - mapped, "mapped_bytes": mapped,
            "recompute_flops": int(getattr(prog, "recompute_flops", 0))}


MIB = 2**20


def _private_state(graph, forward_graph, trained) -> int:
    from ..program import written_state
    written = written_state(graph, trained)
    state = dict(graph.state)
    for name, v in forward_graph.state.items():
        state.setdefault(name, v)
    return sum(v.nbytes for v in state.values() if not is_mapped(v, written))


def _arena(graph, exact_skip: bool) -> int:
    from ..passes.schedule import schedule
    from .plan import plan_memory
    return plan_memory(schedule(graph, reorder=not exact_skip), graph, [graph.loss]).arena_bytes


def _trial(graph, exact_skip, chosen: list[str], lora: bool) -> tuple[int, int]:
    """(arena bytes, recompute FLOPs) of graph with the blocks `chosen` recomputed (on a copy)."""
    from ..passes.recompute import blocks, lora_down_projections, recompute
    h, _ = graph.clone()
    by_block = blocks(h)
    segments = [by_block[b] for b in chosen]
    inside = {id(n) for s in segments for n in s}
    if lora:
        segments += [[n] for n in lora_down_projections(h) if id(n) not in inside]
    added = recompute(h, segments)
    return _arena(h, exact_skip), added


def fit_budget(graph, forward_graph, trained, exact_skip: bool, budget_mb) -> int:
    """Choose what the backward pass recomputes so that the step's private memory (arena +
    private state) is at most budget_mb MiB, and rewrite graph (in place) accordingly; returns
    the FLOPs recomputation adds to a step.  A step that already fits is left as it is.  Above
    that: LoRA's x·A is always recomputed, then whole blocks (from their input) in order of
    bytes saved per FLOP, as few as fit (the floor is every block).  A budget that cannot be met
    is a PockError naming the smallest reachable."""
    from ..errors import PockError
    from ..ir.ops import flops
    from ..ir.verify import verify
    from ..passes.recompute import blocks, lora_down_projections, recompute, saved_by_backward
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb > 0:
        raise PockError(f"memory_budget_mb must be a positive number of MiB, got {budget_mb!r}")
    limit = budget_mb * MIB
    state = _private_state(graph, forward_graph, trained)
    if _arena(graph, exact_skip) + state <= limit:
        return 0
    by_block = blocks(graph)

    def value(b: str) -> float:  # bytes saved per FLOP spent (whole block recomputed)
        saved = sum(v.nbytes for v in saved_by_backward(graph, by_block[b]))
        return saved / max(1, sum(flops(n) for n in by_block[b]))

    ranked = sorted(by_block, key=value, reverse=True)
    fits = {}

    def trial(k: int) -> bool:
        if k not in fits:
            arena, _ = _trial(graph, exact_skip, ranked[:k], True)
            fits[k] = arena + state
        return fits[k] <= limit

    if not trial(len(ranked)):
        floor = min(fits.values())
        reach = math.ceil(floor / MIB * 1e4) / 1e4  # rounded up: a budget of this many MiB fits
        raise PockError(f"memory_budget_mb={budget_mb:g} cannot be met: the smallest reachable private memory "
                        f"is {reach:.4f} MiB (arena {(floor - state) / MIB:.4f} + trained parameters, buffers and "
                        f"optimizer state {state / MIB:.4f}, recomputing every block)")
    lo, hi = 0, len(ranked)  # the fewest blocks that fit (fits grows with k)
    while lo < hi:
        mid = (lo + hi) // 2
        if trial(mid):
            hi = mid
        else:
            lo = mid + 1
    chosen = [by_block[b] for b in ranked[:lo]]
    inside = {id(n) for s in chosen for n in s}
    segments = chosen + [[n] for n in lora_down_projections(graph) if id(n) not in inside]
    added = recompute(graph, segments)
    verify(graph, "recomputation")
    return added
