"""Render a compiled program into one C++17 translation unit (jinja2)."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ..backends import ALWAYS
from . import emit as cpu
from .emit import Emit, EmitOptions
from .decoder import decoder_source
from ..ir.graph import Graph, Node, Value, index_ranges
from ..ops import REGISTRY, flops
from ..ops.cpp import CTYPE, MACRO, _n, cstr
from ..memory.plan import plan_spaces, root_of
from ..ops.state import fused_weight_update

ROOT = Path(__file__).resolve().parents[3]  # the checkout, when running from one
# native/ (runtime sources, shaders, templates) ships inside the package: pockengine/_native is
# a link to the checkout's codegen/ and a copy of it in an installed wheel
CODEGEN_DIR = (Path(__file__).resolve().parents[1] / "_native").resolve()
RUNTIME_DIR = CODEGEN_DIR / "runtime"
DTYPE_CODE = {"f32": 0, "i64": 1, "i32": 2, "u8": 3, "bf16": 4, "f16": 5, "i8": 6,
              "q4": 3}  # q4: the C API sees its packed bytes
KIND_CODE = {"param": 0, "buffer": 1, "opt_state": 2, "const": 3}
VERSION = "0.1.0"


@dataclass(frozen=True)
class Source:
    """The emitted step: one C++ translation unit and its structural hash, for one set of
    backends.  The library is built from `text`; the bundle, summary, checkpoint and CLI
    take `hash` from here (nothing re-renders to learn it)."""
    text: str
    hash: str
    backends: tuple[str, ...] = ("cpu",)
    partition: object = field(default=None, compare=False, repr=False)  # passes/partition.Partition or None


def finish(template, ctx: dict) -> tuple[str, str]:
    """Render `template` with ctx; the hash is that of the text rendered with a zero hash."""
    ctx["hash"] = "0" * 16
    digest = hashlib.sha256(template.render(**ctx).encode()).hexdigest()[:16]
    ctx["hash"] = digest
    return template.render(**ctx), digest




def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(CODEGEN_DIR / "templates")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["cstr"] = cstr
    return env


_KERNEL_CALL = re.compile(r"\bpk::(\w+)\s*(?:<[^<>()]*>)?\s*\(")
_KERNEL_ENUM = re.compile(r"\bpk::(?:Binary|Unary)::(\w+)")


def kernel_name(lines: list[str]) -> str:
    """The kernel(s) a node's C++ lines call, for the profiler: "linear_fwd",
    "binary:add", "fill+linear_bwd_weight"; "view" when they hold no code."""
    names: list[str] = []
    code = False
    for line in lines:
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        code = True
        for m in _KERNEL_CALL.finditer(line):
            name = m.group(1)
            if name in ("binary", "unary"):
                e = _KERNEL_ENUM.search(line, m.end())
                name += f":{e.group(1).lower()}" if e else ""
            if name not in names:
                names.append(name)
    if names:
        return "+".join(names)
    return "inline" if code else "view"


CXX_WORDS = frozenset("""A S ctx prof prof_t alignas and asm auto bool break case catch char class const continue default
delete do double else enum explicit extern false float for friend goto if inline int long mutable namespace new
not operator or private protected public register return short signed sizeof static struct switch template this
throw true try typedef typename union unsigned using virtual void volatile while xor""".split())


class BufferNames:
    """C names for one function's buffers, after the module path as in llm.c: a module's
    output (that of its last forward node) is `<module>_out` (`blocks_1_fc1_out`), the
    other values it computes `<module>_<op>` (`blocks_1_gelu`), a state tensor its own name (`blocks_1_fc1_weight`),
    a parameter's gradient `d_<parameter>` (`d_blocks_1_fc1_weight`), any other backward
    value `d_<module>_<op>`.  Calling it with a value returns the name and, on first use,
    records its declaration (`float* const name = F32(A, offset);  // f32[4, 32]`)."""

    def __init__(self, graph: Graph, arena_offset, state_offset):
        self.arena_offset, self.state_offset = arena_offset, state_offset
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()
        self.decls: list[str] = []
        self.decl_of: dict[str, str] = {}  # name -> its declaration (a chunk function declares those it uses)
        self.grad_of = {id(n.inputs[1]): n.inputs[0].name for n in graph.nodes
                        if n.op in ("sgd_update", "adamw_update")}
        self.last = {n.source: n for n in graph.nodes if n.phase == "forward"}  # each module's output node

    def base(self, v: Value) -> str:
        if v.in_state or v.producer is None:
            return v.name
        if id(v) in self.grad_of:
            return "d_" + self.grad_of[id(v)]
        n = v.producer
        if n.op == "transfer":  # a copy between backends (a partitioned step): its source, on the destination
            return f"{self.base(n.inputs[0])}_{n.attrs['dst']}"
        module = n.source.partition(" (")[0]
        own = [o for o in n.outputs if o is not None]
        k = own.index(v) if v in own else 0
        if n.phase == "forward":
            stem = f"{module}_out" if self.last.get(n.source) is n else f"{module}_{n.op}"
            return stem if k == 0 else f"{stem}{k}"
        stem = f"d_{module}_{n.op}"
        return stem if k == 0 else f"{stem}{k}"

    def __call__(self, v: Value) -> str:
        name = self.names.get(id(v))
        if name is not None:
            return name
        name = re.sub(r"_+", "_", re.sub(r"\W", "_", self.base(v))).strip("_") or "t"
        if name[0].isdigit() or name in CXX_WORDS:
            name = "m_" + name
        stem, i = name, 1
        while name in self.taken:
            i += 1
            name = f"{stem}_{i}"
        self.taken.add(name)
        self.names[id(v)] = name
        root = root_of(v)  # a view of a state tensor (Conv1d's weight seen as 2-D) points into the state
        where = f"S, {self.state_offset[root.name]}" if root.in_state else f"A, {self.arena_offset(v)}"
        self.decls.append(f"{CTYPE[v.dtype]}* const {name} = {MACRO[v.dtype]}({where});  // {v.dtype}{list(v.shape)}")
        self.decl_of[name] = self.decls[-1]
        return name


UPDATES = ("sgd_update", "adamw_update")


def reader_counts(order: list[Node]) -> dict[int, int]:
    """{id(value): how many inputs of the nodes in order read it}."""
    users: dict[int, int] = {}
    for n in order:
        for v in n.inputs:
            if v is not None:
                users[id(v)] = users.get(id(v), 0) + 1
    return users


def fusable_updates(order: list[Node], on_cpu=None) -> dict[int, Node]:
    """{id(linear_bwd_weight node): the update node fused into it}: the update of an fp32
    weight whose gradient that node computes whole (one kernel, read by nothing but the
    update), over the whole [N, k] gradient, with no node between the two reading or
    writing the weight or its optimizer state (the update moves up to the gradient).
    Only for steps without the exact non-finite guard (that one needs every gradient
    checked before any update runs); on_cpu(node): whether the CPU runs it (a partitioned
    step; default every node)."""
    users = reader_counts(order)
    pos = {id(n): i for i, n in enumerate(order)}
    out = {}
    for u in order:
        if u.op not in UPDATES or on_cpu is not None and not on_cpu(u):
            continue
        grad, param = u.inputs[1], u.inputs[0]
        n = grad.producer
        if n is None or n.op != "linear_bwd_weight" or id(n) not in pos or users.get(id(grad)) != 1:
            continue
        if on_cpu is not None and not on_cpu(n):
            continue
        if any(v.dtype != "f32" for v in (*n.inputs, param)) or len(param.shape) != 2:
            continue
        N, K = param.shape
        k = n.attrs["k"]
        if tuple(u.attrs["region"]) not in ((1, N * K, N * K) if k == K else (N, k, K),):
            continue
        touched = {id(root_of(v)) for v in u.inputs if v is not None and v is not grad}
        between = order[pos[id(n)] + 1:pos[id(u)]]
        if any(id(root_of(v)) in touched for m in between for v in (*m.inputs, *m.outputs) if v is not None):
            continue
        out[id(n)] = u
    return out


def kernel_checks(order: list[Node], checks: dict[int, list[Node]], on_cpu=None) -> dict[int, Node]:
    """{id(node): the update whose gradient's check its kernel makes} for the exact guard: a
    checked gradient's producer whose record has a cpu_finite form tests the gradient as it
    stores it instead of a second pass (all_finite) over it.  A producer that sums onto
    another gradient (its `inplace` input: a tied head's gradient under an embedding's rows)
    checks only what it wrote, so that input's producer checks its own output too (it must
    have the form and no other reader); otherwise the gradient keeps the separate check.
    on_cpu(node): whether the CPU runs it (a partitioned step; default every node)."""
    users = reader_counts(order)
    by_id = {id(n): n for n in order}

    def chain(n: Node) -> list[Node] | None:  # n and the producers of what it sums onto
        rec = REGISTRY[n.op]
        if rec.cpu_finite is None or on_cpu is not None and not on_cpu(n):
            return None
        out = [n]
        for i in rec.inplace:
            v = n.inputs[i] if i < len(n.inputs) else None
            if v is None:
                continue
            below = chain(v.producer) if v.producer is not None and users.get(id(v)) == 1 else None
            if below is None:
                return None
            out += below
        return out

    out: dict[int, Node] = {}
    for pid, updates in checks.items():
        n = by_id.get(pid)
        if n is None or any(u.inputs[1] is not n.outputs[0] for u in updates):
            continue
        for m in chain(n) or ():
            out[id(m)] = updates[0]
    return out


class Segments:
    """What an accelerator running part of a partitioned step (passes/partition.py) hands the
    one step loop (_blocks): the emission of its own nodes and of the segment edges.  The loop
    (buffer names, the non-finite guard, profiling, chunks, fused updates and kernel checks of
    the CPU nodes) is codegen's; a run of consecutive accelerator nodes is one segment, opened
    by `begin` before its first node and closed by `end` before the next host-side node (a CPU
    node or a transfer), before a guard that must read what it computed, and at the end of the
    step.  Lines emitted while a segment is open run on the host before the segment does.
    backends/vulkan.py (VulkanSegments) is the one implementation; see docs/adding_a_backend.md."""

    name = ""          # the backend's name: its template (<name>.cpp.j2) and its context there
    template = "model.cpp.j2"

    def __init__(self, prog, part, plans: dict, emit: Emit):
        self.prog, self.part, self.plans, self.emit = prog, part, plans, emit

    def runs(self, n: Node) -> bool:
        """Whether node n runs in this backend's segments (transfers run on the host)."""
        return self.part.backend[id(n)] == self.name and not REGISTRY[n.op].transfer

    def on_host(self, v: Value) -> bool:
        """Whether the host's arena holds v (or v is state)."""
        return root_of(v).in_state or self.part.space.get(id(v), ALWAYS) == ALWAYS

    def begin(self) -> list[str]:
        return []

    def node(self, i: int, n: Node) -> tuple[list[str], str]:
        """(host lines, profiler kernel name) recording node i into the open segment."""
        raise NotImplementedError

    def end(self) -> list[str]:
        """The lines that run the open segment and wait for it."""
        raise NotImplementedError

    def transfer(self, n: Node) -> list[str]:
        """A transfer or state_transfer node's copy, run by the host between segments."""
        raise NotImplementedError

    def host_ptr(self, v: Value) -> str:
        """A float pointer through which the host reads v where it lives (after its segment ran)."""
        raise NotImplementedError

    def context(self) -> dict:
        """The backend's template context, after the loop."""
        return {}


def _loss_source(g: Graph) -> Value | None:
    """The value a partitioned step computes its loss in, when the host's loss is a copy of it."""
    p = g.loss.producer if g.loss is not None else None
    return p.inputs[0] if p is not None and p.op == "transfer" else None


def _blocks(order: list[Node], emit: Emit, seg: Segments | None = None) -> list[dict]:
    """One block per node of `order`: its lines, the checks of the non-finite guard around
    them, its kernel for the profiler.  seg: the accelerator's Segments when the step is
    partitioned (None: every node on the CPU)."""
    blocks = []
    guarded = False
    options = emit.options
    exact = options.nonfinite_guard and options.exact_skip
    on_cpu = None if seg is None else (lambda n: not seg.runs(n) and not REGISTRY[n.op].transfer)
    # the exact guard: each gradient an update reads is checked right after the node that
    # computes it (still in cache); the updates all run later, after every check passed
    checks: dict[int, list[Node]] = {}
    if exact:
        placed = {id(n) for n in order}
        for n in order:
            if n.op in ("sgd_update", "adamw_update"):
                p = n.inputs[1].producer
                checks.setdefault(id(p) if p is not None and id(p) in placed else 0, []).append(n)
    # the exact guard's checks made by the kernels computing the gradients (kernel_checks)
    cpu_only = () if seg is None else (on_cpu,)
    by_kernel = kernel_checks(order, checks, *cpu_only) if exact else {}
    # the optimizer update fused into the weight gradient's GEMM (no exact guard, see fusable_updates)
    fused = fusable_updates(order, *cpu_only) if not exact and options.fuse_updates else {}
    fused_into = {id(u): n for n in order if id(n) in fused for u in (fused[id(n)],)}

    def ptr(v: Value) -> str:  # where the host reads v
        return emit.p(v) if seg is None or seg.on_host(v) else seg.host_ptr(v)

    # a partitioned step: the open segment (its values are read after it ran) and the host
    # checks waiting for it to run
    is_open, computing, waiting = False, set(), []
    loss = None if seg is None else _loss_source(seg.part.graph)
    for i, n in enumerate(order):
        pre: list[str] = []
        accel = seg is not None and seg.runs(n)
        update_waits = (accel and options.nonfinite_guard and not exact and n.op in UPDATES
                        and id(n.inputs[1]) in computing)
        if is_open and (not accel or (n.phase == "update" and waiting) or update_waits):
            pre += seg.end() + waiting
            is_open, computing, waiting = False, set(), []
        # the loss guard runs once, before the first backward or update node
        guard_loss = not guarded and n.phase not in ("forward", "transfer") and options.nonfinite_guard
        guarded = guarded or guard_loss
        if guard_loss and loss is not None:  # the loss is on the accelerator: its host copy, checked
            host_loss = emit.p(seg.part.graph.loss)
            lines = [f"*{host_loss} = *{seg.host_ptr(loss)};  // the loss on the host from here (the guard, an early "
                     f"return)", f'if (!pk::all_finite({host_loss}, 1)) return pock_nonfinite("the loss", 0);']
            (waiting if id(loss) in computing else pre).extend(lines)
            guard_loss = False
        if accel:
            if options.nonfinite_guard and not exact and n.op in UPDATES:  # its gradient, before it runs
                what = cstr(f"the gradient of {n.inputs[0].name!r}")
                pre.append(f"if (!pk::all_finite({ptr(n.inputs[1])}, {_n(n.inputs[1])})) "
                           f"return pock_nonfinite({what}, ctx->updates_done);")
            if not is_open:
                pre += seg.begin()
                is_open = True
            lines, kernel = seg.node(i, n)
            computing.update(id(o) for o in n.outputs if o is not None)
        elif seg is not None and REGISTRY[n.op].transfer:
            lines, kernel = seg.transfer(n), "transfer"
            if options.nonfinite_guard and not exact and n.op == "state_transfer" and \
                    n.attrs["dst"] == ALWAYS and n.inputs[0].kind == "param":
                lines.append("++ctx->updates_done;  // the accelerator's update reached the host's state")
        else:
            if id(n) in fused:
                lines = list(fused_weight_update(emit, n, fused[id(n)]))
            elif id(n) in fused_into:
                lines = [f"// fused into node {order.index(fused_into[id(n)])} (the weight gradient's kernel)"]
            else:
                lines = emit.node(n)
            kernel = kernel_name(lines)
            if id(n) in by_kernel:
                lines = cpu.checked_node(emit, n, by_kernel[id(n)])
        if exact and n.phase == "update" and 0 in checks:  # gradients computed by no node of the step
            lines = [cpu.finite_guard(u, ptr(u.inputs[1])) for u in checks.pop(0)] + lines
        if exact and id(n) in checks and id(n) not in by_kernel:
            after = [cpu.finite_guard(u, ptr(u.inputs[1])) for u in checks[id(n)]]
            if accel:  # read once the segment ran
                waiting += after
            else:
                lines = lines + after
        blocks.append({"index": i, "phase": n.phase,
                       "ir": ("" if seg is None else f"[{seg.part.backend[id(n)]}] ") + repr(n).split("  # ")[0],
                       "source": n.source, "lines": pre + lines, "op": n.op, "kernel": kernel, "flops": flops(n),
                       "guard_loss": guard_loss})
    if is_open:
        blocks[-1]["lines"] += seg.end() + waiting
    return blocks


# A step (or inference pass) of more than EmitOptions.chunk_nodes (128) nodes is emitted as
# functions of at most that many nodes each, called in turn: g++'s time grows faster than linearly
# with a function's size (the 30-layer SmolLM2 step, 4,371 nodes: 18.6 s at -O3 in one function,
# 8.0 s in chunks).
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def chunks(blocks: list[dict], names: BufferNames, chunk_nodes: int = EmitOptions.chunk_nodes) -> list[dict]:
    """blocks split into runs of chunk_nodes, each with the buffer declarations its lines use
    (in the function's declaration order); [] when the blocks fit one function."""
    if len(blocks) <= chunk_nodes:
        return []
    out = []
    for k, start in enumerate(range(0, len(blocks), chunk_nodes)):
        part = blocks[start:start + chunk_nodes]
        used = {w for b in part for line in b["lines"] for w in _IDENT.findall(line)}
        out.append({"index": k, "first": part[0]["index"], "last": part[-1]["index"], "nodes": part,
                    "buffers": [d for name, d in names.decl_of.items() if name in used]})
    return out


def int_ranges(g: Graph) -> dict[int, tuple[int, int, int | None]]:
    """id(input) -> (lo, hi, ignore) for integer inputs and targets that index something through
    value-preserving ops (ir.graph.index_ranges): pock_step checks them at entry and names the
    input.  Indices computed any other way (x + 1, ...) are checked by the gather itself inside
    the step (codegen/emit.py: index_check)."""
    return index_ranges(g.nodes, [v for v in g.inputs + g.targets if v.dtype in ("i64", "i32")])


def _io(values, plan, ranges) -> list[dict]:
    out = []
    for v in values:
        lo, hi, ignore = ranges.get(id(v), (0, 0, None))
        out.append({"name": v.name, "dtype": DTYPE_CODE[v.dtype], "shape": list(v.shape), "offset": plan.offset(v),
                    "nbytes": v.nbytes, "lo": lo, "hi": hi, "ignore": ignore if ignore is not None else 0,
                    "has_ignore": int(ignore is not None)})
    return out


@dataclass
class Step:
    """The training step as a step backend hands it to `render`: the graph its blocks run
    (a partitioned step has transfer nodes), the host arena's plan (offset(v), arena_bytes),
    one block per node (see _blocks), the buffer declarations at the top of train_step, the
    chunks (see chunks(); [] for one function), `blocks`, the context of the backend's own
    template blocks keyed by its name ({} for the all-CPU step), and the template rendering
    it (a backend's extends model.cpp.j2)."""
    graph: Graph
    plan: object
    nodes: list[dict]
    buffers: list[str]
    chunks: list[dict] = field(default_factory=list)
    blocks: dict = field(default_factory=dict)
    template: str = "model.cpp.j2"


def emit_options(prog, options: EmitOptions | None = None) -> EmitOptions:
    """The options a Program's step is emitted under: `options` (default EmitOptions()), its
    exact_skip the Program's (its schedule was made for it)."""
    import dataclasses
    options = options if options is not None else EmitOptions()
    exact = getattr(prog, "exact_skip", True)
    return options if options.exact_skip == exact else dataclasses.replace(options, exact_skip=exact)


def cpu_step(prog, options: EmitOptions | None = None) -> Step:
    """The all-CPU training step of a Program."""
    options = emit_options(prog, options)
    names = BufferNames(prog.graph, prog.plan.offset, prog.state_offsets)
    emit = Emit(prog.plan.offset, prog.state_offsets, names, options)
    nodes = _blocks(prog.order, emit)
    return Step(prog.graph, prog.plan, nodes, names.decls, chunks(nodes, names, options.chunk_nodes))


def segmented_step(prog, part, segments: type[Segments], options: EmitOptions | None = None) -> Step:
    """The training step partitioned over the CPU and one accelerator (`part`, a
    passes/partition.Partition), its accelerator nodes emitted by `segments` (a Segments
    subclass): planned by the one planner (memory.plan.plan_spaces: the host arena and the
    device's), looped over by _blocks as the all-CPU step is."""
    options = emit_options(prog, options)
    pg = part.graph
    plans = plan_spaces(pg.nodes, pg, [pg.loss], part.space, keep_whole=[pg.loss] if _loss_source(pg) else [])
    host = plans[ALWAYS]
    names = BufferNames(pg, host.offset, prog.state_offsets)
    emit = Emit(host.offset, prog.state_offsets, names, options)
    seg = segments(prog, part, plans, emit)
    nodes = _blocks(pg.nodes, emit, seg)
    return Step(pg, host, nodes, names.decls, chunks(nodes, names, options.chunk_nodes), {seg.name: seg.context()},
                seg.template)


def render(prog, step: Step | None = None, options: EmitOptions | None = None) -> tuple[str, str]:
    """(C++ source, model hash) of a Program with `step` (default: the all-CPU step), from the
    one template, model.cpp.j2 (a partitioned step: its backend's, which extends it);
    inference always runs on the CPU."""
    options = emit_options(prog, options)
    step = step if step is not None else cpu_step(prog, options)
    state_offsets = prog.state_offsets
    fwd_names = BufferNames(prog.forward_graph, prog.forward_plan.offset, state_offsets)
    forward_nodes = _blocks(prog.forward_order, Emit(prog.forward_plan.offset, state_offsets, fwd_names, options))
    state = [{"name": v.name, "kind": KIND_CODE[v.kind], "dtype": DTYPE_CODE[v.dtype], "shape": list(v.shape),
              "offset": state_offsets[v.name], "nbytes": v.nbytes}
             for v in sorted(prog.state.values(), key=lambda v: state_offsets[v.name])]
    state_names, trained = [t["name"] for t in state], set(prog.trained)  # trained: a trained-only checkpoint's params
    g, fg = step.graph, prog.forward_graph
    ranges = int_ranges(g)  # a partitioned step's inputs are clones: their ranges from its own graph
    fwd_ranges = int_ranges(fg)
    ctx = {
        "version": VERSION, "name": prog.name,
        "step_nodes": step.nodes, "forward_nodes": forward_nodes,
        "step_chunks": step.chunks, "forward_chunks": chunks(forward_nodes, fwd_names, options.chunk_nodes),
        "arena_bytes": step.plan.arena_bytes,
        "arena_bytes_total": max(step.plan.arena_bytes, prog.forward_plan.arena_bytes, 64),
        "state_bytes": max(prog.state_bytes, 64), "state": state,
        "inputs": _io(g.inputs, step.plan, ranges), "targets": _io(g.targets, step.plan, ranges),
        "forward_inputs": _io(fg.inputs, prog.forward_plan, fwd_ranges),
        "outputs": _io(fg.outputs, prog.forward_plan, {}),
        "loss_offset": step.plan.offset(g.loss), "default_lr": repr(float(prog.optimizer.lr)),
        "step_buffers": step.buffers, "forward_buffers": fwd_names.decls,
        "decoder": decoder_source(prog),  # generation's table of a Llama-family LM, else ""
        "trained": [n for n in state_names if n in trained],
        **step.blocks,
    }
    return finish(_env().get_template(step.template), ctx)


def emit_cpu(prog, options: EmitOptions | None = None) -> Source:
    """The all-CPU step of a Program."""
    text, digest = render(prog, options=options)
    return Source(text, digest, ("cpu",))
