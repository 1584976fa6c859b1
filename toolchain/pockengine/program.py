"""`pe.compile`: a PyTorch model → a compiled training program.

Stages (each IR-producing one is verified): export → update scheme →
autodiff → optimizer nodes → dead-code elimination → schedule (reordered)
→ memory plan; the inference graph goes through export → DCE → plan.
"""
from __future__ import annotations

import fnmatch
import math
from pathlib import Path

import torch.nn as nn

from .autodiff.backward import build_backward
from .autodiff.rules import FULL
from .errors import PockError
from .frontends.torch_export import check_example, export_graph, resolve_loss, tied_aliases
from .ir.graph import Graph, Value
from .ir.ops import flops
from .ir.verify import verify
from .memory.plan import MemoryPlan, plan_memory, state_layout
from .optim.optimizers import SGD, Optimizer
from .passes.dce import eliminate_dead_code
from .passes.fuse import fuse_activations
from .passes.schedule import schedule


def resolve_update(named_params: dict[str, tuple[int, ...]], update) -> dict[str, object]:
    """The contract's update= semantics -> {param name: FULL or k (first k slices of dim 1)}."""
    if update == "full":
        return {name: FULL for name in named_params}
    if not isinstance(update, dict):
        raise PockError(f"update must be 'full' or a dict {{name_or_glob: ratio}}, got {update!r}")
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


class Program:
    """A compiled training step (and inference pass) of one model."""

    def __init__(self, name, graph, forward_graph, optimizer, trained, aliases):
        self.name = name
        self.graph: Graph = graph
        self.forward_graph: Graph = forward_graph
        self.optimizer: Optimizer = optimizer
        self.trained = trained
        self.aliases = aliases
        self.order = schedule(graph, reorder=True)
        self.plan: MemoryPlan = plan_memory(self.order, graph, [graph.loss])
        self.plan_no_reorder: MemoryPlan = plan_memory(schedule(graph, reorder=False), graph, [graph.loss])
        self.forward_order = schedule(forward_graph)
        self.forward_plan: MemoryPlan = plan_memory(self.forward_order, forward_graph, forward_graph.outputs)
        self.state: dict[str, Value] = dict(graph.state)
        for name, v in forward_graph.state.items():
            self.state.setdefault(name, v)
        merged = Graph(name)
        merged.state = self.state
        self.state_offsets, self.state_bytes = state_layout(merged)
        self._source = None

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
        }

    def source(self) -> str:
        """The generated C++ translation unit."""
        if self._source is None:
            from .codegen import render
            self._source, self.hash = render(self)
        return self._source

    def summary(self) -> str:
        from .report import summary
        return summary(self)

    # -- building --------------------------------------------------------------------
    def build(self, target: str = "host", backends=None, out_dir=None):
        """Generate, compile and load the step; returns a Trainer holding this model's weights.

        backends: the ones the step may use, e.g. ["cpu"] (default),
        ["vulkan", "cpu"] (trainable part on Vulkan, backends/vulkan.py) or
        ["htp", "cpu"] (frozen prefix on the QNN HTP, backends/htp.py)."""
        if target != "host":
            raise PockError(f"prog.build supports target='host'; use `pock-build --platform {target}` for devices")
        backends = check_backends(backends)
        if "htp" in backends:
            from .backends.htp import build_with_htp_prefix
            return build_with_htp_prefix(self, [b for b in backends if b != "htp"], out_dir)
        if "vulkan" in backends:
            from .backends.vulkan import build_vulkan
            return build_vulkan(self, out_dir)
        return self.build_cpu(out_dir)

    def build_cpu(self, out_dir=None):
        """The all-CPU step for this host (what build() does with backends=["cpu"])."""
        from .build.host import build_shared_library
        from .trainer import Trainer

        src_dir = Path(out_dir) if out_dir else _cache_dir() / "models"
        src_dir.mkdir(parents=True, exist_ok=True)
        source = self.source()
        path = src_dir / f"{self.name}-{self.hash}.cpp"
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(source)
            tmp.replace(path)
        lib = build_shared_library([path], src_dir)
        trainer = Trainer(str(lib), aliases=self.aliases)  # state_dict lists tied weights under every name
        for name, v in self.state.items():
            if v.data is not None:
                trainer.set_tensor(name, v.data)
        return trainer


BACKENDS = ("cpu", "vulkan", "htp")


def check_backends(backends) -> list[str]:
    """The backend list, checked: known names, no repeats, and always "cpu"."""
    if isinstance(backends, str):
        backends = [backends]
    backends = list(backends or ["cpu"])
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise PockError(f"unknown backend(s) {unknown}; PockEngine has {list(BACKENDS)}")
    if len(set(backends)) != len(backends):
        raise PockError(f"backends {backends} name one twice")
    if "cpu" not in backends:
        raise PockError(f"backends {backends} must include 'cpu' (it runs every op the others do not)")
    return backends


def _cache_dir() -> Path:
    import os
    return Path(os.environ.get("POCK_CACHE_DIR", Path.home() / ".cache" / "pockengine"))


def compile(model: nn.Module, example_inputs, example_targets, loss="cross_entropy", update="full",
            optimizer: Optimizer | None = None, name: str | None = None) -> Program:
    """Compile model's whole training step (see the README / CONTRACT)."""
    from .frontends import as_torch_module
    model = as_torch_module(model)  # ONNX, TFLite, Keras and JAX models become torch modules (docs/frontends.md)
    optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
    if not isinstance(optimizer, Optimizer):
        raise PockError(f"optimizer must be pe.SGD(...) or pe.AdamW(...), got {type(optimizer).__name__}")
    inputs = check_example(example_inputs, "example_inputs")
    targets = check_example(example_targets, "example_targets")
    name = name or _c_name(type(model).__name__)
    resolve_loss(loss)  # fail fast on bad arguments, before the (slow) exports
    named = {n: tuple(p.shape) for n, p in model.named_parameters()}
    trained = resolve_update(named, update)
    modes = {m: m.training for m in model.modules()}  # e.g. frozen BatchNorm layers kept in eval()
    graph = export_graph(model, inputs, targets, loss, name)
    try:
        model.eval()
        forward_graph = export_graph(model, inputs, name=name)
    finally:
        for m, training in modes.items():
            m.training = training

    grads = build_backward(graph, trained)
    for pname, grad in grads.items():
        k = trained[pname]
        optimizer.emit(graph, graph.state[pname], grad, None if k is FULL else k, pname.rsplit(".", 1)[0])
    verify(graph, "autodiff")
    verify(eliminate_dead_code(graph), "dead-code elimination")
    verify(eliminate_dead_code(forward_graph), "dead-code elimination (inference)")
    verify(fuse_activations(graph), "activation fusion")
    verify(fuse_activations(forward_graph), "activation fusion (inference)")
    return Program(name, graph, forward_graph, optimizer, trained, tied_aliases(model))


def _c_name(s: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in s)
    return out if out and not out[0].isdigit() else f"m_{out}"
