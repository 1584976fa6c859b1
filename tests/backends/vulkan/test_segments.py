"""Backends as segments of codegen's one step loop (issue 35): in a Vulkan build the CPU nodes
get what a CPU build gives them, the exact guard's kernel checks and the updates fused into the
weight gradient's GEMM, and the build trains as the all-CPU one does; the non-finite guard is
codegen's (the loss copied to the host's slot, checks after the segment that computed the value)."""
import copy

import numpy as np
import pytest
import torch

import pockengine as pe
from models import MODELS, batches
from pockengine.backends.vulkan import render, supports
from pockengine.codegen import Source
from pockengine.compiler.program import build
from pockengine.passes.partition import partition
from vk_helpers import needs_vulkan

CPU_OPS = ("linear_bwd_weight", "sgd_update")  # kept on the CPU: the weight gradients and the updates


def mixed(exact):
    """The MLP's step with its weight gradients and SGD updates on the CPU, the rest on Vulkan."""
    torch.manual_seed(0)
    model = MODELS["mlp"]().train()
    data = batches("mlp")
    prog = pe.compile(copy.deepcopy(model), *data[0], optimizer=pe.SGD(lr=0.05, momentum=0.9), exact_skip=exact,
                      name=f"vk_mixed_{int(exact)}")
    part = partition(prog.order, prog.graph, ["vulkan", "cpu"],
                     {"vulkan": lambda n: supports(n) and n.op not in CPU_OPS}, prefer="vulkan")
    assert {n.op for n in part.nodes_on("cpu")} >= set(CPU_OPS)
    assert part.nodes_on("vulkan")
    text, digest = render(prog, part)
    return prog, data, part, Source(text, digest, ("vulkan", "cpu"), part)


def test_cpu_nodes_of_a_vulkan_build_get_kernel_checks_and_fused_updates():
    _, _, _, exact = mixed(True)
    # the exact guard's check made by the weight gradient's GEMM, as in a CPU build
    assert "pk::linear_bwd_weight_finite(" in exact.text
    _, _, _, partial = mixed(False)
    # without the exact guard the SGD update runs inside the weight gradient's GEMM
    assert "pk::linear_bwd_weight_sgd(" in partial.text
    assert "// fused into node" in partial.text
    for src in (exact, partial):
        assert "the loss on the host from here" in src.text  # codegen's loss guard, on the host's slot


@needs_vulkan
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "not_exact"])
def test_mixed_vulkan_build_trains_as_the_cpu_build(exact):
    prog, data, part, source = mixed(exact)
    vk, cpu = build(prog, source), prog.build(backends=["cpu"])
    losses = [(vk.step(*data[i % 3]), cpu.step(*data[i % 3])) for i in range(4)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-4, atol=1e-6)
    got, want = vk.state_dict(), cpu.state_dict()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    # a NaN batch: skipped by the guard, nothing applied, the loss reported
    before = vk.state_dict()
    (x,), y = data[0]
    loss = vk.step((torch.full_like(x, float("nan")),), y)
    assert vk.last_step_status == "skipped", vk.last_step_message
    assert np.isnan(loss)
    for k, v in vk.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
