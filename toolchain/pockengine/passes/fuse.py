"""Fusion: a linear / conv2d / batch_norm whose output is read only by a ReLU or
ReLU6 applies that activation while storing its output (the kernels' `Act`
epilogue), so the pre-activation tensor never exists. The backward keeps its
shape: relu_bwd reads the activation's output, which the fused node now
produces, and the layers' own gradients read their inputs, not their outputs;
fuse_activation_grads then folds a relu_bwd / relu6's hardtanh_bwd that only
feeds a train-mode batch_norm's backward into that node (it masks dy as it
reads it), so the masked gradient is never written and read back."""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ops import REGISTRY


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
        if (producer is not None and REGISTRY[producer.op].act_epilogue and "act" not in producer.attrs
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


def fuse_activation_grads(g: Graph) -> Graph:
    """batch_norm_train_bwd(act_bwd(dy, y), x, ...) -> batch_norm_train_bwd(dy, x, ..., y) with attrs
    act (pk::batch_norm_train_bwd_act): the activation's gradient (relu, or hardtanh 0..6) read
    only by that node is computed inside it, the same selects, the same bits."""
    users = g.users()
    drop = set()
    for n in g.nodes:
        if n.op != "batch_norm_train_bwd" or "act" in n.attrs or n.inputs[0] is None:
            continue
        a = n.inputs[0].producer
        act = {"relu_bwd": "relu", "hardtanh_bwd": "relu6"}.get(a.op) if a is not None else None
        if act == "relu6" and not (a.attrs["lo"] == 0.0 and a.attrs["hi"] == 6.0):
            continue
        if (act is None or len(users.get(id(a.outputs[0]), [])) != 1 or a.outputs[0] in g.outputs
                or a.inputs[0].dtype != "f32" or a.inputs[0].shape != n.inputs[1].shape):
            continue
        n.inputs = [a.inputs[0], *n.inputs[1:], a.inputs[1]]
        n.attrs["act"] = act
        drop.add(id(a))
    g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g
