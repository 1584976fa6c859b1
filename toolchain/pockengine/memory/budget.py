"""What a compiled step costs in private memory (issue 36), and the compiler's choice of what
to recompute so that it fits `pe.compile(..., memory_budget_mb=N)`.

Private memory is what the OS charges the app: the arena and every state tensor a step
writes (trained parameters, buffers, optimizer state).  The frozen parameters and constants
are mapped read-only from the checkpoint file (native/runtime/checkpoint.cpp): clean pages
the OS may drop and re-read, counted as mapped_bytes.
"""
from __future__ import annotations

import math

from .plan import is_mapped


def memory_stats(prog) -> dict:
    """{"private_bytes", "mapped_bytes", "recompute_flops"} of a Program."""
    from .plan import written_state
    written = written_state(prog.graph, prog.trained)
    mapped = sum(v.nbytes for v in prog.state.values() if is_mapped(v, written))
    state = sum(v.nbytes for v in prog.state.values())
    return {"private_bytes": prog.plan.arena_bytes + state - mapped, "mapped_bytes": mapped,
            "recompute_flops": int(getattr(prog, "recompute_flops", 0))}


MIB = 2**20


def _private_state(graph, forward_graph, trained) -> int:
    from .plan import written_state
    written = written_state(graph, trained)
    state = dict(graph.state)
    for name, v in forward_graph.state.items():
        state.setdefault(name, v)
    return sum(v.nbytes for v in state.values() if not is_mapped(v, written))


def _arena(graph, exact_skip: bool) -> int:
    from ..passes.schedule import schedule
    from .plan import plan_memory
    return plan_memory(schedule(graph, reorder=not exact_skip), graph, [graph.loss]).arena_bytes


def _segments(graph, chosen: list[tuple[str, str]], lora: bool) -> list:
    """The segments `chosen` names in graph: ("full", block) every forward node of the block,
    ("cheap", block) only its cheap ones (passes/recompute.cheap: the GEMM outputs stay kept);
    a full block supersedes its cheap part.  With `lora`, each LoRA x·A outside them too."""
    from ..passes.recompute import blocks, cheap, lora_down_projections
    by_block = blocks(graph)
    full = {b for how, b in chosen if how == "full"}
    segments = [by_block[b] for b in by_block if b in full]  # program order
    segments += [[n for n in by_block[b] if cheap(n)] for how, b in chosen if how == "cheap" and b not in full]
    inside = {id(n) for s in segments for n in s}
    if lora:
        segments += [[n] for n in lora_down_projections(graph) if id(n) not in inside]
    return segments


def _trial(graph, exact_skip, chosen: list[tuple[str, str]], lora: bool) -> tuple[int, int]:
    """(arena bytes, recompute FLOPs) of graph with `chosen` recomputed (on a copy)."""
    from ..passes.recompute import recompute
    h, _ = graph.clone()
    added = recompute(h, _segments(h, chosen, lora))
    return _arena(h, exact_skip), added


def fit_budget(graph, forward_graph, trained, exact_skip: bool, budget_mb) -> int:
    """Choose what the backward pass recomputes so that the step's private memory (arena +
    private state) is at most budget_mb MiB, and rewrite graph (in place) accordingly; returns
    the FLOPs recomputation adds to a step.  A step that already fits is left as it is.  Above
    that, greedily by bytes saved per FLOP spent: LoRA's x·A always, each block's cheap nodes
    (elementwise, norms, activations: their GEMM outputs stay kept), then whole blocks from
    their input; the fewest candidates of that ranking that fit.  The floor is every block
    recomputed whole; a budget below it is a PockError naming it."""
    from ..errors import PockError
    from ..ops import flops
    from ..ir.verify import verify
    from ..passes.recompute import blocks, cheap, recompute, saved_by_backward
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb > 0:
        raise PockError(f"memory_budget_mb must be a positive number of MiB, got {budget_mb!r}")
    limit = budget_mb * MIB
    state = _private_state(graph, forward_graph, trained)
    base = _arena(graph, exact_skip) + state
    if base <= limit:
        return 0
    by_block = blocks(graph)

    def value(c: tuple[str, str]) -> float:  # bytes saved per FLOP spent
        how, b = c
        nodes = by_block[b] if how == "full" else [n for n in by_block[b] if cheap(n)]
        saved = sum(v.nbytes for v in saved_by_backward(graph, nodes))
        return saved / max(1, sum(flops(n) for n in nodes))

    ranked = sorted([("cheap", b) for b in by_block] + [("full", b) for b in by_block], key=value, reverse=True)
    fits = {}

    def trial(k: int) -> bool:
        if k not in fits:
            arena, _ = _trial(graph, exact_skip, ranked[:k], True)
            fits[k] = arena + state
        return fits[k] <= limit

    if not trial(len(ranked)):
        floor = min(base, *fits.values())  # where recomputing everything gains nothing, today's plan
        reach = math.ceil(floor / MIB * 1e4) / 1e4  # rounded up: a budget of this many MiB fits
        raise PockError(f"memory_budget_mb={budget_mb:g} cannot be met: the smallest reachable private memory "
                        f"is {reach:.4f} MiB (arena {(floor - state) / MIB:.4f} + trained parameters, buffers and "
                        f"optimizer state {state / MIB:.4f}, "
                        + ("recomputing every block)" if floor < base else "without recomputation: recomputing gains "
                           "nothing here)"))
    lo, hi = 0, len(ranked)  # the fewest candidates that fit (private memory falls as k grows)
    while lo < hi:
        mid = (lo + hi) // 2
        if trial(mid):
            hi = mid
        else:
            lo = mid + 1
    added = recompute(graph, _segments(graph, ranked[:lo], True))
    verify(graph, "recomputation")
    return added
