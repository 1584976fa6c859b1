"""Sparse backpropagation of a tied weight: train it through one of its uses only.

A tied parameter (a language model's token embedding that is also its output head) gets, as in
PyTorch, the sum of the gradients of every use. Its input-embedding use needs the whole backward
pass through every block; its head use needs only the last hidden states. Naming the parameter in
`update` by its alias (`head.weight` where `model.head.weight is model.tok.weight`) trains it
through the alias module's use alone: every other use reads it through a `stop_gradient` view, so
the backward graph through the blocks is dead code unless something else needs it.

    split_tied_uses(update, aliases) -> (update by canonical names, {canonical: module path})
    restrict_tied_uses(graph, uses)      # in place, on the training graph
"""
from __future__ import annotations

import fnmatch

from ..errors import PockError
from ..ir.graph import Graph


def split_tied_uses(update, aliases: dict[str, str]):
    """Exact `update` keys that name a tied parameter by an alias (tied_aliases: alias ->
    canonical) become the canonical name plus a use restriction to the alias's module.  A
    parameter that another key names (exactly or by a glob) gets its whole gradient."""
    if not isinstance(update, dict) or not aliases:
        return update, {}
    plain = {k: r for k, r in update.items() if not (isinstance(k, str) and k in aliases)}
    uses: dict[str, str] = {}
    out = dict(plain)
    for key, ratio in update.items():
        if not (isinstance(key, str) and key in aliases):
            continue
        canonical = aliases[key]
        if any(isinstance(k, str) and (k == canonical or fnmatch.fnmatchcase(canonical, k)) for k in plain):
            continue  # named as itself too: the whole (summed) gradient
        if canonical in uses:
            raise PockError(f"update names tied parameter {canonical!r} by two aliases "
                            f"({uses[canonical]}.* and {key}); name it once, or by {canonical!r} for every use")
        uses[canonical] = key.rsplit(".", 1)[0]
        out[canonical] = ratio
    return out, uses


def _within(source: str, module: str) -> bool:
    path = source.split(" (", 1)[0]
    return path == module or path.startswith(module + ".")


def restrict_tied_uses(graph: Graph, uses: dict[str, str]) -> Graph:
    """Every use of each restricted parameter outside its module reads a stop_gradient view."""
    for pname, module in uses.items():
        param = graph.state.get(pname)
        if param is None:
            raise PockError(f"tied parameter {pname!r} is not in the exported graph")
        readers = [n for n in graph.nodes if any(v is param for v in n.inputs)]
        if not any(_within(n.source, module) for n in readers):
            raise PockError(f"update names {pname!r} through module {module!r}, but no op of that module "
                            f"reads it (uses: {sorted({n.source for n in readers})})")
        for node in readers:
            if _within(node.source, module):
                continue
            view = graph.add("reshape", [param], {"shape": param.shape, "stop_gradient": True},
                             source=node.source, name=f"{pname}_no_grad")
            graph.nodes.insert(graph.nodes.index(node), graph.nodes.pop())
            node.inputs = [view if v is param else v for v in node.inputs]
    return graph
