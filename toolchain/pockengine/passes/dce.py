"""Dead-code elimination: keep only nodes that write state or feed the loss,
the user outputs, or such a node."""
from __future__ import annotations

from ..ir.graph import Graph


def eliminate_dead_code(g: Graph) -> Graph:
    live: set[int] = {id(v) for v in g.outputs}
    if g.loss is not None:
        live.add(id(g.loss))
    kept = []
    for n in reversed(g.nodes):
        if n.mutates or any(o is not None and id(o) in live for o in n.outputs):
            kept.append(n)
            live.update(id(v) for v in n.inputs if v is not None)
    g.nodes = kept[::-1]
    return g
