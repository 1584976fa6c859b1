"""The backend registry: one `Backend` record per backend, looked up by name.

A backend declares what it can run and how (the shape follows ggml's backend interface
and ExecuTorch's partitioner/preprocess split, written for this compiler):

  name            the name users pass in `prog.build(backends=[...])` / `--backends`
  role            "step": runs nodes of the training step (cpu, vulkan);
                  "prefix": runs the frozen forward prefix before the step (htp)
  inference_only  takes only forward nodes that do not depend on a trained value
  device          the partitioner's cost model for it (FLOP/s, dispatch, hand-over, transfer)
  supports(node)  whether it has a kernel for the node (None: every op; only "cpu"); the
                  partitioner (passes/partition.py) assigns nodes with it, a prefix backend's
                  frozen prefix included
  emit(prog, cost, options)   step backends: the step's codegen.Source with this backend's
                              partition (cpu's: the all-CPU step; a step backend without one
                              is rendered by the cpu record's)
  compile(prog, source, out)  step backends: the host library of `source` (None: the CPU
                              runtime's; build/package.compile_library), loaded with `open`
  build(prog, source, out)    step backends that load without a library (the reference
                              interpreter): their trainer for `source`
  split(prog)                 prefix backends: (prefix or None, the program that follows it), cut
                              where the partitioner puts its nodes (passes/prefix.split_prefix)
  build_with(prog, others, out, **kw)  prefix backends: a trainer running the prefix here
                              and the rest of the step on `others`
  export(prefix, bundle_dir, soc, **kw) prefix backends: its artifact in a bundle (manifest entry)
  open(lib_path)              runtime hook run before a library using it is loaded
  profile_remote(prefix, soc) prefix backends: compile and profile the prefix on a real device
                              in a hosted service (htp: Qualcomm AI Hub, `pock-build --ai-hub`)
  check_target(soc)           raises PockError where the SoC cannot run it
  platforms       the `pock-build --platform` values it builds for

The built-in backends (backends/cpu.py, vulkan.py, htp.py, coreml.py, reference.py) register themselves when
imported; `pockengine.compiler.program` imports them, so they are registered whenever the package
is.  This module imports none of them (it is a leaf of the import DAG)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import PockError

ALWAYS = "cpu"  # runs every op; every step backend set includes it


@dataclass(frozen=True)
class Device:
    """Estimated speed of one backend: FLOP/s, seconds per dispatch, seconds per
    hand-over (a submission and wait), and bytes/s + latency of a transfer."""
    flops_per_s: float
    dispatch_s: float
    handover_s: float = 0.0
    transfer_bytes_per_s: float = 10e9
    transfer_s: float = 1e-6


@dataclass(frozen=True)
class Backend:
    name: str
    device: Device
    role: str = "step"
    inference_only: bool = False
    supports: Callable | None = None
    emit: Callable | None = None
    compile: Callable | None = None
    build: Callable | None = None
    split: Callable | None = None
    build_with: Callable | None = None
    export: Callable | None = None
    open: Callable | None = None
    check_target: Callable | None = None
    profile_remote: Callable | None = None
    platforms: tuple[str, ...] = ("host",)
    doc: str = ""

    def __post_init__(self):
        if self.role not in ("step", "prefix"):
            raise PockError(f"backend {self.name!r}: role must be 'step' or 'prefix', got {self.role!r}")
        if self.role == "prefix" and (self.split is None or self.build_with is None):
            raise PockError(f"backend {self.name!r}: a prefix backend needs split and build_with hooks")


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend, replace: bool = False) -> Backend:
    """Add `backend` to the registry (replace=True to redefine a name, e.g. in tests)."""
    if not isinstance(backend, Backend):
        raise PockError(f"register() takes a Backend record, got {type(backend).__name__}")
    if backend.name in _REGISTRY and not replace:
        raise PockError(f"backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    if name == ALWAYS:
        raise PockError(f"backend {ALWAYS!r} cannot be unregistered (it runs every op)")
    _REGISTRY.pop(name, None)


def names() -> list[str]:
    """Registered backend names, in registration order."""
    return list(_REGISTRY)


def registered() -> list[Backend]:
    return list(_REGISTRY.values())


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PockError(f"unknown backend {name!r}; PockEngine has {names()}") from None


def devices() -> dict[str, Device]:
    """{name: Device} of every registered backend: the partitioner's default cost model."""
    return {b.name: b.device for b in _REGISTRY.values()}


def check_backends(backends) -> list[str]:
    """The backend list, checked: registered names, no repeats, and always "cpu"."""
    if isinstance(backends, str):
        backends = [backends]
    backends = list(backends or [ALWAYS])
    unknown = [b for b in backends if b not in _REGISTRY]
    if unknown:
        raise PockError(f"unknown backend(s) {unknown}; PockEngine has {names()}")
    if len(set(backends)) != len(backends):
        raise PockError(f"backends {backends} name one twice")
    if ALWAYS not in backends:
        raise PockError(f"backends {backends} must include 'cpu' (it runs every op the others do not)")
    return backends


def split_roles(backends) -> tuple[Backend | None, list[str]]:
    """(the prefix backend among `backends` or None, the step backends' names in order)."""
    prefix = [get(b) for b in backends if get(b).role == "prefix"]
    if len(prefix) > 1:
        raise PockError(f"backends {list(backends)} name {len(prefix)} prefix backends "
                        f"({', '.join(b.name for b in prefix)}); the frozen prefix runs on one")
    return (prefix[0] if prefix else None), [b for b in backends if get(b).role == "step"]


def step_backend(backends) -> Backend:
    """The step backend whose emitter renders the step for `backends` (step backends only):
    the one accelerator among them, else cpu."""
    accel = [get(b) for b in backends if b != ALWAYS and get(b).emit is not None]
    if len(accel) > 1:
        raise PockError(f"backends {list(backends)}: the step partitions over cpu and one accelerator "
                        f"in this version, got {', '.join(b.name for b in accel)}")
    return accel[0] if accel else get(ALWAYS)
