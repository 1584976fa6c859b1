"""PockEngine's IR: a typed SSA graph with static shapes.

A `Value` is a tensor with a fixed shape and dtype. Its `kind` says where it
lives: user inputs/targets and temporaries live in the arena (the memory plan);
parameters, buffers, constants and optimizer state live in the state region.
A `Node` applies one op (its record in pockengine/ops) to input values and defines output
values; ops that write state in place (optimizer updates, running-stat
assignment) list the state values they write in `mutates`.
Every node remembers the module path it came from (`source`) and whether it
belongs to the forward, backward or update phase.  A forward node of the inference graph
also remembers the training-graph node it computes as (`origin`: the number
passes/inference.py gives each node of the training-mode export, kept by `clone` and by
the passes that fuse a chain into one node), so the two graphs share their forward nodes
by identity (passes/prefix.py cuts both at the same ones).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES = {"f32": 4, "i64": 8, "i32": 4, "u8": 1, "bf16": 2, "f16": 2, "i8": 1,
               "q4": 1}  # q4: packed nibbles, the Value's shape is the storage's [N, K / 2]
ARENA_KINDS = ("input", "target", "temp")
STATE_KINDS = ("param", "buffer", "const", "opt_state")


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "temp"
    producer: "Node | None" = None
    data: Any = None  # initial contents (numpy) for state values

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def in_state(self) -> bool:
        return self.kind in STATE_KINDS

    def __repr__(self) -> str:
        return f"%{self.name}:{self.dtype}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value | None]
    outputs: list[Value | None]
    attrs: dict = field(default_factory=dict)
    source: str = ""
    phase: str = "forward"  # "forward" | "backward" | "update"
    origin: int | None = None  # the export's node this one computes as (None: added after the export)

    @property
    def mutates(self) -> list[Value]:
        from ..ops.record import REGISTRY

        return [self.inputs[i] for i in REGISTRY[self.op].mutates if self.inputs[i] is not None]

    @property
    def out(self) -> Value:
        return self.outputs[0]

    def __repr__(self) -> str:
        outs = ", ".join(repr(o) for o in self.outputs if o is not None)
        ins = ", ".join("None" if v is None else f"%{v.name}" for v in self.inputs)
        attrs = "".join(f", {k}={v}" for k, v in self.attrs.items())
        src = f"  # {self.source}" if self.source else ""
        return f"{outs or '()'} = {self.op}({ins}{attrs}){src}"


class Graph:
    """Nodes in program order plus the named tensors the program is about."""

    def __init__(self, name: str = "model"):
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.targets: list[Value] = []
        self.outputs: list[Value] = []  # user outputs (the forward graph)
        self.loss: Value | None = None
        self.state: dict[str, Value] = {}  # params, buffers, consts, opt_state by name
        self._names: set[str] = set()

    def clone(self) -> tuple["Graph", dict[int, Value]]:
        """A structural copy with fresh Values and Nodes (numpy data shared: passes never
        write it); returns (copy, id(old value) -> new value)."""
        vmap: dict[int, Value] = {}

        def cp(v):
            if v is None:
                return None
            if id(v) not in vmap:
                vmap[id(v)] = Value(v.name, v.shape, v.dtype, v.kind, None, v.data)
            return vmap[id(v)]

        h = Graph(self.name)
        h._names = set(self._names)
        h.state = {name: cp(v) for name, v in self.state.items()}
        h.inputs, h.targets = [cp(v) for v in self.inputs], [cp(v) for v in self.targets]
        for n in self.nodes:
            m = Node(n.op, [cp(v) for v in n.inputs], [cp(o) for o in n.outputs], dict(n.attrs), n.source, n.phase,
                     n.origin)
            for o in m.outputs:
                if o is not None:
                    o.producer = m
            h.nodes.append(m)
        h.loss = cp(self.loss)
        h.outputs = [cp(v) for v in self.outputs]
        return h, vmap

    # -- values ------------------------------------------------------------
    def _unique(self, base: str) -> str:
        base = base.replace(".", "_").replace(":", "_") or "v"
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    def new_value(self, base: str, shape, dtype: str, kind: str = "temp") -> Value:
        assert dtype in DTYPE_BYTES, dtype
        return Value(self._unique(base), tuple(int(s) for s in shape), dtype, kind)

    def add_state(self, name: str, shape, dtype: str, kind: str, data=None) -> Value:
        assert kind in STATE_KINDS and name not in self.state, name
        v = Value(name, tuple(int(s) for s in shape), dtype, kind, data=data)
        self._names.add(name)
        self.state[name] = v
        return v

    def add_input(self, name: str, shape, dtype: str, kind: str = "input") -> Value:
        v = self.new_value(name, shape, dtype, kind)
        (self.inputs if kind == "input" else self.targets).append(v)
        return v

    # -- nodes -------------------------------------------------------------
    def add(self, op: str, inputs, attrs=None, *, source="", phase="forward", name=None, wanted=None):
        """Append a node; output shapes come from the op table. `wanted[i] =
        False` leaves optional output i absent (None). Returns the outputs
        (a single Value when the op has one output)."""
        from ..ops.record import infer

        attrs = dict(attrs or {})
        specs = infer(op, list(inputs), attrs)
        outs = []
        for i, (shape, dtype) in enumerate(specs):
            if wanted is not None and not wanted[i]:
                outs.append(None)
            else:
                outs.append(self.new_value(name or op, shape, dtype))
        node = Node(op, list(inputs), outs, attrs, source, phase)
        for o in outs:
            if o is not None:
                o.producer = node
        self.nodes.append(node)
        return outs[0] if len(outs) == 1 else outs

    def params(self) -> list[Value]:
        return [v for v in self.state.values() if v.kind == "param"]

    def users(self) -> dict[int, list[Node]]:
        """id(value) -> nodes reading it, in program order."""
        table: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    table.setdefault(id(v), []).append(n)
        return table

    def dump(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"  in  {v!r}" for v in self.inputs + self.targets]
        lines += [f"  {v.kind:9} {v!r}" for v in self.state.values()]
        lines.append(")")
        lines += [f"  [{n.phase[0]}] {n!r}" for n in self.nodes]
        if self.loss is not None:
            lines.append(f"  loss {self.loss!r}")
        lines += [f"  out {v!r}" for v in self.outputs]
        return "\n".join(lines)


def dependents(nodes, roots: set[int], follow=None) -> set[int]:
    """The one dependence walk: id(value) of `roots` and of every output of a forward node
    (in `nodes`' order) that reads one of them.  `follow(node, output)` False stops the walk
    at that output (autodiff: integers and stop_gradient carry no gradient).  Used for "needs
    a gradient" (autodiff/backward.requires_grad) and "depends on a trained parameter"
    (passes/partition.trained_dependents: what an inference-only backend may not take)."""
    dep = set(roots)
    for n in nodes:
        if n.phase == "forward" and any(v is not None and id(v) in dep for v in n.inputs):
            dep.update(id(o) for o in n.outputs if o is not None and (follow is None or follow(n, o)))
    return dep


# ops whose output indices are all indices of their input (cat: of each input; slice, permute,
# expand: of input 0, the others are not data)
_INDEX_VIEWS = {"reshape": None, "cat": None, "transfer": None, "slice": 1, "permute": 1, "expand": 1}


def index_ranges(nodes, roots) -> dict[int, tuple[int, int, int | None]]:
    """The one integer-range analysis: id(root) -> (lo, hi, ignore) for each of `roots` (integer
    values) whose values index something through value-preserving ops (_INDEX_VIEWS) in `nodes`
    (program order): [0, rows) of an embedding table, [0, classes) of cross_entropy / nll_loss
    targets (ignore: their ignore_index, None unless every such use agrees).  Several uses
    intersect.  Used by pock_step's entry checks (codegen.int_ranges) and the frozen prefix's
    input checks (passes/prefix.py); indices computed any other way (x + 1, ...) are not followed."""
    origin: dict[int, list[int]] = {id(r): [id(r)] for r in roots}
    ranges: dict[int, tuple[int, int, int | None]] = {}

    def merge(rs, lo, hi, ignore):
        for r in rs:
            old = ranges.get(r)
            a, b, ign = lo, hi, ignore
            if old is not None:
                a, b = max(a, old[0]), min(b, old[1])
                ign = ign if ign == old[2] else None
            ranges[r] = (a, b, ign)

    for n in nodes:
        if n.op in _INDEX_VIEWS:
            srcs = n.inputs[:_INDEX_VIEWS[n.op]]
            rs = [r for v in srcs if v is not None for r in origin.get(id(v), ())]
            if rs and n.outputs[0] is not None:
                origin[id(n.outputs[0])] = list(dict.fromkeys(rs))
        elif n.op == "embedding" and n.inputs[1] is not None and id(n.inputs[1]) in origin:
            merge(origin[id(n.inputs[1])], 0, n.inputs[0].shape[0], None)
        elif n.op in ("cross_entropy", "nll_loss") and id(n.inputs[1]) in origin:
            merge(origin[id(n.inputs[1])], 0, n.inputs[0].shape[1], n.attrs["ignore_index"])
        elif n.op == "linear_cross_entropy" and id(n.inputs[3]) in origin:  # the head's rows are the classes
            merge(origin[id(n.inputs[3])], 0, n.inputs[1].shape[0], n.attrs["ignore_index"])
    return ranges
