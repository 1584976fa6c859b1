"""One adapter per framework: prepare (export/compile artifacts, in a separate process), load,
and one training step with SGD(lr=0.01, momentum=0.9) under a workload's update scheme.

    prepare(ctx) -> dict          runs in its own short-lived process; writes artifacts under
                                  ctx.art_dir and returns what load() needs (JSON-able)
    Runner(ctx, prep)             loads the model ready to train (weights resident)
      .batch(x, y) -> batch       converts one (inputs, targets) pair once, before any timing
      .step(batch) -> float       one full training step; returns the loss as a Python float
      .preallocated_bytes         training memory the framework allocates *and touches* at load
                                  time (PockEngine zeroes its arena and optimizer state when it
                                  opens a model), counted as training memory by the harness
      .notes                      caveats shown in the results table

Partial-channel updates (ratio < 1): PockEngine computes only the trained slice; the PyTorch
baselines compute the full gradient and zero the frozen slice before the optimizer (as the
issue asks); ONNX Runtime cannot edit gradients from Python, and its SGD has no momentum, so
there the frozen slice is written back after the step (equivalent for momentum-free SGD).
"""
from __future__ import annotations

import json
import math
import os
import sys
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import resolve_partial, workloads  # noqa: E402

LR, MOMENTUM = 0.01, 0.9
FRAMEWORKS = ["pockengine", "pockengine-1t", "pockengine-v3", "pockengine-v3-1t", "pockengine-vulkan", "eager", "eager-1t",
              "eager-v3", "eager-v3-1t",
              "torch.compile", "executorch", "onnxruntime"]
N_BATCHES = 4


@dataclass
class Ctx:
    workload: str
    scheme: str
    quick: bool
    threads: int
    art_dir: Path

    def load(self):
        """(model in train mode, update, trained names, partial {name: k}, batches)."""
        w = next(w for w in workloads(self.quick) if w.key == self.workload)
        model = w.make().train()
        update = w.schemes[self.scheme](model)
        trained, partial = resolve_partial(model, update)
        g = torch.Generator().manual_seed(1234)
        batches = [w.inputs(g) for _ in range(N_BATCHES)]
        return model, update, trained, partial, batches


def ce_loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _rss_bytes() -> int:
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def set_torch_threads(n):
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


# ============================================================================ PockEngine
_KEEP = []


def prepare_pockengine(ctx: Ctx, backends=("cpu",)) -> dict:
    import pockengine as pe
    model, update, _, _, batches = ctx.load()
    (x, y) = batches[0]
    suffix = "" if backends == ("cpu",) else "_vk"
    prog = pe.compile(model, x, y, loss="cross_entropy", update=update,
                      optimizer=pe.SGD(lr=LR, momentum=MOMENTUM), name=f"bench_{ctx.workload}_{ctx.scheme}{suffix}")
    trainer = prog.build(backends=list(backends))
    ckpt = ctx.art_dir / "init.pockckpt"
    trainer.save(ckpt)
    _KEEP.append(trainer)  # never closed here: the prepare process ends with os._exit
    stats = prog.stats()
    out = {"lib": str(trainer.lib_path), "ckpt": str(ckpt), "stats": stats}
    part = getattr(trainer, "partition", None)  # a step built over several backends
    if part is not None:
        out["partition"] = {"cpu_nodes": len(part.nodes_on("cpu")), "vulkan_nodes": len(part.nodes_on("vulkan"))}
    return out


# Build variants of the CPU step, timed in the same run as "pockengine" (native -march, the
# cores' threads): "-v3" builds every kernel for -march=x86-64-v3 (AVX2+FMA, the phone-class
# vector width), "-1t" runs on one thread, "-ref" builds against the runtime in
# $POCK_BENCH_REF_RUNTIME (e.g. a checkout of an older commit's native/runtime: a before/after
# comparison interleaved in one run, immune to the machine's load changing between runs).
PE_VARIANTS = ["pockengine-1t", "pockengine-v3", "pockengine-v3-1t", "pockengine-ref", "pockengine-ref-1t",
               "pockengine-ref-v3", "pockengine-ref-v3-1t", "pockengine-fused-v3-1t"]


REF_RUNTIME_ENV = "POCK_BENCH_REF_RUNTIME"


def ref_runtime(path: str | None = None) -> str:
    """The runtime tree of the "ref" rows (a build of the same program over another native/runtime,
    e.g. an older commit's: a before/after comparison in one run): `path` when given, else
    $POCK_BENCH_REF_RUNTIME.  The one switch bench/run.py, lm_interleaved.py and threads_ab.py
    read."""
    ref = path or os.environ.get(REF_RUNTIME_ENV)
    if not ref or not Path(ref, "kernels").is_dir():
        raise RuntimeError(f"the ref rows need {REF_RUNTIME_ENV}=<a native/runtime directory> (or --ref-runtime), "
                           f"got {ref!r}")
    return ref


def pe_variant(framework: str) -> dict:
    """"pockengine-v3-1t" -> {"march": "x86-64-v3", "threads": 1, "ref": False, "exact_skip": True};
    "fused": exact_skip=False (updates as gradients complete, linear updates fused into their GEMM)."""
    parts = framework.split("-")[1:]
    return {"march": "x86-64-v3" if "v3" in parts else None, "threads": 1 if "1t" in parts else None,
            "ref": "ref" in parts, "exact_skip": "fused" not in parts}


def prepare_pockengine_variant(ctx: Ctx, framework: str) -> dict:
    import pockengine as pe
    from pockengine.compiler.program import build
    var = pe_variant(framework)
    model, update, _, _, batches = ctx.load()
    (x, y) = batches[0]
    prog = pe.compile(model, x, y, loss="cross_entropy", update=update,
                      optimizer=pe.SGD(lr=LR, momentum=MOMENTUM), name=f"bench_{ctx.workload}_{ctx.scheme}",
                      exact_skip=var["exact_skip"])
    ref = ref_runtime() if var["ref"] else None
    trainer = build(prog, prog.emit(["cpu"]), ctx.art_dir, runtime=ref, march=var["march"])
    ckpt = ctx.art_dir / "init.pockckpt"
    trainer.save(ckpt)
    _KEEP.append(trainer)
    return {"lib": str(trainer.lib_path), "ckpt": str(ckpt), "stats": prog.stats(), "threads": var["threads"]}


def prepare_pockengine_vulkan(ctx: Ctx) -> dict:
    """The same step with its trainable part on the machine's Vulkan device (backends=["vulkan", "cpu"]);
    fails (n/a in the table) naming what is missing when there is no Vulkan device or glslc."""
    return prepare_pockengine(ctx, ("vulkan", "cpu"))


class PockEngineRunner:
    def __init__(self, ctx: Ctx, prep: dict):
        from pockengine.runtime.trainer import Trainer
        self.trainer = Trainer(prep["lib"], prep["ckpt"])
        self.trainer.set_num_threads(prep.get("threads") or ctx.threads)
        st = prep["stats"]
        self.preallocated_bytes = st["arena_bytes"] + st["optimizer_state_bytes"]
        self.notes = []

    def batch(self, x, y):
        return x, y

    def step(self, b):
        return self.trainer.step(*b)


class PockEngineVulkanRunner(PockEngineRunner):
    """PockEngine with the trainable part on Vulkan; the CPU threads run what is left (and the copies)."""

    def __init__(self, ctx: Ctx, prep: dict):
        from pockengine.backends.vulkan import VulkanTrainer
        self.trainer = VulkanTrainer(prep["lib"], prep["ckpt"])
        self.trainer.set_num_threads(ctx.threads)
        st = prep["stats"]
        self.preallocated_bytes = st["arena_bytes"] + st["optimizer_state_bytes"]
        part = prep.get("partition", {})
        device = vulkan_device()
        self.notes = [f"Vulkan on {device}" + (" (CPU Vulkan: a sanity check, not a GPU timing)"
                                                if "llvmpipe" in device or "lavapipe" in device else "")]
        if part.get("cpu_nodes"):
            self.notes.append(f"{part['cpu_nodes']} of {part['cpu_nodes'] + part['vulkan_nodes']} nodes on the CPU")


def vulkan_device() -> str:
    """The first device `vulkaninfo --summary` lists ("?" when it cannot say)."""
    import subprocess
    try:
        r = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "?"
    names = [ln.split("=", 1)[1].strip() for ln in r.stdout.splitlines() if ln.strip().startswith("deviceName")]
    return names[0] if names else "?"


# ============================================================================ PyTorch eager / torch.compile
class TorchRunner:
    compiled = False

    def __init__(self, ctx: Ctx, prep: dict | None):
        set_torch_threads(ctx.threads)
        model, update, trained, partial, batches = ctx.load()
        self.model = model
        for n, p in model.named_parameters():
            p.requires_grad_(n in trained)
        params = dict(model.named_parameters())
        self.masks = [(params[n], k) for n, k in partial.items()]
        self.opt = torch.optim.SGD([p for n, p in params.items() if n in trained], lr=LR, momentum=MOMENTUM)
        self.preallocated_bytes = 0
        self.notes = ["full gradient, frozen slice masked"] if partial else []

        def loss_fn(x, y):
            return ce_loss(model(x), y)

        self.loss_fn = loss_fn
        if self.compiled:
            self.loss_fn = torch.compile(loss_fn)
            # compile (forward and backward) before the memory baseline; drop the grads again
            x, y = batches[0]
            self.loss_fn(*x, *y).backward()
            self.opt.zero_grad(set_to_none=True)

    def batch(self, x, y):
        return x, y

    def step(self, b):
        x, y = b
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(*x, *y)
        loss.backward()
        for p, k in self.masks:
            p.grad[:, k:] = 0
        self.opt.step()
        return loss.item()


class CompiledRunner(TorchRunner):
    compiled = True


class TorchRunner1T(TorchRunner):
    """PyTorch eager on one thread (the reference of the 1-thread rows)."""

    def __init__(self, ctx: Ctx, prep: dict | None):
        super().__init__(dataclasses.replace(ctx, threads=1), prep)


# PyTorch held to AVX2 + FMA, as it runs on a machine without AVX-512 (the reference of the -v3
# rows: issue 17's targets are ratios on an AVX2 machine, where PyTorch's kernels are AVX2 too).
# ATen's dispatch, MKL and oneDNN each read their cap from the environment when they load, so the
# eager-v3 workers fork from a zygote started with these set (bench/run.py).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def framework_env(framework: str) -> dict:
    """Environment a framework's processes need beyond the bench's own (the eager-v3 ISA cap)."""
    return AVX2_ENV if framework.startswith("eager-v3") else {}


class TorchRunnerAVX2(TorchRunner):
    """PyTorch eager with its kernels capped at AVX2 (framework_env), all threads."""

    def __init__(self, ctx: Ctx, prep: dict | None):
        super().__init__(ctx, prep)
        cap = torch.backends.cpu.get_cpu_capability()
        if cap.upper() not in ("AVX2", "DEFAULT"):
            raise RuntimeError(f"eager-v3: PyTorch runs {cap} kernels although ATEN_CPU_CAPABILITY=avx2")
        self.notes = [f"PyTorch kernels capped at AVX2 (ATen {cap}, MKL, oneDNN)", *self.notes]


class TorchRunnerAVX2_1T(TorchRunnerAVX2):
    def __init__(self, ctx: Ctx, prep: dict | None):
        super().__init__(dataclasses.replace(ctx, threads=1), prep)


def prepare_compiled(ctx: Ctx) -> dict:
    """Compile once in the prepare phase, so that the worker's compile hits inductor's on-disk
    caches (FX graph and AOTAutograd) instead of taking the machine for a minute per model."""
    CompiledRunner(ctx, None)
    return {}


# ============================================================================ ExecuTorch
class _TrainNet(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, y):
        return (ce_loss(self.m(x), y),)


def _et_decompositions():
    from torch._decomp import core_aten_decompositions, get_decompositions
    aten = torch.ops.aten

    def var_mean(x, dim=None, *, correction=None, keepdim=False):
        dims = list(range(x.dim())) if dim is None else [d % x.dim() for d in dim]
        n = math.prod(x.shape[d] for d in dims)
        mean = aten.mean.dim(x, dims, True)
        c = x - mean
        var = aten.sum.dim_IntList(c * c, dims, keepdim) / (n - (1 if correction is None else correction))
        return var, (mean if keepdim else aten.squeeze.dims(mean, dims))

    table = dict(core_aten_decompositions())
    # not in the core ATen opset / no ExecuTorch kernel: training-mode BatchNorm and the fused
    # SDPA backward; decompose them into core ops (SDPA with the math backend, below)
    table.update(get_decompositions([aten._native_batch_norm_legit_functional]))
    table[aten.var_mean.correction] = var_mean
    return table


def prepare_executorch(ctx: Ctx) -> dict:
    from torch.export import export
    from torch.export.exported_program import _decompose_exported_program
    from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    model, _, trained, _, batches = ctx.load()
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
    (x,), (y,) = batches[0]
    with sdpa_kernel([SDPBackend.MATH]):
        ep = export(_TrainNet(model), (x, y), strict=False)
        # = torch.export.experimental._export_forward_backward with a larger decomposition table
        ep = _decompose_exported_program(ep, cia_to_decomp={}, python_decomp_table=_et_decompositions(),
                                         joint_loss_index=0, decompose_custom_triton_ops=False)
        gm, sig = _copy_graph_module_and_signature(ep)
        _remove_detach_pass(gm, sig)
        ep = ep._update(gm, sig)
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
    # BatchNorm's running statistics are mutated buffers: keep their initial values in the program
    prog = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch(
        ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["running_", "num_batches"])]))
    path = ctx.art_dir / "model.pte"
    path.write_bytes(prog.buffer)
    return {"pte": str(path)}


class ExecuTorchRunner:
    """ExecuTorch's training runtime without its TrainingModule wrapper: TrainingModule slices
    the outputs with index methods that, in executorch 1.5.1, count BatchNorm's running-stat
    updates as outputs, so on MobileNetV2 it hands the optimizer the wrong tensors (or none). A
    joint program's outputs are [loss, gradients..., parameters...] with one gradient and one
    parameter for each of the __et_training_fqn_forward names, so slice from the end instead."""

    def __init__(self, ctx: Ctx, prep: dict):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool
        from executorch.extension.training import get_sgd_optimizer
        set_torch_threads(ctx.threads)
        _unsafe_reset_threadpool(ctx.threads)
        _, _, trained, partial, batches = ctx.load()
        rss0 = _rss_bytes()
        self.mod = _load_for_executorch(prep["pte"])
        fqn = [n.removeprefix("m.") for n in self.mod.run_method("__et_training_fqn_forward", ())]
        if set(fqn) != trained:
            raise RuntimeError(f"ExecuTorch program trains {len(fqn)} tensors, the scheme {len(trained)}")
        self.fqn, n = fqn, len(fqn)
        (x,), (y,) = batches[0]
        outs = self.mod.run_method("forward", (x, y), clone_outputs=False)  # gradients only, no update
        if len(outs) != 1 + 2 * n:
            raise RuntimeError(f"unexpected ExecuTorch outputs: {len(outs)} for {n} trained tensors")
        self.params = dict(zip(fqn, outs[1 + n:]))  # the program's own weights (updated in place)
        self.opt = get_sgd_optimizer(self.params, LR, MOMENTUM, 0, 0, False)
        self.masks = list(partial.items())
        # The method (and its memory-planned buffers: activations, gradients) is allocated on the
        # first run, which had to happen before the baseline; count what it took beyond the
        # program file (weights) as training memory, like PockEngine's arena.
        self.preallocated_bytes = max(0, _rss_bytes() - rss0 - os.path.getsize(prep["pte"]))
        self.notes = ["portable CPU kernels"] + (["full gradient, frozen slice masked"] if partial else [])

    def batch(self, x, y):
        return (*x, *y)

    def step(self, b):
        outs = self.mod.run_method("forward", b, clone_outputs=False)
        n = len(self.fqn)
        grads = dict(zip(self.fqn, outs[1:1 + n]))
        for name, k in self.masks:
            grads[name][:, k:] = 0
        self.opt.step(grads)
        return outs[0].item()


# ============================================================================ ONNX Runtime training
class _Flat(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        out = self.m(x)
        return out.reshape(-1, out.shape[-1])


def prepare_onnxruntime(ctx: Ctx) -> dict:
    import warnings
    import onnx
    from onnxruntime.training import artifacts

    warnings.filterwarnings("ignore")
    model, _, trained, partial, batches = ctx.load()
    (x,), _ = batches[0]
    path = ctx.art_dir / "model.onnx"
    # TorchScript exporter, training mode (BatchNorm with batch statistics), opset 16 (opset 17's
    # fused LayerNormalization has no gradient in ORT's builder)
    torch.onnx.export(_Flat(model), (x,), str(path), dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input"], output_names=["logits"],
                      opset_version=16)
    proto = onnx.load(str(path))
    inits = {i.name for i in proto.graph.initializer}
    missing = [n for n in trained if f"m.{n}" not in inits]
    if missing:
        raise RuntimeError(f"trained parameters not found in the ONNX graph: {missing[:3]}")
    requires = [f"m.{n}" for n in sorted(trained)]
    art = ctx.art_dir / "artifacts"
    art.mkdir(exist_ok=True)
    artifacts.generate_artifacts(proto, requires_grad=requires, frozen_params=sorted(inits - set(requires)),
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=str(art))
    return {"dir": str(art), "partial": {f"m.{n}": k for n, k in partial.items()}}


class OrtRunner:
    def __init__(self, ctx: Ctx, prep: dict):
        import numpy as np
        import onnxruntime as ort
        from onnxruntime.training.api import CheckpointState, Module, Optimizer
        ort.set_default_logger_severity(3)
        set_torch_threads(ctx.threads)
        so = ort.SessionOptions()
        so.intra_op_num_threads = ctx.threads
        so.inter_op_num_threads = 1
        d = prep["dir"]
        self.state = CheckpointState.load_checkpoint(f"{d}/checkpoint")
        self.mod = Module(f"{d}/training_model.onnx", self.state, None, session_options=so)
        self.opt = Optimizer(f"{d}/optimizer_model.onnx", self.mod)
        self.opt.set_learning_rate(LR)
        self.mod.train()
        self.np = np
        self.frozen = []  # (name, k, frozen slice) for partial updates
        for name, k in prep["partial"].items():
            self.frozen.append((name, k, np.array(self.state.parameters[name].data[:, k:])))
        self.preallocated_bytes = 0
        self.notes = ["SGD without momentum (ORT has none)"]
        if self.frozen:
            self.notes.append("full gradient, frozen slice restored")

    def batch(self, x, y):
        return [t.numpy() for t in x] + [t.reshape(-1).numpy().astype(self.np.int64) for t in y]

    def step(self, b):
        loss = self.mod(*b)
        self.opt.step()
        self.mod.lazy_reset_grad()
        for name, k, frozen in self.frozen:
            p = self.state.parameters[name]
            w = p.data
            w[:, k:] = frozen
            p.data = w
        return float(loss)


PREPARE = {"pockengine": prepare_pockengine, "pockengine-vulkan": prepare_pockengine_vulkan, "torch.compile": prepare_compiled, "executorch": prepare_executorch,
           "onnxruntime": prepare_onnxruntime,
           **{fw: (lambda ctx, fw=fw: prepare_pockengine_variant(ctx, fw)) for fw in PE_VARIANTS}}
RUNNERS = {"pockengine": PockEngineRunner, "pockengine-vulkan": PockEngineVulkanRunner, "eager": TorchRunner, "eager-1t": TorchRunner1T,
           "eager-v3": TorchRunnerAVX2, "eager-v3-1t": TorchRunnerAVX2_1T, "torch.compile": CompiledRunner,
           "executorch": ExecuTorchRunner, "onnxruntime": OrtRunner, **{fw: PockEngineRunner for fw in PE_VARIANTS}}


def to_json(obj):
    return json.loads(json.dumps(obj, default=str))


def env_python(framework: str) -> str:
    """The interpreter a framework's processes run in (ONNX Runtime training: its own venv)."""
    if framework == "onnxruntime":
        root = HERE.parent
        return os.environ.get("BENCH_ORT_PYTHON", str(root / ".venv-ort" / "bin" / "python"))
    return sys.executable
