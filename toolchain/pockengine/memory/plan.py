"""Liveness and the static memory plan: every arena tensor gets a fixed
offset in one arena, largest first into the lowest gap among the tensors
alive at the same time (TFLite Micro's greedy planner). A view (reshape)
shares its source's storage, which then lives until the view's last use.
`verify_plan` proves that no two tensors alive at the same time overlap."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ops import REGISTRY

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    value: Value
    size: int
    first: int  # step index of definition (-1: written before the step)
    last: int   # step index of last use
    offset: int = -1
    aliases: list = field(default_factory=list)


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    offsets: dict[int, int]  # id(value) -> arena offset (views included)
    arena_bytes: int

    def offset(self, v: Value) -> int:
        return self.offsets[id(v)]


def root_of(v: Value) -> Value:
    while v.producer is not None and REGISTRY[v.producer.op].view:
        v = v.producer.inputs[0]
    return v


def liveness(order: list[Node], g: Graph, keep_to_end: list[Value], in_place: bool = True,
             keep_whole=()) -> list[Buffer]:
    end = len(order)
    bufs: dict[int, Buffer] = {}

    def buf(v: Value) -> Buffer | None:
        r = root_of(v)
        if r.in_state:
            return None
        if id(r) not in bufs:
            first = -1 if r.kind in ("input", "target") else None
            bufs[id(r)] = Buffer(r, _align(max(r.nbytes, 1)), first, -1)
        return bufs[id(r)]

    for v in g.inputs + g.targets:
        buf(v)
    for i, n in enumerate(order):
        for v in n.inputs:
            if v is not None and (b := buf(v)) is not None:
                b.last = max(b.last, i)
        for o in n.outputs:
            if o is None:
                continue
            b = buf(o)
            if b is None:
                continue
            if b.value is o:
                b.first = i
            else:
                b.aliases.append(o)
            b.last = max(b.last, i)
    for v in keep_to_end:
        if (b := buf(v)) is not None:
            b.last = end
    for v in keep_whole:  # reserved for the whole step (a partitioned step's host copy of the loss)
        if (b := buf(v)) is not None:
            b.first, b.last = -1, end
    for b in bufs.values():
        if b.first is None:  # defined by a node outside the order (cannot happen after DCE)
            raise AssertionError(f"{b.value!r} is never produced")
        b.last = max(b.last, b.first)
    if in_place:
        _share_in_place(order, bufs)
    return list(bufs.values())


def _share_in_place(order: list[Node], bufs: dict[int, Buffer]) -> None:
    """Let a node write its output over an input whose buffer dies at that node
    (ops whose record lists it in `inplace` only): the two share one buffer. Chains of such ops share too."""
    owner = {}  # id(value) -> key of the buffer holding it
    for key, b in bufs.items():
        for v in [b.value] + b.aliases:
            owner[id(v)] = key
    for i, n in enumerate(order):
        out = n.outputs[0] if n.outputs else None
        if out is None or id(out) not in bufs or not REGISTRY[n.op].inplace:
            continue
        for k in REGISTRY[n.op].inplace:
            v = n.inputs[k] if k < len(n.inputs) else None
            if v is None or v.shape != out.shape or v.dtype != out.dtype or id(v) not in owner:
                continue
            key = owner[id(v)]
            src = bufs[key]
            if src.last != i or src.value.kind != "temp" or src.size != bufs[id(out)].size:
                continue
            dst = bufs.pop(id(out))
            for moved in [dst.value] + dst.aliases:
                owner[id(moved)] = key
            src.aliases += [dst.value] + dst.aliases
            src.last = dst.last
            break


def plan_memory(order: list[Node], g: Graph, keep_to_end: list[Value], in_place: bool = True,
                keep_whole=()) -> MemoryPlan:
    buffers = liveness(order, g, keep_to_end, in_place, keep_whole)
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-b.size, b.first)):
        busy = sorted((p.offset, p.offset + p.size) for p in placed if p.first <= b.last and b.first <= p.last)
        offset = 0
        for start, stop in busy:
            if offset + b.size <= start:
                break
            offset = max(offset, stop)
        b.offset = offset
        placed.append(b)
    offsets = {}
    for b in buffers:
        offsets[id(b.value)] = b.offset
        for a in b.aliases:
            offsets[id(a)] = b.offset
    size = max((b.offset + b.size for b in buffers), default=0)
    plan = MemoryPlan(buffers, offsets, size)
    verify_plan(plan)
    return plan


HOST = "cpu"  # the host's memory space (backends.ALWAYS): inputs, targets and the loss live there


def plan_spaces(order: list[Node], g: Graph, keep_to_end=(), space: dict[int, str] | None = None,
                keep_whole=()) -> dict[str, MemoryPlan]:
    """The step's memory plan, one MemoryPlan per memory space: {"cpu": the host arena} for a step
    on the CPU, plus {backend: its device arena} for a step partitioned over an accelerator
    (passes/partition.py; `space`: id(value) -> the backend whose memory holds it).  Every
    backend's code is emitted against this one plan.  Each space plans the values it holds at
    their step indices (a transfer's input in the source's space, its output in the
    destination's); only the host shares a buffer in place.  keep_whole: values whose buffer
    is reserved for the whole step."""
    if space is None:
        return {HOST: plan_memory(order, g, list(keep_to_end), keep_whole=keep_whole)}
    plans = {}
    for b in dict.fromkeys([HOST, *space.values()]):
        def mine(v, b=b):
            return v is not None and not v.in_state and space[id(v)] == b
        proxies = [Node(n.op, [v if mine(v) else None for v in n.inputs],
                        [o if mine(o) else None for o in n.outputs], n.attrs, n.source, n.phase) for n in order]
        host = Graph(g.name)
        if b == HOST:
            host.inputs, host.targets = g.inputs, g.targets
        plans[b] = plan_memory(proxies, host, [v for v in keep_to_end if mine(v)], in_place=(b == HOST),
                               keep_whole=[v for v in keep_whole if mine(v)])
    return plans


def verify_plan(plan: MemoryPlan) -> None:
    """No two buffers alive at the same step share a byte."""
    if not plan.buffers:
        return
    first = np.array([b.first for b in plan.buffers])
    last = np.array([b.last for b in plan.buffers])
    lo = np.array([b.offset for b in plan.buffers])
    hi = lo + np.array([b.size for b in plan.buffers])
    if (lo < 0).any() or (hi > plan.arena_bytes).any():
        raise AssertionError("memory plan: a buffer lies outside the arena")
    time = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])
    space = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    clash = time & space
    np.fill_diagonal(clash, False)
    if clash.any():
        i, j = map(int, np.argwhere(clash)[0])
        a, b = plan.buffers[i], plan.buffers[j]
        raise AssertionError(f"memory plan: {a.value!r} and {b.value!r} are alive together and overlap")


# The mapped segment (frozen state read in place from the checkpoint file, see
# native/runtime/checkpoint.cpp) starts on a boundary of this many bytes, a multiple of
# every page size a phone uses (4 KiB, 16 KiB), so no page holds private and mapped bytes.
MAPPED_ALIGN = 16384


def is_mapped(v, trained) -> bool:
    """Whether state tensor v is frozen (never written by a step): a parameter not in
    `trained` or a constant.  Such tensors are read in place from the mapped checkpoint."""
    return v.kind == "const" or (v.kind == "param" and v.name not in trained)


def state_layout(g: Graph, trained=None) -> tuple[dict[str, int], int]:
    """Offsets of the state tensors: the private segment (trained params, buffers,
    optimizer state) first, then, with `trained` given, the mapped segment (frozen params
    and constants, see is_mapped) from a MAPPED_ALIGN boundary (when it fills a page).  Without `trained` every
    tensor is laid out in kind order (params, buffers, constants, optimizer state)."""
    order = {"param": 0, "buffer": 1, "const": 2, "opt_state": 3}
    if trained is None:
        key = lambda v: (order[v.kind],)  # noqa: E731
    else:
        key = lambda v: (is_mapped(v, trained), order[v.kind])  # noqa: E731
    offsets, at, mapped = {}, 0, False
    # a mapped segment smaller than a page gains nothing from its own pages: no padding
    pad = trained is not None and sum(_align(max(v.nbytes, 1)) for v in g.state.values()
                                      if is_mapped(v, trained)) >= MAPPED_ALIGN
    for v in sorted(g.state.values(), key=key):
        if pad and not mapped and is_mapped(v, trained):
            mapped = True
            at = -(-at // MAPPED_ALIGN) * MAPPED_ALIGN
        offsets[v.name] = at
        at += _align(max(v.nbytes, 1))
    return offsets, at


def written_state(graph: Graph, trained) -> set[str]:
    """Names of the parameters a step writes: the trained ones and whatever an optimizer
    update node updates (the rest of the frozen state is mapped from the file)."""
    return set(trained) | {n.inputs[0].name for n in graph.nodes if n.op in ("sgd_update", "adamw_update")}
