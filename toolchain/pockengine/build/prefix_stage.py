"""A frozen prefix (passes/prefix.split_prefix) as a Trainer's input stage, and the build of
a prefix backend: the suffix step's library with the prefix run in front of it.

    PrefixRunner(prog, prefix, step_inputs, run)      the input stage: run(prefix inputs) -> cut values
    PrefixTrainer(prog, prefix, suffix_trainer, run)  the suffix's Trainer with that stage
    build_with_prefix(prog, others, out, name, prepare)  a prefix backend's build_with hook's body

`run` is backends/prefix_torch.torch_runner (the reference), backends/htp.HtpRunner or
backends/coreml.CoremlRunner."""
from __future__ import annotations

import numpy as np

from ..frontends.torch_export import NUMPY
from ..ir.graph import Graph
from ..passes.prefix import FrozenPrefix, split_prefix
from ..runtime.trainer import IOInfo
from .package import build_step


def graph_inputs(graph: Graph) -> list:
    """trainer.IOInfo of each of a graph's inputs (what its library's step takes)."""
    return [IOInfo(v.name, np.dtype(NUMPY[v.dtype]), tuple(v.shape)) for v in graph.inputs]


class PrefixRunner:
    """The input stage of a Trainer (trainer.Trainer.use_input_stage) whose step follows a
    frozen prefix: it runs the prefix on the model's inputs (`run`: the torch reference,
    backends/htp.HtpRunner on the HTP, ...) and hands the library the inputs the suffix
    keeps plus the prefix outputs.  The prefix's frozen weights are baked into the prefix
    model: the trainer lists them in state_dict() and accepts them back only unchanged."""

    def __init__(self, prog, prefix: FrozenPrefix, step_inputs, run, name: str = "torch", on_close=None):
        """prog: the whole program; step_inputs: the IOInfos of the suffix step's inputs."""
        self.prefix, self.run, self.name, self._on_close = prefix, run, name, on_close
        self.inputs = graph_inputs(prog.graph)
        self._cut = list(step_inputs)[len(prefix.kept_inputs):]  # the suffix inputs the prefix computes
        self.frozen = {name: np.array(prog.state[name].data, copy=True) for name in prefix.state_names()}
        self.order = [name for name, v in sorted(prog.state.items(), key=lambda kv: prog.state_offsets[kv[0]])
                      if v.kind in ("param", "buffer")]

    def prefix_outputs(self, arrays) -> list[np.ndarray]:
        """The prefix outputs for the model's input arrays (checked: indices inside their tables)."""
        ins = [arrays[i] for i in self.prefix.input_index]
        self.prefix.check_inputs(ins)
        return [np.ascontiguousarray(o, dtype=np.dtype(io.dtype)).reshape(io.shape)
                for o, io in zip(self.run(ins), self._cut)]

    def __call__(self, arrays) -> list[np.ndarray]:
        return [arrays[i] for i in self.prefix.kept_inputs] + self.prefix_outputs(arrays)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


def PrefixTrainer(prog, prefix: FrozenPrefix, suffix_trainer, run_prefix, backend: str = "torch",  # noqa: N802
                  on_close=None):
    """The suffix step's Trainer with the prefix in front (`run_prefix` runs it) as its input stage."""
    stage = PrefixRunner(prog, prefix, suffix_trainer.step_inputs, run_prefix, backend, on_close)
    return suffix_trainer.use_input_stage(stage)


def build_with_prefix(prog, other_backends, out_dir, name: str, prepare):
    """A prefix backend's build: the step split at its frozen prefix, the suffix built on
    `other_backends` (default cpu) with a PrefixRunner in front; `prepare(prefix)` gives the
    prefix's (run, bundle manifest entry) on that backend.  With no frozen prefix to move, the
    step is built on the other backends alone."""
    backends = list(other_backends or ["cpu"])
    prefix, suffix = split_prefix(prog, name)
    if prefix is None:
        return prog.build(backends=backends, out_dir=out_dir)
    run, manifest = prepare(prefix)
    stage = PrefixRunner(prog, prefix, graph_inputs(suffix.graph), run, name=name)
    return build_step(suffix, suffix.emit(backends), out_dir, input_stage=stage, prefix_manifest=manifest)


__all__ = ["PrefixRunner", "PrefixTrainer", "build_with_prefix", "graph_inputs"]
