"""One packaging path for every target, one way to load a built step.

    package(prog, backends, target, out)       split the frozen prefix -> emit the step ->
                                              write <name>.cpp and summary.md -> the target
                                              compiles it -> initial weights + model bundle
                                              (+ the prefix's artifact) -> the target's files
    build_step(prog, source, out_dir)          `source` (prog's emitted step) built and loaded
                                              on this host (prog.build, the prefix backends)
    compile_library(prog, source, out_dir)     the host library of `source`
    load_trainer(prog, lib, source)            a built library as a Trainer with prog's weights

A target (`Target`: host in cli.py, android in platforms/android.py, ios in platforms/ios.py)
supplies only how the written source becomes libraries and where its files go."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..backends import check_backends, split_roles, step_backend
from ..errors import PockError
from .host import MODEL_OPT


@dataclass(frozen=True)
class Target:
    """What differs between the host, Android and iOS packages."""
    platform: str  # "host", "android", "ios"
    compile: Callable  # (step program, source, the written .cpp) -> {label: library path}
    layout: Callable  # (step program, source, out, libraries, weights, bundle dir, prefix entry) -> {label: path}
    prefix_soc: object = None  # the prefix backend's export hook's `soc` argument
    prefix_kwargs: tuple = ()  # ((keyword, value), ...) more arguments of that hook
    require_prefix: bool = False  # a prefix backend with no frozen prefix to move is a PockError


def package(prog, backends, target: Target, out) -> dict:
    """Package `prog` for `target` in out/ over `backends`; returns {label: path}, always
    with "source" (the written .cpp, exactly what the libraries were built from) and
    "bundle" (model.json + initial weights, + the prefix's artifact)."""
    from ..runtime.bundle import write_bundle
    from ..runtime.checkpoint import write_initial_checkpoint

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prefix_backend, step_backends = split_roles(check_backends(backends))
    prefix, step = None, prog
    if prefix_backend is not None:
        prefix, step = prefix_backend.split(prog)
        if prefix is None and target.require_prefix:
            raise PockError(f"--backends {prefix_backend.name}: model '{prog.name}' has no frozen prefix (every "
                            f"forward op leads to a trained parameter); freeze its first layers or drop "
                            f"{prefix_backend.name}")
        _report_prefix(prefix_backend.name, prefix)
    source = step.emit(step_backends)  # the one source: written, summarized, built, hashed and bundled
    if source.partition is not None:
        from ..passes.partition import format_partition
        print(format_partition(source.partition))
    cpp = out / f"{prog.name}.cpp"
    cpp.write_text(source.text)
    (out / "summary.md").write_text(step.summary(source))
    libraries = target.compile(step, source, cpp)
    weights = write_initial_checkpoint(step, out / f"{prog.name}.pockckpt", source)
    bundle = out / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    entry = None
    if prefix is not None:
        entry = prefix_backend.export(prefix, bundle, target.prefix_soc, **dict(target.prefix_kwargs))
    write_bundle(step, weights, bundle, prefix=entry, source=source)
    return {**target.layout(step, source, out, libraries, weights, bundle, entry), "source": cpp, "bundle": bundle}


def write_initial_bundle(prog, out, source=None) -> Path:
    """out/bundle: model.json + the initial weights of `source` (default: the all-CPU step),
    written without building; what package() writes for a step with no frozen prefix (the host
    JVM tests open it with a host-built library)."""
    from ..runtime.bundle import write_bundle
    from ..runtime.checkpoint import write_initial_checkpoint
    weights = write_initial_checkpoint(prog, Path(out) / f"{prog.name}.pockckpt", source)
    return write_bundle(prog, weights, Path(out) / "bundle", source=source)


def _report_prefix(backend: str, prefix) -> None:
    if prefix is None:
        print(f"partition: no frozen prefix for {backend} (every forward op leads to a gradient); "
              f"the step runs without it")
        return
    print(f"partition: {backend} runs the frozen prefix {prefix!r}")
    if prefix.partition is not None:
        from ..passes.partition import format_partition
        print(format_partition(prefix.partition))  # the step as the partitioner split it


# ---- building and loading on this host ---------------------------------------------------------
def compile_library(prog, source, out_dir=None, *, model_opt: str = MODEL_OPT, runtime=None,
                    march: str | None = None, timings: dict | None = None) -> Path:
    """The shared library of `source` (prog's emitted step) for this host: its step backend's
    compile hook (Vulkan links its runtime), else the CPU runtime's.  model_opt: the model
    TU's optimisation level; runtime: another native/runtime tree to build with; march: g++'s
    -march (default $POCK_MARCH or native); timings: each compiled object's seconds (all four
    build_shared_library's; a backend's own compile hook takes none)."""
    from .host import build_shared_library, cache_dir, write_source
    builder = step_backend(source.backends)
    if builder.compile is not None:
        if model_opt != MODEL_OPT or runtime is not None or march is not None or timings is not None:
            raise PockError(f"backend {builder.name!r} builds its library itself: model_opt, runtime, march and timings "
                            f"apply to the CPU runtime's build")
        return Path(builder.compile(prog, source, out_dir))
    if builder.build is not None:
        raise PockError(f"backend {builder.name!r} runs without a library of its own (use prog.build)")
    src_dir = Path(out_dir) if out_dir else cache_dir() / "models"
    path = write_source(src_dir / f"{prog.name}-{source.hash}.cpp", source.text)
    return build_shared_library([path], src_dir, model_opt=model_opt, runtime=runtime, march=march, timings=timings)


def load_trainer(prog, lib, source=None, *, open_device=None, input_stage=None, prefix_manifest=None):
    """The Trainer over the built library `lib` of prog's step (`source`), holding prog's weights."""
    from ..runtime.trainer import Trainer
    trainer = Trainer(str(lib), aliases=prog.aliases,  # state_dict lists tied weights under every name
                      open_device=open_device, input_stage=input_stage, prefix_manifest=prefix_manifest,
                      partition=source.partition if source is not None else None,
                      lora_adapters=prog.lora_adapters, trained_names=list(prog.trained), decoder=prog.decoder)
    for name, v in prog.state.items():
        if v.data is not None:
            trainer.set_tensor(name, v.data)
    return trainer


def build_step(prog, source, out_dir=None, *, input_stage=None, prefix_manifest=None, model_opt: str = MODEL_OPT,
               runtime=None, march: str | None = None, timings: dict | None = None):
    """Stage `build`: compile `source` (prog's emitted step) for this host and load it with
    prog's weights (a backend with a build hook of its own, the reference interpreter, loads
    itself); input_stage / prefix_manifest: a frozen prefix run in front of it; model_opt,
    runtime, timings: compile_library's."""
    builder = step_backend(source.backends)
    if builder.build is not None and builder.compile is None:
        if input_stage is not None:
            raise PockError(f"backend {builder.name!r} cannot run the step after a frozen prefix")
        return builder.build(prog, source, out_dir)
    lib = compile_library(prog, source, out_dir, model_opt=model_opt, runtime=runtime, march=march, timings=timings)
    return load_trainer(prog, lib, source, open_device=builder.open,
                        input_stage=input_stage, prefix_manifest=prefix_manifest)


__all__ = ["Target", "package", "compile_library", "load_trainer", "build_step", "write_initial_bundle"]
