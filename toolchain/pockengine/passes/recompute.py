"""Recomputation (activation checkpointing) as a graph pass after autodiff.

`recompute(g, segments)` duplicates, for each segment (a list of forward nodes, e.g. one
decoder block), the nodes that compute what the backward pass reads of it, right before the
first backward node that reads any of it, and points every backward reader at the copies: the
originals then die at their last forward use and the copies live only through that segment's
backward pass.  A copy is the same op with the same attributes on the same inputs (the copies
of the segment's earlier nodes where those were copied, else the originals, which then stay
alive: the segment's input, the checkpoint, even where an other segment is recomputed too), so
it runs the same kernel on the same bits, and the result does not depend on the segments' order.
A value an other segment's copies read (its checkpoint: a block's output, the next block's
input) is alive until that segment's recomputation anyway, so it is not recomputed for its
backward readers either (a decoder block would otherwise recompute its down projection and
residual add only to hand the next block's norm backward a copy of its kept input).

Never copied: nodes that write state (running statistics: recomputed batch norm must not
update them twice), sparse-update slices (`hoist`) and dropout (its mask's seed is salted by
its output's name; its outputs are kept instead).
"""
from __future__ import annotations

import re

from ..ir.graph import Graph, Node
from ..ops import flops

NEVER = ("dropout",)
_BLOCK = re.compile(r"^(.*?\.\d+)(?:[. ]|$)")


def block_of(n: Node) -> str | None:
    """The repeated module a forward node belongs to ("model.layers.3", "transformer.h.0"): its
    source path up to the first list index, or None."""
    m = _BLOCK.match(n.source or "")
    return m.group(1) if m else None


def blocks(g: Graph) -> dict[str, list[Node]]:
    """{block: its forward nodes, in program order}."""
    out: dict[str, list[Node]] = {}
    for n in g.nodes:
        if n.phase == "forward" and (b := block_of(n)) is not None:
            out.setdefault(b, []).append(n)
    return out


def cheap(n: Node) -> bool:
    """Whether n is cheap to recompute: a few FLOPs per element it writes (elementwise ops,
    norms, activations, RoPE), unlike a GEMM or attention (FLOPs per element ~ the depth)."""
    return flops(n) <= 16 * max(1, sum(o.numel for o in n.outputs if o is not None))


def lora_down_projections(g: Graph) -> list[Node]:
    """LoRA's x·A: the linear nodes whose weight is an adapter's lora_A."""
    return [n for n in g.nodes if n.phase == "forward" and n.op == "linear" and len(n.inputs) > 1
            and n.inputs[1] is not None and n.inputs[1].name.endswith("lora_A")]


def _copyable(n: Node) -> bool:
    return not n.mutates and not n.attrs.get("hoist") and n.op not in NEVER


def saved_by_backward(g: Graph, segment: list[Node]) -> list:
    """The values `segment` computes that a backward or update node reads."""
    inside = {id(o) for n in segment for o in n.outputs if o is not None}
    seen, out = set(), []
    for n in g.nodes:
        if n.phase == "forward" or n.attrs.get("recompute"):  # another segment's copies read the originals
            continue
        for v in n.inputs:
            if v is not None and id(v) in inside and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def _needed(segment: list[Node], saved: list) -> set[int]:
    """ids of the copyable nodes of `segment` that computing `saved` needs."""
    own = {id(n) for n in segment}
    need: set[int] = set()
    todo = [v.producer for v in saved if v.producer is not None]
    while todo:
        n = todo.pop()
        if id(n) in need or id(n) not in own or not _copyable(n):
            continue
        need.add(id(n))
        todo += [v.producer for v in n.inputs if v is not None and v.producer is not None]
    return need


def checkpoints(g: Graph, segments: list[list[Node]]) -> set[int]:
    """ids of the values the segments' copies will read from outside their own segment: kept
    alive (the originals) until that segment's recomputation."""
    kept: set[int] = set()
    for segment in segments:
        need = _needed(segment, saved_by_backward(g, segment))
        inside = {id(o) for n in segment for o in n.outputs if o is not None}
        kept |= {id(v) for n in segment if id(n) in need for v in n.inputs if v is not None and id(v) not in inside}
    return kept


def recompute(g: Graph, segments: list[list[Node]]) -> int:
    """Rewrite g (in place) so each segment's saved values are recomputed; returns the FLOPs
    the copies add to a step."""
    added = 0
    kept = checkpoints(g, segments)
    for segment in segments:
        saved = [v for v in saved_by_backward(g, segment) if id(v) not in kept]
        need = _needed(segment, saved)
        if not need:
            continue
        copy: dict[int, object] = {}
        fresh: list[Node] = []
        for n in segment:
            if id(n) not in need:
                continue
            ins = [None if v is None else copy.get(id(v), v) for v in n.inputs]
            outs = [None if o is None else g.new_value(o.name + "_re", o.shape, o.dtype) for o in n.outputs]
            m = Node(n.op, ins, outs, dict(n.attrs), n.source, "backward")
            m.attrs["recompute"] = True
            for o, c in zip(n.outputs, outs):
                if o is not None:
                    copy[id(o)] = c
                    c.producer = m
            fresh.append(m)
            added += flops(m)
        first = None
        for i, n in enumerate(g.nodes):
            # another segment's copies keep reading the originals (its checkpoint): rewired, they
            # would make this segment's values live from that segment's backward on
            if n.phase == "forward" or n.attrs.get("recompute"):
                continue
            hit = False
            for k, v in enumerate(n.inputs):
                if v is not None and id(v) in copy:
                    n.inputs[k] = copy[id(v)]
                    hit = True
            if hit and first is None:
                first = i
        g.nodes[first:first] = fresh
    return added
