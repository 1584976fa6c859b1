"""Helpers for the Vulkan tests: skip cleanly where the machine has no Vulkan,
and build one compiled program for both the CPU and the Vulkan backend."""
from __future__ import annotations

import copy
import ctypes.util
import functools
import math
import shutil
import subprocess

import numpy as np
import pytest

import pockengine as pe
from helpers import _weighted_sum, op_case


@functools.lru_cache(maxsize=None)
def vulkan_missing() -> str | None:
    """Why this machine cannot run the Vulkan tests, or None."""
    if shutil.which("glslc") is None:
        return "glslc not installed"
    if ctypes.util.find_library("vulkan") is None:
        return "libvulkan not installed"
    try:
        r = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or "deviceName" not in r.stdout:
            return "no Vulkan device (vulkaninfo --summary lists none)"
    except (FileNotFoundError, subprocess.TimeoutExpired):
        pass  # no vulkaninfo: trust the loader
    return None


needs_vulkan = pytest.mark.skipif(vulkan_missing() is not None, reason=str(vulkan_missing()))


def on_vulkan(trainer, *ops) -> None:
    """Every node with one of `ops` ran on Vulkan in trainer's partition."""
    part = trainer.partition
    found = {n.op for n in part.nodes_on("vulkan")}
    missing = [op for op in ops if op not in found]
    assert not missing, f"{missing} not on Vulkan; partition:\n{trainer.describe_partition()}"
    for n in part.graph.nodes:
        if n.op in ops:
            assert part.backend[id(n)] == "vulkan", f"{n!r} ran on {part.backend[id(n)]}"


def check_vulkan_op(fn, *tensors, ops=(), modules=(), optimizer=None, steps=1, rtol=1e-5, atol=1e-6, seed=0,
                    update="full"):
    """fn through one compiled program on the CPU and on Vulkan: the nodes in `ops`
    run on Vulkan, and the loss and every state tensor (after `steps` steps of
    SGD lr=1, so the parameter deltas are the gradients) match the CPU kernels;
    the CPU path is itself checked against torch by tests/codegen and helpers.check_op."""
    module, dummy, outs, weights = op_case(fn, tensors, modules, seed)
    prog = pe.compile(copy.deepcopy(module), (dummy,), weights, loss=_weighted_sum,
                      optimizer=optimizer or pe.SGD(lr=1.0), update=update)
    cpu = prog.build(backends=["cpu"])
    vk = prog.build(backends=["vulkan", "cpu"])
    on_vulkan(vk, *ops)
    scale = max(1.0, math.sqrt(sum(o.numel() for o in outs)))
    for _ in range(steps):
        want = cpu.step((dummy,), weights)
        got = vk.step((dummy,), weights)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)
    a, b = vk.state_dict(), cpu.state_dict()
    for name in b:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)
    return prog, vk
