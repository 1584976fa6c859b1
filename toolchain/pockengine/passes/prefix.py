"""The frozen-prefix split behind backend switching.

No gradient flows through the forward ops that read only model inputs and
frozen state (parameters the update scheme leaves alone, buffers nothing
writes, constants), so they need no backward and an inference-only
accelerator (the Hexagon NPU through QNN, Core ML) can run them:

    prefix, suffix = split_prefix(prog, "htp")
    prefix.nodes, prefix.cut  # the prefix's nodes and the values the rest reads (FrozenPrefix)
    suffix.build_cpu()        # the same step with the cut values as inputs

This module is the pass; the prefix as a torch module (what htp and coreml export) is
backends/prefix_torch.py, and the prefix as a trainer's input stage (and a prefix backend's
build) is build/prefix_stage.py.

The partitioner decides the prefix (passes/partition.prefix_nodes, over the prefix
backend and "cpu"): a prefix node is a forward node that
  - reads only model inputs, frozen state and other prefix outputs,
  - writes no state and draws no random numbers (train-mode BatchNorm and
    dropout stop it), and
  - the backend's record `supports`; for htp and coreml that is `torch_supports`: a
    torch reference (its op record's `torch`, `TORCH_OPS` here), so the prefix exports
    to ONNX and converts with coremltools.  An op the backend cannot run ends the
    prefix there.
Nodes that read only frozen state (a slice of a frozen positional table) join
the prefix only when a prefix node reads them.  The cut values are the prefix
outputs the rest of the step (or the inference pass) reads.

The training step and the inference pass share one prefix model, so both
graphs are cut at the same nodes: the inference graph is derived from the
step's (passes/inference.py), each of its nodes carrying the step's node it
came from (`Node.origin`), and the cut pairs them by it.  If the step does not
compute an inference prefix node alike (a frozen layer's dropout left in train
mode draws random numbers in the step) the split is a PockError naming the node.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import PockError
from ..ir.graph import Graph, Node, Value, index_ranges
from ..ir.verify import verify
from ..ops import REGISTRY
from ..ops.torchref import TORCH_DTYPE as _TORCH_DTYPE
from .partition import ALWAYS, frozen_state, partition


# ---- choosing the prefix ---------------------------------------------------------------
def torch_supports(n: Node) -> bool:
    """What the prefix's torch module (exported to ONNX, traced for coremltools) runs: an op
    with a torch reference, with no fused activation other than ReLU/ReLU6.  The htp and
    coreml backends declare it as their `supports`; passes/partition.prefix_nodes decides
    the prefix with it."""
    return REGISTRY[n.op].torch is not None and n.attrs.get("act") in (None, "relu", "relu6")


def prefix_partitions(prog, backend: str = "htp"):
    """The partitions of the training step and of the inference pass over [backend, "cpu"]:
    the nodes on `backend` are each graph's frozen prefix (passes/partition.prefix_nodes; both
    read the state the training step leaves frozen)."""
    frozen = frozen_state(prog.graph)
    return (partition(prog.order, prog.graph, [backend, ALWAYS], frozen=frozen),
            partition(prog.forward_order, prog.forward_graph, [backend, ALWAYS], frozen=frozen))


def _nodes_on(part, g: Graph, backend: str) -> list[Node]:
    """g's nodes the partition puts on `backend`, in g's order."""
    mine = {id(part.origin[id(n)]) for n in part.nodes_on(backend)}
    return [n for n in g.nodes if id(n) in mine]


def _attrs(n: Node) -> tuple:
    return tuple(sorted((key, repr(val)) for key, val in n.attrs.items()))


def _alike(fn: Node, tn: Node, same: dict[int, Value]) -> bool:
    """Whether the step's node `tn` computes what inference's `fn` does: the same op and
    attributes over the same inputs (`same`: id(inference value) -> the step's value),
    with every output `fn` has."""
    if tn.op != fn.op or _attrs(tn) != _attrs(fn) or len(tn.inputs) != len(fn.inputs):
        return False
    if any((v is None) != (w is None) or (v is not None and same.get(id(v)) is not w)
           for v, w in zip(fn.inputs, tn.inputs)):
        return False
    return all(o is None or (j < len(tn.outputs) and tn.outputs[j] is not None) for j, o in enumerate(fn.outputs))


def _shared(g: Graph, tnodes: list[Node], fg: Graph, fnodes: list[Node]):
    """The cut on shared nodes: each of inference's prefix nodes paired with the training
    step's prefix node it was derived from (the same `origin`, passes/inference.py), which
    must compute the same (op, attributes, inputs: the model's inputs, the same state or a
    paired node's outputs).  Returns (the step's paired nodes in its order, the rest of its
    prefix nodes: forward work only the step does, e.g. slicing a saved activation, left to
    the suffix), id(inference value) -> the step's value, and the positions in `fnodes` of
    the nodes without a partner."""
    by_origin = {n.origin: n for n in tnodes if n.origin is not None}
    same: dict[int, Value] = {id(v): w for v, w in zip(fg.inputs, g.inputs)}
    same.update({id(v): g.state[name] for name, v in fg.state.items() if name in g.state})
    paired, missing = set(), []
    for k, fn in enumerate(fnodes):
        tn = by_origin.get(fn.origin)
        if tn is None or not _alike(fn, tn, same):
            if any(o is not None for o in fn.outputs):  # (a node with no outputs feeds nothing)
                missing.append(k)
            continue
        paired.add(id(tn))
        same.update({id(o): tn.outputs[j] for j, o in enumerate(fn.outputs) if o is not None})
    return [n for n in tnodes if id(n) in paired], [n for n in tnodes if id(n) not in paired], same, missing


def _cut_values(g: Graph, nodes: list[Node]) -> list[Value]:
    """Prefix outputs that a node outside the prefix (or the user outputs) reads, in program order."""
    inside = {id(n) for n in nodes}
    produced = {id(o): o for n in nodes for o in n.outputs if o is not None}
    seen, cut = set(), []
    for n in g.nodes:
        if id(n) in inside:
            continue
        for v in n.inputs:
            if v is not None and id(v) in produced and id(v) not in seen:
                seen.add(id(v))
                cut.append(v)
    for v in g.outputs:
        if id(v) in produced and id(v) not in seen:
            seen.add(id(v))
            cut.append(v)
    return cut


def _stopper(train: Graph, fn: Node) -> Node | None:
    """The train-mode BatchNorm or dropout that keeps inference's prefix node `fn` out of the step's prefix:
    upstream of the step's node `fn` was derived from (else of its module's nodes)."""
    todo = [n for n in train.nodes if n.origin is not None and n.origin == fn.origin] or \
        [n for n in train.nodes if n.phase == "forward" and n.source == fn.source
         and (n.op == fn.op or n.op == "batch_norm_train")]
    seen: set[int] = set()
    while todo:
        n = todo.pop(0)
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ("batch_norm_train", "dropout"):
            return n
        todo += [v.producer for v in n.inputs if v is not None and v.producer is not None]
    return None


def _mismatch(train: Graph, fnodes: list[Node], missing: list[int]) -> PockError:
    fn = fnodes[missing[0]]
    where = fn.source or "the model"
    stop = _stopper(train, fn)
    if stop is not None and stop.op == "batch_norm_train":
        where = stop.source or where
        why = (f"the training step runs batch_norm_train in {where}, which uses batch statistics and updates the "
               f"running ones (so it cannot be in the prefix), while inference runs {fn.op} there; put frozen "
               f"BatchNorm layers in eval() (e.g. model.bn.eval()) before pe.compile")
    elif stop is not None:
        where = stop.source or where
        why = (f"the training step runs dropout in {where}, which draws random numbers (so it cannot be in the "
               f"prefix); put frozen layers with dropout in eval() (or use p=0) before pe.compile")
    else:
        why = f"inference's prefix runs {fn.op} from {where}, which the training step computes differently"
    return PockError(f"the frozen prefix differs between the training step and inference: {why}")


# ---- the split -----------------------------------------------------------------------------
def _suffix_graph(g: Graph, nodes: list[Node], cut: list[Value], names: list[str], kept: list[int]) -> Graph:
    h, vmap = g.clone()
    drop = {id(n) for n in nodes}
    h.nodes = [m for m, n in zip(h.nodes, g.nodes) if id(n) not in drop]
    new_inputs = []
    for v, name in zip(cut, names):
        c = vmap[id(v)]
        c.kind, c.producer, c.name = "input", None, name
        h._names.add(name)
        new_inputs.append(c)
    h.inputs = [h.inputs[i] for i in kept] + new_inputs
    read = {id(v) for n in h.nodes for v in n.inputs if v is not None}
    only_prefix = {v.name for n in nodes for v in n.inputs if v is not None and v.in_state}
    h.state = {name: v for name, v in h.state.items() if name not in only_prefix or id(v) in read}
    return verify(h, "frozen-prefix split")


class FrozenPrefix:
    """The frozen prefix of a program: what an inference runtime computes before the step."""

    def __init__(self, graph: Graph, nodes: list[Node], cut: list[Value], names: list[str], input_index: list[int],
                 kept_inputs: list[int], int_ranges: dict[int, int], backend: str = "htp", partition=None):
        self.graph, self.nodes, self.cut = graph, nodes, cut
        self.backend = backend            # the prefix backend it was cut for
        self.partition = partition        # the training step's partition (format_partition shows the split)
        self.input_index = input_index    # positions in the model's inputs that the prefix reads
        self.kept_inputs = kept_inputs    # positions in the model's inputs that the suffix still reads
        self.int_ranges = int_ranges      # prefix input position -> exclusive upper bound of its indices
        self.inputs = [{"name": graph.inputs[i].name, "shape": list(graph.inputs[i].shape),
                        "dtype": graph.inputs[i].dtype} for i in input_index]
        self.outputs = [{"name": name, "shape": list(v.shape), "dtype": v.dtype} for v, name in zip(cut, names)]
        self.frozen_state = {name: graph.state[name].data for name in self.state_names()}
        self.example_inputs = self.random_inputs(0)

    def random_inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        """Valid inputs of the right shapes (indices inside their embedding tables)."""
        g = torch.Generator().manual_seed(seed)
        out = []
        for k, io in enumerate(self.inputs):
            shape, dtype = tuple(io["shape"]), io["dtype"]
            if dtype == "f32":
                out.append(torch.randn(shape, generator=g))
            elif dtype == "u8":
                out.append(torch.randint(0, 2, shape, generator=g).bool())
            else:
                out.append(torch.randint(0, self.int_ranges.get(k, 2), shape, generator=g, dtype=_TORCH_DTYPE[dtype]))
        return tuple(out)

    def check_inputs(self, inputs) -> None:
        """PockError unless integer indices lie inside the tables they index."""
        for k, hi in self.int_ranges.items():
            x = np.asarray(inputs[k])
            if x.size and (x.min() < 0 or x.max() >= hi):
                raise PockError(f"input {self.inputs[k]['name']!r}: index {int(x.min() if x.min() < 0 else x.max())} "
                                f"is outside [0, {hi}) of the embedding it selects")

    def state_names(self) -> list[str]:
        return sorted({v.name for n in self.nodes for v in n.inputs if v is not None and v.in_state})

    def manifest(self, files: dict | None = None, soc=None, precision: str = "fp32", runtime: str = "onnx") -> dict:
        """manifest["prefix"] of the model bundle: how an SDK runs the prefix before each step."""
        return {
            "format": 1,
            "runtime": runtime,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "input_index": self.input_index,
            "kept_inputs": self.kept_inputs,
            "files": dict(files or {}),
            "soc": getattr(soc, "name", soc),
            "htp_arch": getattr(soc, "htp_arch", None),
            "qnn_soc_model": getattr(soc, "qnn_soc_model", None),
            "precision": precision,
        }

    def __repr__(self) -> str:
        ops = ", ".join(n.op for n in self.nodes)
        return f"<FrozenPrefix {len(self.nodes)} nodes ({ops}) -> {[o['name'] for o in self.outputs]}>"


def _embedding_ranges(g: Graph, nodes: list[Node], input_index: list[int]) -> dict[int, int]:
    """prefix input position -> number of rows of the embedding its values (through views) index
    (ir.graph.index_ranges over the prefix nodes)."""
    ranges = index_ranges(nodes, [g.inputs[i] for i in input_index])
    return {k: ranges[id(g.inputs[i])][1] for k, i in enumerate(input_index) if id(g.inputs[i]) in ranges}


def split_prefix(prog, backend: str = "htp"):
    """(FrozenPrefix, suffix Program), or (None, prog) when the prefix is empty or only moves data.

    The prefix is what the partitioner puts on the prefix `backend` (its record's `supports`
    says what it runs) in the inference pass, and the same nodes of the training step (each
    inference node is derived from one of the step's: `Node.origin`); this checks the step
    computes each of them alike and cuts both graphs there."""
    g, fg = prog.graph, prog.forward_graph
    tpart, fpart = prefix_partitions(prog, backend)
    tnodes, fnodes = _nodes_on(tpart, g, backend), _nodes_on(fpart, fg, backend)
    if all(REGISTRY[n.op].layout for n in tnodes) and all(REGISTRY[n.op].layout for n in fnodes):
        return None, prog
    tnodes, extra, same, missing = _shared(g, tnodes, fg, fnodes)
    if missing:
        raise _mismatch(g, fnodes, missing)
    if extra:  # forward work only the step does (on the targets, slicing a saved prefix output) stays on the CPU
        tpart = partition(prog.order, g, [backend, ALWAYS], frozen=frozen_state(g), within={id(n) for n in tnodes})
    # one set of cut values serves both graphs (each suffix ignores those it does not read)
    fcut = _cut_values(fg, fnodes)
    tcut = [same[id(v)] for v in fcut]
    back = {id(w): v for v, w in ((v, same.get(id(v))) for n in fnodes for v in n.outputs if v is not None)
            if w is not None}
    for w in _cut_values(g, tnodes):
        if not any(w is t for t in tcut):
            fcut.append(back[id(w)])
            tcut.append(w)
    names = [f"prefix{i}_{v.name}" for i, v in enumerate(fcut)]
    # model inputs: the prefix reads some, the suffix keeps those any remaining node reads
    in_prefix = {id(v) for n in fnodes for v in n.inputs if v is not None}
    input_index = [i for i, v in enumerate(fg.inputs) if id(v) in in_prefix]
    kept = []
    for i in range(len(g.inputs)):
        for graph, nodes in ((g, tnodes), (fg, fnodes)):
            inside = {id(n) for n in nodes}
            if any(id(n) not in inside and any(v is graph.inputs[i] for v in n.inputs) for n in graph.nodes):
                kept.append(i)
                break
    if not input_index:
        return None, prog
    train = _suffix_graph(g, tnodes, tcut, names, kept)
    forward = _suffix_graph(fg, fnodes, fcut, names, kept)
    suffix = prog.with_graphs(train, forward)
    prefix = FrozenPrefix(fg, fnodes, fcut, names, input_index, kept, _embedding_ranges(fg, fnodes, input_index),
                          backend, tpart)
    return prefix, suffix


__all__ = ["split_prefix", "FrozenPrefix", "frozen_state", "prefix_partitions", "torch_supports"]
