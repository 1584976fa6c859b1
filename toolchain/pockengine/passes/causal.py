"""Attention masks known at compile time: an `sdpa` whose mask is a constant (folded by
passes/const_eval.py: Hugging Face's `create_causal_mask`; or a registered `tril` buffer nothing writes)
and says exactly "query l sees keys s <= l" becomes `causal=True` with no mask input, so
the kernel never computes the scores above the diagonal and never reads the mask.

The constant may reach the sdpa through `expand`/`reshape` (the batch and head broadcast);
every [l, s] plane of it must be the causal pattern: a bool mask True exactly where s <= l,
or a float mask 0 there and <= -1e30 (PyTorch's finfo.min or -inf) above. Anything else
(padding masks, sliding windows, bidirectional masks) is left as it is."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node

_THROUGH = ("expand", "reshape")


def _constant_source(v, written):
    """The constant array a mask value is a broadcast/reshape of (a constant, or a buffer the
    step never writes), or None."""
    while v is not None and v.producer is not None and v.producer.op in _THROUGH:
        v = v.producer.inputs[0]
    if v is None or v.producer is not None or v.kind not in ("const", "buffer") or v.data is None \
            or id(v) in written:
        return None
    return np.asarray(v.data)


def is_causal_mask(data: np.ndarray, L: int, S: int) -> bool:
    if data.ndim < 2 or data.shape[-2:] != (L, S) or L > S:
        return False
    below = np.tril(np.ones((L, S), dtype=bool))  # torch's is_causal: top-left aligned
    planes = data.reshape(-1, L, S)
    if data.dtype == np.bool_ or data.dtype == np.uint8:
        return bool(np.all(planes.astype(bool) == below))
    if not np.issubdtype(data.dtype, np.floating):
        return False
    return bool(np.all(planes[:, below] == 0.0) and np.all(planes[:, ~below] <= -1e30))


def causal_from_constant_mask(g: Graph) -> Graph:
    written = {id(v) for n in g.nodes for v in n.mutates}
    for n in g.nodes:
        if n.op != "sdpa" or n.attrs.get("causal") or len(n.inputs) < 4 or n.inputs[3] is None:
            continue
        q, k = n.inputs[0], n.inputs[1]
        data = _constant_source(n.inputs[3], written)
        if data is not None and is_causal_mask(data, q.shape[-2], k.shape[-2]):
            n.inputs[3] = None
            n.attrs = {**n.attrs, "causal": True}
    return g


__all__ = ["causal_from_constant_mask", "is_causal_mask"]
