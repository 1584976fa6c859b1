"""Partitioner: assign each node of the scheduled training step to a backend.

    part = partition(order, graph, ["vulkan", "cpu"])  # supports, devices: the backend registry
    print(format_partition(part))

Rules:
  - "cpu" runs every op and must be enabled; another backend takes a node only
    when `supports[backend]` says it has a kernel for it.
  - Inference-only backends (Backend.inference_only) take only nodes with
    no gradient through them: forward nodes none of whose inputs depends on a
    trained parameter.
  - A prefix backend (Backend.role "prefix": htp, coreml) takes the frozen prefix,
    the part of the forward pass it can run before the step (prefix_nodes): forward
    nodes it supports that write no state and read only the step's inputs, frozen
    state and values it computes itself, so an op it cannot run ends the prefix there
    (it and everything computed from it stay on the CPU).  This is the one place that
    decides the split passes/prefix.split_prefix makes; the cost model does not move it.
  - Views (reshape) stay on the backend that holds their input.
  - A cost model picks among candidate assignments (greedy per node, and "as
    much as possible on each accelerator"): the estimated time of every node
    on its backend (FLOPs / rate + a dispatch cost), of every transfer (bytes /
    bandwidth + a latency) and of every hand-over between backends.

Transfers are explicit: the result is a new, verified graph whose nodes are
the step's nodes in schedule order with `transfer` nodes (a value copied from
one backend's memory to another's) and `state_transfer` nodes (a state tensor
copied in before its first use on a backend, or back after a backend updated
it) inserted.  Each value of the new graph lives on exactly one backend, so
each backend's memory is planned separately by the one planner (memory.plan.plan_spaces).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..backends import ALWAYS, Device, registered
from ..ir.graph import Graph, Node, Value, dependents
from ..errors import PockError
from ..ir.verify import verify
from ..memory.plan import MemoryPlan, plan_spaces as _plan_spaces
from ..ops import REGISTRY, flops


# The data-movement ops this pass inserts ("transfer", "state_transfer") are op records (pockengine/ops/state.py, `transfer=True`).


@dataclass
class CostModel:
    devices: dict[str, Device] = field(default_factory=lambda: {b.name: b.device for b in registered()})  # the registered backends' devices

    def node(self, n: Node, backend: str) -> float:
        d = self.devices[backend]
        return flops(n) / d.flops_per_s + (0.0 if REGISTRY[n.op].view else d.dispatch_s)

    def transfer(self, nbytes: int, src: str, dst: str) -> float:
        d = self.devices[dst if src == ALWAYS else src]
        return nbytes / d.transfer_bytes_per_s + d.transfer_s


@dataclass
class Partition:
    graph: Graph                 # the step with transfer nodes, nodes in schedule order
    backend: dict[int, str]      # id(node) -> backend, for every node of graph.nodes
    space: dict[int, str]        # id(value) -> backend whose memory holds it (arena values)
    backends: list[str]
    cost: float                  # estimated seconds per step
    origin: dict[int, Node] = field(default_factory=dict)  # id(node of graph) -> the node of order it copies

    @property
    def order(self) -> list[Node]:
        return self.graph.nodes

    def nodes_on(self, backend: str) -> list[Node]:
        return [n for n in self.graph.nodes if self.backend[id(n)] == backend and not REGISTRY[n.op].transfer]

    def segments(self) -> list[tuple[str, list[Node]]]:
        """Runs of consecutive nodes on one backend (transfers run on the CPU side)."""
        out: list[tuple[str, list[Node]]] = []
        for n in self.graph.nodes:
            b = self.backend[id(n)]
            if out and out[-1][0] == b:
                out[-1][1].append(n)
            else:
                out.append((b, [n]))
        return out


def trained_dependents(order: list[Node]) -> set[int]:
    """id(value) of every value that depends on a parameter some node updates."""
    return dependents(order, {id(n.inputs[0]) for n in order if REGISTRY[n.op].mutates and n.phase == "update"})


def frozen_state(g: Graph) -> set[str]:
    """Names of the state tensors (parameters, buffers, constants) no node of the training step writes."""
    written = {m.name for n in g.nodes for m in n.mutates}
    return {name for name, v in g.state.items() if v.kind in ("param", "buffer", "const") and name not in written}


def _inference_only(b: str) -> bool:
    return any(r.name == b and r.inference_only for r in registered())


def _prefix_role(b: str) -> bool:
    return any(r.name == b and r.role == "prefix" for r in registered())


def prefix_nodes(order: list[Node], g: Graph, supports, frozen: set[str], within: set[int] | None = None) -> set[int]:
    """id(node) of the frozen prefix a prefix backend whose `supports(node)` says what it runs takes:
      - a forward node it supports that writes no state, reads only the step's inputs (model
        inputs and targets: known before the step), `frozen` state and outputs of prefix nodes,
        and whose outputs past its inference result (the op record's torch_outputs: what the
        backward pass saves) nothing reads;
      - of those, the ones that (transitively) read a step input, and the ones reading only
        frozen state (a slice of a positional table) that such a node needs.
    A node it cannot run (or outside `within`, id(node)s, when given) is not a prefix node,
    and neither is anything computed from it.  (passes/prefix.split_prefix limits the step's
    prefix to the part the inference pass shares: work on the targets, or slicing a prefix
    output for a sparse update, stays in the step.)"""
    users = g.users()
    given = {id(v) for v in g.inputs + g.targets}
    ok: set[int] = given | {id(g.state[s]) for s in frozen if s in g.state}
    outs = {id(v) for v in g.outputs}
    taken = []
    for n in order:
        if n.phase != "forward" or n.mutates or not supports(n) or (within is not None and id(n) not in within):
            continue
        if not all(v is None or id(v) in ok for v in n.inputs):
            continue
        computed = REGISTRY[n.op].torch_outputs
        if any(o is not None and i >= computed and (users.get(id(o)) or id(o) in outs)
               for i, o in enumerate(n.outputs)):
            continue
        ok.update(id(o) for o in n.outputs[:computed] if o is not None)
        taken.append(n)
    from_input = dependents(taken, given)
    keep: set[int] = {id(n) for n in taken if any(v is not None and id(v) in from_input for v in n.inputs)}
    needed: set[int] = {id(v) for n in taken if id(n) in keep for v in n.inputs if v is not None}
    for n in reversed(taken):
        if id(n) not in keep and any(o is not None and id(o) in needed for o in n.outputs):
            keep.add(id(n))
            needed.update(id(v) for v in n.inputs if v is not None)
    return keep


def _candidates(n: Node, backends, supports, dep) -> list[str]:
    out = []
    for b in backends:
        if b == ALWAYS:
            out.append(b)
            continue
        if not supports.get(b, lambda n: False)(n):
            continue
        if _inference_only(b) and (n.phase != "forward" or any(v is not None and id(v) in dep for v in n.inputs)):
            continue
        out.append(b)
    return out


def _assign_greedy(order, cands, cost: CostModel) -> dict[int, str]:
    """Each node where its own time plus moving its inputs there is least."""
    where: dict[int, str] = {}
    held: dict[int, set] = {}
    out = {}
    for n in order:
        best, best_t = None, math.inf
        for b in cands[id(n)]:
            t = cost.node(n, b)
            for v in n.inputs:
                if v is not None and b not in held.get(id(v), {where.get(id(v), ALWAYS)}):
                    t += cost.transfer(v.nbytes, where.get(id(v), ALWAYS), b)
            if t < best_t:
                best, best_t = b, t
        out[id(n)] = best
        for v in n.inputs:
            if v is not None:
                held.setdefault(id(v), {where.get(id(v), ALWAYS)}).add(best)
        for o in n.outputs:
            if o is not None:
                where[id(o)] = best
    return out


def _assign_eager(order, cands, backend) -> dict[int, str]:
    return {id(n): backend if backend in cands[id(n)] else ALWAYS for n in order}


def _fix_views(order, assign, fixed) -> None:
    """A view runs where its input lives (it moves no data), unless that is a prefix
    backend, which takes only its prefix nodes (`fixed`)."""
    where, prefix = {}, set(fixed.values())
    for n in order:
        if REGISTRY[n.op].view and n.inputs[0] is not None and id(n.inputs[0]) in where and id(n) not in fixed \
                and where[id(n.inputs[0])] not in prefix:
            assign[id(n)] = where[id(n.inputs[0])]
        for o in n.outputs:
            if o is not None:
                where[id(o)] = assign[id(n)]


def _estimate(order, assign, cost: CostModel) -> float:
    where, held, total, prev = {}, {}, 0.0, ALWAYS
    for n in order:
        b = assign[id(n)]
        total += cost.node(n, b)
        if b != prev:
            total += cost.devices[b if b != ALWAYS else prev].handover_s
            prev = b
        for v in n.inputs:
            if v is None:
                continue
            src = ALWAYS if v.in_state else where.get(id(v), ALWAYS)
            if b not in held.setdefault(id(v), {src}):
                total += cost.transfer(v.nbytes, src, b)
                held[id(v)].add(b)
        for o in n.outputs:
            if o is not None:
                where[id(o)] = b
    return total


def partition(order: list[Node], g: Graph, backends, supports: dict | None = None, cost: CostModel | None = None,
              prefer: str | None = None, frozen: set[str] | None = None, within: set[int] | None = None) -> Partition:
    """order: the scheduled step of g (or the inference pass); supports: {backend: callable(node) -> bool}
    (default: each registered backend's `supports`; the cost model's default: their devices);
    frozen: the state a prefix backend may read (default frozen_state(g); the inference
    graph's split passes the training step's, since only the step writes state);
    within: id(node)s a prefix backend may take at most (default: any; see prefix_nodes).

    A prefix backend among `backends` takes its prefix_nodes whatever the costs.  The cost
    model picks the rest of the assignment unless `prefer` names a backend: then
    every node it can run goes there (what prog.build(backends=["vulkan", "cpu"])
    promises: the trainable part on Vulkan, whatever a small model's costs say)."""
    backends = list(backends)
    if ALWAYS not in backends:
        raise ValueError(f"backends {backends} must include '{ALWAYS}'")
    cost = cost or CostModel()
    if supports is None:
        supports = {r.name: r.supports for r in registered() if r.name in backends and r.name != ALWAYS}
    prefixes = [b for b in backends if _prefix_role(b)]
    if len(prefixes) > 1:
        raise PockError(f"backends {backends} name {len(prefixes)} prefix backends ({', '.join(prefixes)}); "
                        "the frozen prefix runs on one")
    fixed: dict[int, str] = {}
    if prefixes:
        b = prefixes[0]
        can = supports.get(b) or (lambda n: False)
        fixed = dict.fromkeys(prefix_nodes(order, g, can, frozen_state(g) if frozen is None else frozen, within), b)
    dep = trained_dependents(order)
    steps = [b for b in backends if b not in prefixes]  # a prefix backend takes its prefix_nodes only
    cands = {id(n): [fixed[id(n)]] if id(n) in fixed else _candidates(n, steps, supports, dep) for n in order}
    options = [_assign_greedy(order, cands, cost), _assign_eager(order, cands, ALWAYS)]
    options += [_assign_eager(order, cands, b) for b in backends if b != ALWAYS]
    for a in options:
        a.update(fixed)
        _fix_views(order, a, fixed)
    scored = [(_estimate(order, a, cost), i, a) for i, a in enumerate(options)]
    if prefer is not None:
        if prefer not in backends:
            raise ValueError(f"preferred backend {prefer!r} is not among {backends}")
        scored = [scored[2 + [b for b in backends if b != ALWAYS].index(prefer)]] if prefer != ALWAYS else [scored[1]]
    best_cost, _, assign = min(scored, key=lambda t: (t[0], t[1]))
    return _materialize(order, g, assign, backends, best_cost)


def _materialize(order, g: Graph, assign, backends, est) -> Partition:
    """The step as a new graph with transfer nodes; values cloned, state shared.

    Copies to an accelerator go as early as possible (right after the value
    is made, or at the start of the step for inputs and state), copies back
    to the CPU as late as possible (right before the first CPU reader, state
    at the end of the step), so each run of accelerator nodes stays unbroken."""
    pg = Graph(g.name)
    pg._names = set(g._names)
    pg.state = g.state
    clone: dict[int, Value] = {}
    origin: dict[int, Node] = {}

    def copy_value(v: Value) -> Value:
        c = Value(v.name, v.shape, v.dtype, v.kind)
        clone[id(v)] = c
        return c

    pg.inputs = [copy_value(v) for v in g.inputs]
    pg.targets = [copy_value(v) for v in g.targets]
    space: dict[int, str] = {id(v): ALWAYS for v in pg.inputs + pg.targets}
    copies: dict[tuple[int, str], Value] = {}   # (id(value), backend) -> its copy there
    backend: dict[int, str] = {}
    state_on: set[tuple[str, str]] = set()      # (state name, backend): that copy is current
    after: dict[str, Node] = {}                 # state name -> last CPU node that wrote it
    dirty: dict[str, str] = {}                  # state name -> backend holding a newer copy
    head = 0                                    # uploads at the start of the step go before this

    def add(node: Node, b: str, at: int | None = None) -> Node:
        nonlocal head
        if at is None:
            pg.nodes.append(node)
        else:
            pg.nodes.insert(at, node)
            if at <= head:
                head += 1
        backend[id(node)] = b
        for o in node.outputs:
            if o is not None:
                o.producer = node
                space[id(o)] = b
        return node

    def upload_at(producer: Node | None) -> int:
        return head if producer is None else pg.nodes.index(producer) + 1

    def download(name: str) -> None:
        b = dirty.pop(name)
        add(Node("state_transfer", [pg.state[name]], [], {"src": b, "dst": ALWAYS}, phase="transfer"), ALWAYS)

    def on(v: Value, b: str) -> Value:
        if v.in_state:
            if b == ALWAYS and v.name in dirty:
                download(v.name)
            if b != ALWAYS and (v.name, b) not in state_on:
                add(Node("state_transfer", [v], [], {"src": ALWAYS, "dst": b}, phase="transfer"), b,
                    upload_at(after.get(v.name)))
                state_on.add((v.name, b))
            return v
        c = clone[id(v)]
        src = space[id(c)]
        if src == b:
            return c
        key = (id(c), b)
        if key not in copies:
            out = Value(pg._unique(f"{c.name}_{b}"), c.shape, c.dtype)
            node = Node("transfer", [c], [out], {"src": src, "dst": b}, phase="transfer")
            early = b != ALWAYS and src == ALWAYS
            add(node, b if b != ALWAYS else src, upload_at(c.producer) if early else None)
            space[id(out)] = b  # the copy lives where it was sent, whoever runs the copy
            copies[key] = out
        return copies[key]

    for n in order:
        b = assign[id(n)]
        ins = [None if v is None else on(v, b) for v in n.inputs]
        node = add(Node(n.op, ins, [None if o is None else copy_value(o) for o in n.outputs], dict(n.attrs),
                        n.source, n.phase), b)
        origin[id(node)] = n
        for m in n.mutates:
            state_on.difference_update({(m.name, other) for other in backends if other != b})
            if b == ALWAYS:
                after[m.name] = node
            else:
                dirty[m.name] = b
    if g.loss is not None:
        pg.loss = on(g.loss, ALWAYS)
    for name in list(dirty):
        download(name)
    verify(pg, "partition")
    return Partition(pg, backend, space, backends, est, origin)


def plan_spaces(part: Partition, keep_to_end=()) -> dict[str, MemoryPlan]:
    """The partitioned step's memory plan, one per memory space, by the one planner
    (memory.plan.plan_spaces, which codegen.segmented_step calls for every backend)."""
    g = part.graph
    return _plan_spaces(g.nodes, g, keep_to_end, part.space)


def format_partition(part: Partition) -> str:
    """What pock-build prints: nodes and FLOPs per backend, transfers, segments."""
    lines = [f"partition over {', '.join(part.backends)} (estimated {part.cost * 1e6:.1f} us/step):"]
    total = sum(flops(n) for n in part.graph.nodes) or 1
    for b in part.backends:
        ns = part.nodes_on(b)
        if not ns:
            continue
        f = sum(flops(n) for n in ns)
        ops = sorted({n.op for n in ns})
        lines.append(f"  {b:7} {len(ns):4} nodes  {f:>12,} FLOPs ({100 * f / total:5.1f}%)  ops: {', '.join(ops)}")
    moves = [n for n in part.graph.nodes if n.op == "transfer"]
    syncs = [n for n in part.graph.nodes if n.op == "state_transfer"]
    mbytes = sum(n.inputs[0].nbytes for n in moves)
    sbytes = sum(n.inputs[0].nbytes for n in syncs)
    lines.append(f"  transfers: {len(moves)} values ({mbytes:,} bytes), {len(syncs)} state copies ({sbytes:,} bytes)")
    segs = part.segments()
    lines.append(f"  segments: {' -> '.join(f'{b}[{len(ns)}]' for b, ns in segs)}")
    return "\n".join(lines)
