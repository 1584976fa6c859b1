"""Fusion: a linear / conv2d / batch_norm whose output is read only by a ReLU or
ReLU6 applies that activation while storing its output (the kernels' `Act`
epilogue), so the pre-activation tensor never exists. The backward is
unchanged: relu_bwd reads the activation's output, which the fused node now
produces, and the layers' own gradients read their inputs, not their outputs."""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ops import REGISTRY

FUSABLE = {name for name, r in REGISTRY.items() if r.act_epilogue}  # kernels with an Act epilogue


def _epilogue(n: Node) -> str | None:
    if n.op == "relu":
        return "relu"
    if n.op == "hardtanh" and n.attrs["lo"] == 0.0 and n.attrs["hi"] == 6.0:
        return "relu6"
    return None


def fuse_activations(g: Graph) -> Graph:
    users = g.users()
    keep = []
    for n in g.nodes:
        act = _epilogue(n)
        producer = n.inputs[0].producer if act and n.inputs[0] is not None else None
        if (producer is not None and producer.op in FUSABLE and "act" not in producer.attrs
                and producer.outputs[0] is n.inputs[0] and len(users.get(id(n.inputs[0]), [])) == 1
                and n.inputs[0] not in g.outputs and n.phase == producer.phase == "forward"):
            out = n.outputs[0]
            producer.outputs[0] = out
            out.producer = producer
            producer.attrs["act"] = act
            continue
        keep.append(n)
    g.nodes = keep
    return g
