"""The CPU backend's record: it runs every op, as C++ kernels at fixed offsets; its step is
the all-CPU step codegen renders (codegen.emit_cpu over codegen/emit.py's lines), and every
other step backend's CPU nodes are emitted the same way."""
from __future__ import annotations

from ..codegen import emit_cpu
from ..ops import REGISTRY
from . import Backend, Device, register


def check_coverage():
    """The ops without a CPU emitter (transfers between backends are emitted by the accelerator backend)."""
    missing = sorted(op for op, r in REGISTRY.items() if r.cpu is None and not r.transfer)
    return missing


def emit(prog, cost=None, options=None):
    """The step's Source on the CPU alone (the cost model has nothing to partition)."""
    return emit_cpu(prog, options)


register(Backend(
    "cpu", Device(flops_per_s=20e9, dispatch_s=0.3e-6),  # a phone-class core (the partitioner's cost model)
    emit=emit, platforms=("host", "android", "ios"), doc="every op, as C++ kernels (native/runtime/kernels)"))
