"""`pe.compile`: a PyTorch model → a compiled training program.

The pipeline is a row of plain functions, each taking and returning plain data:

    export(model, ...)            -> (training graph, inference graph): one torch.export in
                                     train mode, the inference graph derived (passes/inference.py)
    lower(graph, forward, ...)    lowering_passes(), one loop over both graphs (each verified)
    schedule_program(graph, fwd)  -> Schedule: node orders (the step; inference)
    plan_program(graph, fwd, s)   -> Plans: the arena plans (the unreordered one when asked for)
    Program(..., schedule, plans) the compiled program (state layout, stats)
    emit(prog, backends, options) -> codegen.Source: partition over the backends, render the
                                     step under codegen.EmitOptions
    build(prog, source)           -> a Trainer: compile that source for this host and load it

pe.compile(...) is compile_spec(CompileSpec(...)): one frozen record of every keyword and
one function running export → lower → schedule → plan, which the scheme search
(search.SchemeCompiler: every scheme of one spec, the export cached) and pock-build
(--search too) call as well; `prog.build(backends=...)` runs emit → build (the partition
needs the backends, which are chosen there).  The prefix split (passes/prefix.py, through
Program.with_graphs) calls the same stages; Program(...) itself runs none.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import time
from dataclasses import dataclass

import torch.nn as nn

from ..autodiff.backward import build_backward
from ..ops import FULL
from ..backends import cpu as _cpu  # noqa: F401  (the built-in backends register themselves, in this order)
from ..backends import vulkan as _vulkan  # noqa: F401
from ..backends import htp as _htp  # noqa: F401
from ..backends import coreml as _coreml  # noqa: F401
from ..backends import reference as _reference  # noqa: F401  (the null backend: the IR in torch, for tests)
from ..backends import check_backends as _check_backends, split_roles, step_backend
from ..build.host import cache_dir
from ..codegen import EmitOptions, Source, emit_options
from ..errors import PockError
from ..frontends.torch_export import check_example, export_graph, input_names, resolve_loss, tied_aliases
from ..ir.graph import Graph, Value
from ..ops import flops
from ..ops import REGISTRY as OP_RECORDS
from ..ir.verify import verify
from ..memory.budget import memory_stats as _memory_stats
from ..memory.plan import MemoryPlan, plan_memory, plan_spaces, state_layout, written_state
from ..optim.optimizers import SGD, Optimizer
from ..passes.dce import eliminate_dead_code
from ..passes.fuse import fuse_activation_grads, fuse_activations
from ..passes.schedule import schedule
from ..passes.tied import restrict_tied_uses
from ..build.host import MODEL_OPT  # program.build's default model_opt


def resolve_update(named_params: dict[str, tuple[int, ...]], update) -> dict[str, object]:
    """The contract's update= semantics -> {param name: FULL or k (first k slices of dim 1)}."""
    if update == "full":
        return {name: FULL for name in named_params}
    if update == "none":
        return {}
    if not isinstance(update, dict):
        raise PockError(f"update must be 'full' or a dict {{name_or_glob: ratio}} (or 'none'), got {update!r}")
    chosen: dict[str, float] = {}
    for key, ratio in update.items():
        if not isinstance(key, str):
            raise PockError(f"update keys must be parameter names or globs, got {key!r}")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise PockError(f"update ratio for {key!r} must be a number in [0, 1], got {ratio!r}")
        matches = [key] if key in named_params else fnmatch.filter(named_params, key)
        if not matches:
            raise PockError(f"update key {key!r} matches no parameter; parameters are: "
                            f"{', '.join(list(named_params)[:12])}{' ...' if len(named_params) > 12 else ''}")
        for name in matches:
            if key == name or name not in chosen:  # an exact name beats a glob
                chosen[name] = float(ratio)
    trained = {}
    for name, ratio in chosen.items():
        if ratio == 0:
            continue
        shape = named_params[name]
        if ratio == 1:
            trained[name] = FULL
            continue
        if len(shape) < 2:
            raise PockError(f"update ratio {ratio} for {name!r} needs a dim 1 (input channels), but its shape is "
                            f"{tuple(shape)}; use ratio 1.0 or 0 for it")
        k = math.ceil(ratio * shape[1])
        trained[name] = FULL if k >= shape[1] else k
    return trained


# -- stages -----------------------------------------------------------------------------
def export(model: nn.Module, inputs, targets, loss, name: str, output=None, names=None) -> tuple[Graph, Graph]:
    """Stage `export`: (training graph with the loss, inference graph) of the model, from one
    torch.export of the training step in the model's own modes: the inference graph is
    derived from it (passes/inference.py: dropout as identity, batch norm over its running
    statistics).  Only a model whose code branches on `self.training` otherwise
    (reads_training) is exported again in eval mode; every module's mode is restored after."""
    from ..passes.inference import inference_graph, reads_training, share_origins
    if not reads_training(model):
        graph = export_graph(model, inputs, targets, loss, name, output, names, with_outputs=True)
        forward_graph = verify(inference_graph(graph), "inference graph")
        graph.outputs = []
        return graph, forward_graph
    modes = {m: m.training for m in model.modules()}  # e.g. frozen BatchNorm layers kept in eval()
    graph = export_graph(model, inputs, targets, loss, name, output, names)
    try:
        model.eval()
        forward_graph = export_graph(model, inputs, name=name, output=output, names=names)
    finally:
        for m, training in modes.items():
            m.training = training
    return graph, share_origins(graph, forward_graph)


def _autodiff(graph: Graph, trained: dict, optimizer: Optimizer) -> Graph:
    """The backward pass for the trained parameters and the optimizer's update nodes."""
    grads = build_backward(graph, trained)
    for pname, grad in grads.items():
        k = trained[pname]
        optimizer.emit(graph, graph.state[pname], grad, None if k is FULL else k, pname.rsplit(".", 1)[0])
    return graph


def lowering_passes() -> list[tuple[str, object, bool]]:
    """The passes of stage `lower`, in order: (what, pass(graph) -> graph, whether it also
    runs on the inference graph).  The autodiff pass takes (graph, trained, optimizer)."""
    from ..passes.attention import attention_layouts
    from ..passes.causal import causal_from_constant_mask
    from ..passes.fuse_norm import fuse_rms_norm, fuse_rope, fuse_swiglu
    from ..passes.lm_head import fuse_lm_head, head_dx_in_forward
    return [("causal mask", causal_from_constant_mask, True),
            ("RMSNorm fusion", fuse_rms_norm, True),
            ("SwiGLU fusion", fuse_swiglu, True),
            ("RoPE fusion", fuse_rope, True),
            ("attention layouts", attention_layouts, True),
            ("fused LM head", fuse_lm_head, False),  # training graph only: forward() returns the logits
            ("autodiff", _autodiff, False),
            ("dead-code elimination", eliminate_dead_code, True),
            ("LM head gradient in the forward", head_dx_in_forward, False),  # a frozen head: 2 products, not 3
            ("activation fusion", fuse_activations, True),
            ("activation-gradient fusion", fuse_activation_grads, False)]


def lower(graph: Graph, forward_graph: Graph, trained: dict, optimizer: Optimizer, passes: list | None = None) -> None:
    """Stage `lower` (in place): lowering_passes() (or `passes`, such a list: a bench leaving a
    fusion out) over the training graph and (those that apply) the inference graph, one
    loop, each result verified."""
    for what, run, both in (passes if passes is not None else lowering_passes()):
        if run is _autodiff:
            verify(run(graph, trained, optimizer), what)
            continue
        verify(run(graph), what)
        if both:
            verify(run(forward_graph), f"{what} (inference)")


@dataclass
class Schedule:
    """Node orders: the training step (memory-reordered unless exact_skip) and the inference
    pass.  The step in graph order (stats()' arena_bytes_no_reorder) is made when asked for."""
    order: list
    forward_order: list
    graph: Graph | None = None
    reordered: bool = False
    _no_reorder: list | None = None

    @property
    def order_no_reorder(self) -> list:
        if not self.reordered:
            return self.order  # the same schedule
        if self._no_reorder is None:
            self._no_reorder = schedule(self.graph, reorder=False)
        return self._no_reorder


def schedule_program(graph: Graph, forward_graph: Graph, exact_skip: bool = True) -> Schedule:
    """Stage `schedule`.  exact_skip (the exact non-finite guard): every optimizer update
    runs after the whole backward pass, so a step skipped for a NaN/inf gradient changes
    nothing; otherwise each update runs as soon as its gradient is complete."""
    return Schedule(schedule(graph, reorder=not exact_skip), schedule(forward_graph), graph, not exact_skip)


@dataclass
class Plans:
    """The arena plans of the step (as scheduled) and of the inference pass; the plan of the
    step in graph order (stats()' arena_bytes_no_reorder) is made when asked for."""
    plan: MemoryPlan
    forward_plan: MemoryPlan
    sched: Schedule | None = None
    _no_reorder: MemoryPlan | None = None

    @property
    def plan_no_reorder(self) -> MemoryPlan:
        if self.sched is None or not self.sched.reordered:
            return self.plan
        if self._no_reorder is None:
            g = self.sched.graph
            self._no_reorder = plan_memory(self.sched.order_no_reorder, g, [g.loss])
        return self._no_reorder


def plan_program(graph: Graph, forward_graph: Graph, sched: Schedule) -> Plans:
    """Stage `plan`: the step's and the inference pass's memory plans."""
    return Plans(plan_spaces(sched.order, graph, [graph.loss])["cpu"],
                 plan_memory(sched.forward_order, forward_graph, forward_graph.outputs), sched)


class Program:
    """A compiled training step (and inference pass) of one model: its graphs, the schedule
    and memory plans its caller made with schedule_program and plan_program, and the state
    layout.  It runs no stage itself."""

    def __init__(self, name, graph, forward_graph, optimizer, trained, aliases, sched: Schedule, plans: Plans,
                 exact_skip: bool = True, lora_adapters: dict | None = None, lora_model=None, decoder=None,
                 recompute_flops: int = 0):
        self.name = name
        self.exact_skip = exact_skip  # the exact non-finite guard (pe.compile's exact_skip)
        self.graph: Graph = graph
        self.forward_graph: Graph = forward_graph
        self.optimizer: Optimizer = optimizer
        self.trained = trained
        self.aliases = aliases
        self.order, self.forward_order = sched.order, sched.forward_order
        self.plan: MemoryPlan = plans.plan
        self._plans = plans  # plan_no_reorder: made when asked for
        self.forward_plan: MemoryPlan = plans.forward_plan
        self.state: dict[str, Value] = dict(graph.state)
        for name, v in forward_graph.state.items():
            self.state.setdefault(name, v)
        merged = Graph(name)
        merged.state = self.state
        self.state_offsets, self.state_bytes = state_layout(merged, written_state(graph, trained))
        self._sources: dict[tuple, Source] = {}  # (backends, EmitOptions) -> the emitted step
        self.lora_adapters: dict[str, float] = dict(lora_adapters or {})  # {module: scaling} (compile(lora=...))
        self.lora_model = lora_model  # the model copy with LoRALinear modules
        self.decoder = decoder  # decoder.DecoderSpec of a Llama-family LM (generation), else None
        self.recompute_flops = recompute_flops  # FLOPs the memory budget's recomputation adds per step

    @property
    def plan_no_reorder(self) -> MemoryPlan:
        """The step's memory plan in graph order (no operator reordering), made when asked for."""
        return self._plans.plan_no_reorder

    def with_graphs(self, graph: Graph, forward_graph: Graph) -> "Program":
        """This program's model, optimizer and update scheme over new step and inference graphs
        (the suffix after a prefix split), scheduled and planned again."""
        sched = schedule_program(graph, forward_graph, self.exact_skip)
        plans = plan_program(graph, forward_graph, sched)
        return type(self)(self.name, graph, forward_graph, self.optimizer, self.trained, self.aliases, sched, plans,
                          self.exact_skip, self.lora_adapters, self.lora_model, self.decoder, self.recompute_flops)

    # -- reports -------------------------------------------------------------------
    def stats(self) -> dict:
        kinds = {}
        for v in self.state.values():
            kinds[v.kind] = kinds.get(v.kind, 0) + v.nbytes
        trainable = sum(r[0] * r[1] for r in (n.attrs["region"] for n in self.graph.nodes
                                             if n.op in ("sgd_update", "adamw_update")))
        return {
            "arena_bytes": self.plan.arena_bytes,
            "arena_bytes_no_reorder": self.plan_no_reorder.arena_bytes,
            "state_bytes": sum(kinds.values()),
            "param_bytes": kinds.get("param", 0),
            "buffer_bytes": kinds.get("buffer", 0) + kinds.get("const", 0),
            "optimizer_state_bytes": kinds.get("opt_state", 0),
            "forward_arena_bytes": self.forward_plan.arena_bytes,
            "flops_per_step": sum(flops(n) for n in self.order),
            "forward_flops": sum(flops(n) for n in self.forward_order),
            "trainable_elements": trainable,
            "total_parameter_elements": sum(v.numel for v in self.state.values() if v.kind == "param"),
            "num_nodes": len(self.order),
            "exact_skip": self.exact_skip,
            **_memory_stats(self),  # private_bytes, mapped_bytes, recompute_flops (memory/budget.py)
        }

    def emit(self, backends=None, options: EmitOptions | None = None) -> Source:
        """The emitted step for `backends` (default ["cpu"]) under `options` (default
        EmitOptions()), made once per (backend set, options)."""
        return emit(self, backends, options=options)

    def source(self) -> str:
        """The generated C++ translation unit of the all-CPU step."""
        return self.emit().text

    @property
    def hash(self) -> str:
        """The structural hash of the all-CPU step (see emit() for other backend sets)."""
        return self.emit().hash

    def summary(self, source: Source | None = None) -> str:
        from .report import summary
        return summary(self, source or self.emit())

    # -- building --------------------------------------------------------------------
    def build(self, target: str = "host", backends=None, out_dir=None):
        """Generate, compile and load the step; returns a Trainer holding this model's weights.

        backends: the ones the step may use, e.g. ["cpu"] (default),
        ["vulkan", "cpu"] (trainable part on Vulkan, backends/vulkan.py) or
        ["htp", "cpu"] (frozen prefix on the QNN HTP, backends/htp.py)."""
        if target != "host":
            raise PockError(f"prog.build supports target='host'; use `pock-build --platform {target}` for devices")
        backends = check_backends(backends)
        try:
            prefix, steps = split_roles(backends)
            if prefix is not None:
                return prefix.build_with(self, steps, out_dir)
            return build(self, self.emit(backends), out_dir)
        except OSError as e:  # e.g. a read-only cache directory: name it, not a bare OSError
            where = e.filename if e.filename else (out_dir or _cache_dir())
            raise PockError(f"cannot write build files to {str(where)!r}: {e.strerror or e} (set POCK_CACHE_DIR "
                            f"or out_dir to a writable directory)") from None

    def build_cpu(self, out_dir=None):
        """The all-CPU step for this host (what build() does with backends=["cpu"])."""
        return build(self, self.emit(["cpu"]), out_dir)


def check_backends(backends) -> list[str]:
    """The backend list, checked against the registry (backends/__init__.py)."""
    return _check_backends(backends)


def _backend_emit(backend, prog: Program, cost, options: EmitOptions) -> Source:
    """A registered backend's emit hook: emit(prog, cost=None, options=None); a hook written
    before EmitOptions (emit(prog, cost=None)) renders with the default options."""
    import inspect
    params = inspect.signature(backend.emit).parameters
    if "options" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return backend.emit(prog, cost=cost, options=options)
    return backend.emit(prog, cost=cost)


def emit(prog: Program, backends=None, cost=None, options: EmitOptions | None = None) -> Source:
    """Stage `emit`: the step's C++ source for a set of step backends under EmitOptions
    (cached on the program, one per (set, options); a `cost` model for the partition is not
    cached).  A prefix backend ("htp")
    is not a step backend: split the prefix first (its Backend.split) and emit the suffix."""
    backends = tuple(check_backends(backends))
    prefix, _ = split_roles(backends)
    if prefix is not None:
        raise PockError(f"emit the step after splitting off the {prefix.name} prefix (passes/prefix.split_prefix)")
    options = emit_options(prog, options)
    key = (backends, options)
    if cost is None and key in prog._sources:
        return prog._sources[key]
    renderer = step_backend(backends)
    source = _backend_emit(renderer, prog, cost, options)
    if cost is None:
        prog._sources[key] = source
    return source


def build(prog: Program, source: Source, out_dir=None, *, model_opt: str = MODEL_OPT, runtime=None,
          march: str | None = None, timings: dict | None = None):
    """Stage `build`: compile `source` (prog's emitted step) for this host and load it with
    prog's weights; the library is exactly `source` (build/package.build_step).  model_opt:
    the model TU's optimisation level (default -O1); runtime: another native/runtime tree to
    build with (a bench timing the runtime before a change); march: g++'s -march (default
    $POCK_MARCH or native: a bench timing an AVX2 build on an AVX-512 machine); all three in
    the build cache's keys.  timings: when given, each object compiled stores its compiler's
    wall seconds in it."""
    from ..build.package import build_step
    return build_step(prog, source, out_dir, model_opt=model_opt, runtime=runtime, march=march, timings=timings)


_cache_dir = cache_dir  # the old name


@dataclass(frozen=True, eq=False)
class CompileSpec:
    """Everything pe.compile takes, one field per keyword (a new keyword is one line here:
    pe.compile, the scheme search and pock-build pass it through).  See compile() for the
    meaning of each."""
    model: object
    example_inputs: object
    example_targets: object
    loss: object = "cross_entropy"
    update: object = "full"
    optimizer: Optimizer | None = None
    name: str | None = None
    output: object = None
    lora: object = None
    frozen_dtype: str = "fp32"
    exact_skip: bool = True
    compute_dtype: str = "fp32"      # products with frozen weights in bf16/fp16 (passes/compute_dtype.py)
    memory_budget_mb: float | None = None  # private memory budget: recomputation (memory/budget.py)

    def replace(self, **changes) -> "CompileSpec":
        return dataclasses.replace(self, **changes)


def make_spec(*args, **kwargs) -> CompileSpec:
    """CompileSpec(*args, **kwargs), an unknown or missing keyword a PockError naming it."""
    try:
        return CompileSpec(*args, **kwargs)
    except TypeError as e:
        fields = ", ".join(f.name for f in dataclasses.fields(CompileSpec))
        raise PockError(f"pe.compile: {e} (its arguments are: {fields})") from None


def compile(*args, **kwargs) -> Program:
    """Compile model's whole training step (see the README / CONTRACT):
    pe.compile(model, example_inputs, example_targets, loss="cross_entropy", update="full",
    optimizer=None, name=None, output=None, lora=None, frozen_dtype="fp32", exact_skip=True,
    compute_dtype="fp32", memory_budget_mb=None), the fields of CompileSpec.

    `output` names the model output the loss uses (a ModelOutput/dict key such as "logits",
    or a tuple index); example_inputs may be a dict {forward argument name: tensor} for
    keyword inputs.  ONNX, TFLite, Keras and JAX models become torch modules first
    (docs/frontends.md).  exact_skip (default True): the non-finite guard is exact, i.e.
    every update runs after all gradients are computed and checked, so a step skipped for a
    NaN/inf gradient leaves parameters and optimizer state bit-identical (the gradients stay
    alive until the end: a bigger arena).  False: each update runs as soon as its gradient
    is complete (the smaller arena of operator reordering); a gradient going NaN/inf late
    then finds the earlier updates applied (Trainer.last_step_status "partial")."""
    return compile_spec(make_spec(*args, **kwargs))


def compile_spec(spec: CompileSpec, exports: dict | None = None, timings: dict | None = None,
                 passes: list | None = None) -> Program:
    """pe.compile's stages for one spec: check → (LoRA) → export → lower → schedule → plan.
    exports: a cache shared by calls whose specs differ only in `update` (and `lora`), e.g.
    the scheme search's: each (lora, name) is exported once and every call lowers a copy.
    timings: when given, each stage's (wall seconds, CPU seconds) is stored in it under the
    stage's name as the stage ends (check, export, lower, lowp, budget, schedule, plan,
    Program), e.g. bench/compile_profile.py's.  passes: lower's (default lowering_passes())."""
    lap = _stage_clock(timings)
    from ..frontends import as_torch_module
    if not isinstance(spec.exact_skip, bool):
        raise PockError(f"exact_skip must be True or False, got {spec.exact_skip!r}")
    model = as_torch_module(spec.model)
    if not isinstance(model, nn.Module):
        raise PockError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    optimizer = spec.optimizer if spec.optimizer is not None else SGD(lr=0.01)
    if not isinstance(optimizer, Optimizer):
        raise PockError(f"optimizer must be pe.SGD(...) or pe.AdamW(...), got {type(optimizer).__name__}")
    names = input_names(spec.example_inputs)
    inputs = check_example(spec.example_inputs, "example_inputs")
    targets = check_example(spec.example_targets, "example_targets")
    name = _check_name(spec.name) if spec.name is not None else _c_name(type(model).__name__)
    from ..schemes.quant import check_frozen_dtype
    lowp = check_frozen_dtype(spec.frozen_dtype)
    from ..passes.compute_dtype import apply_compute_dtype, check_compute_dtype
    check_compute_dtype(spec.compute_dtype)
    resolve_loss(spec.loss)  # fail fast on bad arguments, before the (slow) exports
    trained, tied_uses = resolve_trained(model, spec.update)
    lap("check")
    key = (repr(spec.lora), name)
    if exports is not None and key in exports:
        lora_model, adapters, graph, forward_graph = exports[key]
    else:
        lora_model, adapters = model, {}
        if spec.lora is not None:
            from ..schemes.lora import apply_lora
            lora_model, adapters = apply_lora(model, spec.lora)
        graph, forward_graph = export(lora_model, inputs, targets, spec.loss, name, spec.output, names)
        check_float_ops(graph)
        if exports is not None:
            exports[key] = (lora_model, adapters, graph, forward_graph)
    if exports is not None:  # lower a copy: the cached export serves the next scheme
        graph, forward_graph = graph.clone()[0], forward_graph.clone()[0]
    lap("export")
    for module in adapters:
        trained[f"{module}.lora_A"] = trained[f"{module}.lora_B"] = FULL
    restrict_tied_uses(graph, {p: m for p, m in tied_uses.items() if p in trained})
    lower(graph, forward_graph, trained, optimizer, passes)
    lap("lower")
    if lowp != "f32":
        from ..passes.lowp import store_frozen_lowp
        store_frozen_lowp([graph, forward_graph], trained, lowp)
    apply_compute_dtype([graph, forward_graph], trained, spec.compute_dtype, lowp)  # frozen products in bf16/fp16
    lap("lowp")
    from ..memory.budget import fit_budget  # memory_budget_mb: what the backward pass recomputes
    recompute_flops = fit_budget(graph, forward_graph, trained, spec.exact_skip, spec.memory_budget_mb) \
        if spec.memory_budget_mb is not None else 0
    if spec.memory_budget_mb is not None:
        lap("budget")
    sched = schedule_program(graph, forward_graph, spec.exact_skip)
    lap("schedule")
    plans = plan_program(graph, forward_graph, sched)
    lap("plan")
    from ..codegen.decoder import recognize
    prog = Program(name, graph, forward_graph, optimizer, trained, tied_aliases(model), sched, plans, spec.exact_skip,
                   lora_adapters=adapters, lora_model=lora_model if spec.lora is not None else None,
                   decoder=recognize(lora_model, adapters),  # generation's view of a Llama-family LM, else None
                   recompute_flops=recompute_flops)
    lap("Program")
    return prog


def _stage_clock(timings: dict | None):
    """compile_spec's stage clock: lap(name) stores (wall s, CPU s) since the previous lap (or
    the start) in timings[name]; a no-op without timings."""
    if timings is None:
        return lambda name: None
    last = [time.perf_counter(), time.process_time()]

    def lap(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        timings[name] = (now[0] - last[0], now[1] - last[1])
        last[:] = now
    return lap


def resolve_trained(model: nn.Module, update) -> tuple[dict, dict]:
    """(what `update` trains: {param: FULL or k}, {tied parameter: the module whose use alone
    trains it}); a parameter frozen by the user (requires_grad=False) stays frozen, as in
    PyTorch, whatever `update` says."""
    from ..passes.tied import split_tied_uses
    params = dict(model.named_parameters())
    update, tied_uses = split_tied_uses(update, tied_aliases(model))  # `head.weight`: that use only
    trained = resolve_update({n: tuple(p.shape) for n, p in params.items()}, update)
    return {n: k for n, k in trained.items() if params[n].requires_grad}, tied_uses


def check_float_ops(graph) -> None:
    """Ops whose kernels take float32 tensors only (their records' float_only): an integer tensor
    reaching one (clamp on token ids, loss="mse" with class-index targets) is a PockError here,
    not a g++ error in the generated code."""
    for n in graph.nodes:
        if not OP_RECORDS[n.op].float_only:
            continue
        for i, v in enumerate(n.inputs):
            if v is not None and v.dtype != "f32":
                what = "loss='mse' needs float targets" if n.op == "mse_loss" else f"{n.op} needs float32 inputs"
                where = f" in {n.source}" if n.source else ""
                raise PockError(f"{what}: input {i} %{v.name} of {n.op}{where} is {v.dtype} "
                                f"{list(v.shape)} (integer data such as token ids or class indices)")


def _check_name(name) -> str:
    """A model name becomes file names, C identifiers' neighbours and C string
    literals: letters, digits, '_', '-' and '.' only (no path, no quote)."""
    import re
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
        raise PockError(f"model name must be 1-100 letters, digits, '_', '-' or '.' (not starting with '.' "
                        f"or '-'), got {name!r}")
    return name


def _c_name(s: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in s)
    return out if out and not out[0].isdigit() else f"m_{out}"
