"""The inference graph, derived from the training-mode export (one torch.export per compile).

    inference_graph(train) -> Graph    the forward nodes producing the model's outputs, with
                                       dropout as identity and train-mode batch norm as eval-mode
                                       batch norm over the running statistics (their update dropped)
    reads_training(model) -> list      where a module's code branches on `self.training` in a way
                                       this pass cannot reproduce: such a model is exported again
                                       in eval mode (program.export)
    share_origins(train, eval) -> eval that eval-mode export's nodes numbered as the training
                                       export's nodes that compute the same (op, attributes,
                                       inputs), for the prefix split

Each node of the inference graph carries the number (`Node.origin`) of the training-graph
node it was derived from: inference_graph numbers the export's nodes and copies them, so the
two graphs share their forward nodes and passes/prefix.split_prefix cuts both at the same ones.

What the pass knows: nn.Dropout* and F.dropout (an IR `dropout` node), nn.BatchNorm* (an IR
`batch_norm_train` node and the `assign`s of its running statistics), and code reading
`training` only to pick a dropout probability (HF attention's `dropout=0.0 if not
self.training else p`, RNN layers' inter-layer dropout).  Any other read of `training` in a
module's class (outside train()/eval()/__init__ and the like) or in a module-level function of
its file makes reads_training() name it, and the model is exported in eval mode as well."""
from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap

import torch.nn as nn

from ..ir.graph import Graph
from .dce import eliminate_dead_code

# modules whose train/eval difference this pass reproduces
HANDLED = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.modules.batchnorm._BatchNorm)
# methods that read `training` without it changing what forward computes
NOT_FORWARD = frozenset({"train", "eval", "__init__", "extra_repr", "__setstate__", "__getstate__", "_apply",
                         "state_dict", "load_state_dict", "_load_from_state_dict", "gradient_checkpointing_enable",
                         "gradient_checkpointing_disable", "_set_gradient_checkpointing", "requires_grad_"})


def inference_graph(train: Graph) -> Graph:
    """A copy of `train` (exported in train mode with its model outputs in `outputs`) computing
    only those outputs as eval mode would: dropout is the identity, batch_norm_train becomes
    batch_norm_eval over the running statistics, and their updates (assign) are dropped.
    Each node of `train` gets its number (`origin`), which its copy keeps."""
    for i, n in enumerate(train.nodes):
        n.origin = i
    g, _ = train.clone()
    g.loss, g.targets = None, []
    replace: dict[int, object] = {}
    running: set[int] = set()
    nodes = []
    for n in g.nodes:
        n.inputs = [replace.get(id(v), v) if v is not None else None for v in n.inputs]
        if n.op == "dropout":
            replace[id(n.outputs[0])] = n.inputs[0]
            continue
        if n.op == "batch_norm_train":
            x, w, b, rm, rv = n.inputs
            if rm is None:  # no running statistics: eval mode uses the batch's too
                nodes.append(n)
                continue
            running.update((id(rm), id(rv)))
            tracked = g.state.get(rm.name.rsplit(".", 1)[0] + ".num_batches_tracked")
            if tracked is not None:
                running.add(id(tracked))
            if len(n.outputs) >= 5:  # a later use of the module reads its running statistics unchanged
                for new_stat, old_stat in zip(n.outputs[3:5], (rm, rv)):
                    if new_stat is not None:
                        replace[id(new_stat)] = old_stat
            n.op, n.attrs, n.outputs = "batch_norm_eval", {"eps": n.attrs["eps"]}, n.outputs[:1]
            n.outputs[0].name = g._unique("batch_norm_eval")  # named as an eval-mode export names it
        if n.op == "assign" and id(n.inputs[0]) in running:
            continue
        nodes.append(n)
    g.nodes = nodes
    g.outputs = [replace.get(id(v), v) for v in g.outputs]
    return eliminate_dead_code(g)


def share_origins(train: Graph, forward: Graph) -> Graph:
    """The eval-mode export `forward` with each node that computes what a node of the
    training export `train` computes (the same op and attributes over the same inputs: model
    inputs by position, state by name, other such nodes' outputs) numbered as that node;
    the others (a module's eval-only branch) get no number.  Run on the two exports
    before lowering, where the graphs are the model's own ops."""
    for i, n in enumerate(train.nodes):
        n.origin = i
    key: dict[int, tuple] = {id(v): ("input", i) for i, v in enumerate(train.inputs)}
    key.update({id(v): ("state", name) for name, v in train.state.items()})
    fkey: dict[int, tuple] = {id(v): ("input", i) for i, v in enumerate(forward.inputs)}
    fkey.update({id(v): ("state", name) for name, v in forward.state.items()})

    def signature(n, keys):
        return (n.op, tuple(sorted((k, repr(v)) for k, v in n.attrs.items())),
                tuple(None if v is None else keys.get(id(v), ("?", id(v))) for v in n.inputs))

    by_signature: dict[tuple, list] = {}
    for n in train.nodes:
        if n.phase == "forward":
            by_signature.setdefault(signature(n, key), []).append(n)
        for j, o in enumerate(n.outputs):
            if o is not None:
                key[id(o)] = ("node", n.origin, j)
    for n in forward.nodes:
        same = by_signature.get(signature(n, fkey))
        n.origin = same.pop(0).origin if same else None
        for j, o in enumerate(n.outputs):
            if o is not None and n.origin is not None:
                fkey[id(o)] = ("node", n.origin, j)
    return forward


def reads_training(model: nn.Module) -> list[str]:
    """'Class: code' for each module class of `model` (or module-level function of its file)
    whose code reads `training` other than as the pass above reproduces; [] when one export
    in train mode gives both graphs."""
    out = []
    for m in model.modules():
        if isinstance(m, HANDLED) and type(m).forward.__module__.startswith("torch.nn.modules"):
            continue  # (a subclass with its own forward is read like any module)
        for cls in type(m).__mro__:
            # our own modules (LoRA's) need no reading, but the frontends' (Keras, ONNX, TFLite, JAX
            # interpreters) are the source model's code and read `training` as it does
            if cls in (nn.Module, object) or (cls.__module__.startswith("pockengine.")
                                              and not cls.__module__.startswith("pockengine.frontends.")):
                continue
            out += [f"{cls.__name__}: {hit}" for hit in _class_reads(cls)]
            out += [f"{cls.__module__}: {hit}" for hit in _file_function_reads(cls.__module__)]
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=None)
def _class_reads(cls) -> tuple:
    try:
        src = textwrap.dedent(inspect.getsource(cls))
        return _reads(ast.parse(src), src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ("(no source to read)",)


@functools.lru_cache(maxsize=None)
def _file_function_reads(module_name: str) -> tuple:
    """Reads of `training` in the module-level functions of a class's file (HF's
    eager_attention_forward(module, ...) reads module.training)."""
    mod = sys.modules.get(module_name)
    try:
        src = inspect.getsource(mod) if mod is not None else ""
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ()
    hits = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hits += _reads(node, src)
    return tuple(hits)


def _head(stmt):
    """The part of a statement that decides: an if's test, not its body."""
    if isinstance(stmt, (ast.If, ast.While)):
        return stmt.test
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return stmt.iter
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return stmt.items[0].context_expr
    return stmt


def _reads(tree, src: str) -> tuple:
    hits = []

    def visit(node, stmt, func):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.stmt):
            stmt = node
        read = ((isinstance(node, ast.Attribute) and node.attr == "training")
                or (isinstance(node, ast.Name) and node.id == "training")
                or (isinstance(node, ast.keyword) and node.arg == "training"))
        if read and func not in NOT_FORWARD:
            text = ast.get_source_segment(src, _head(stmt)) or ""
            low = text.lower()
            if "dropout" not in low and "gradient_checkpointing" not in low:
                hits.append(text.strip().splitlines()[0] if text.strip() else "training")
        for child in ast.iter_child_nodes(node):
            visit(child, stmt, func)

    visit(tree, None, None)
    return tuple(hits)
