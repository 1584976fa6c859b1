"""Scheduling: the order the generated step runs its nodes in.

Forward nodes keep program order, except `hoist` nodes (the slices of
activations a sparse update saves), which run right after their input is
produced so the full activation can die early. Backward nodes keep the order
autodiff emitted them in. A node that writes state (an optimizer update, a
running-stat assignment) must come after every reader of what it writes:

* reorder=True (PockEngine): each such node runs as early as that allows, so a
  parameter is updated as soon as its gradient is complete and the gradient
  buffer dies at once;
* reorder=False (what a framework does): optimizer updates run after the
  whole backward pass, keeping every gradient alive until then.
"""
from __future__ import annotations

from collections import defaultdict

from ..ir.graph import Graph, Node


def schedule(g: Graph, reorder: bool = True) -> list[Node]:
    writers = [n for n in g.nodes if n.mutates]
    hoisted = [n for n in g.nodes if n.attrs.get("hoist")]
    hoist_after: dict[int, list[Node]] = defaultdict(list)
    for h in hoisted:
        producer = h.inputs[0].producer
        hoist_after[id(producer) if producer is not None else 0].append(h)

    base: list[Node] = list(hoist_after.get(0, []))
    for n in g.nodes:
        if n.mutates or n.attrs.get("hoist"):
            continue
        base.append(n)
        base.extend(hoist_after.get(id(n), []))

    position = {id(n): i for i, n in enumerate(base)}
    readers: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(base):
        for v in n.inputs:
            if v is not None:
                readers[id(v)].append(i)

    insert_after: dict[int, list[Node]] = defaultdict(list)
    for w in writers:
        if w.phase == "update" and not reorder:
            insert_after[len(base) - 1].append(w)
            continue
        deps = [-1]
        for v in w.inputs:
            if v is None:
                continue
            if v.producer is not None:
                deps.append(position[id(v.producer)])
            if any(v is m for m in w.mutates):
                deps.extend(readers.get(id(v), []))
        insert_after[max(deps)].append(w)

    order = list(insert_after.get(-1, []))
    for i, n in enumerate(base):
        order.append(n)
        order.extend(insert_after.get(i, []))
    return order
