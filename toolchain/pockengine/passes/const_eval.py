"""Compile-time evaluation (constant folding) of an exported program's fx graph.

A node whose inputs are only constants, non-persistent buffers and values computed from
them (never a user input, a parameter or a persistent buffer, and never a random op) is
evaluated once here by running its ATen op with torch. The frontend then binds the
frontier of such nodes as `const` state values, so the generated step carries no
mask/position/rotary-table code: `arange`, causal and bidirectional masks, position ids,
rotary cos/sin tables and relative-position buckets all end up here.

Nodes that are foldable but that the frontend converts anyway (a float `full`, which is
cheaper as a fill than as stored data) are only folded when something downstream needs
folding: an op without a converter, or an integer/boolean result.
"""
from __future__ import annotations

import operator

import torch


def _fx_inputs(node):
    out = []
    torch.fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def _random(target) -> bool:
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def _substitute(a, values):
    return torch.fx.node.map_arg(a, lambda n: values[n.name])


def fold_constants(fx_graph, known: dict, converters, force=()) -> dict:
    """Evaluate the foldable nodes of `fx_graph`.

    `known` maps placeholder names to the tensors they always hold (constants and
    non-persistent buffers). Returns {fx node name: value} for every node worth folding
    (see the module doc); the caller binds those read by a non-folded node as constants.
    """
    values: dict = dict(known)
    needs: dict[str, bool] = {name: name in force for name in known}  # force: must not reach the step
    folded: dict = {}
    for node in fx_graph.nodes:
        if node.op != "call_function" or _random(node.target):
            continue
        ins = _fx_inputs(node)
        if any(n.name not in values for n in ins):
            continue
        try:
            with torch.no_grad():
                out = node.target(*_substitute(node.args, values), **_substitute(node.kwargs, values))
        except Exception:  # not evaluable eagerly: leave it to the converters
            continue
        values[node.name] = out
        results = out if isinstance(out, (tuple, list)) else [out]
        non_float = any(isinstance(r, torch.Tensor) and r.dtype != torch.float32 for r in results)
        need = node.target is not operator.getitem and (node.target not in converters or non_float)
        need = need or any(needs[n.name] for n in ins) or (node.target is operator.getitem and non_float)
        needs[node.name] = need
        if need:
            folded[node.name] = out
    return folded


__all__ = ["fold_constants"]
