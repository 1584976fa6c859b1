"""The partitioner: backends per node, the inference-only rule, the cost model,
explicit transfer nodes and one verified memory plan per backend."""
import pytest
import torch

import pockengine as pe
from models import MODELS, SPARSE, batches
from pockengine.backends.vulkan import supports
from pockengine.ir.ops import OPS
from pockengine.passes.partition import (CostModel, Device, format_partition, partition, plan_spaces,
                                         trained_dependents)


def program(name, update="full"):
    torch.manual_seed(0)
    return pe.compile(MODELS[name](), *batches(name)[0], update=update, optimizer=pe.SGD(lr=0.1, momentum=0.9))


def check_spaces(part):
    """Every node reads only values held by its own backend (transfers bridge two); plans verify."""
    for n in part.graph.nodes:
        b = part.backend[id(n)]
        for v in n.inputs:
            if v is None or v.in_state:
                continue
            held = part.space[id(v)]
            if n.op == "transfer":
                assert held == n.attrs["src"]
            else:
                assert held == b, f"{n!r} on {b} reads {v!r} held by {held}"
    for plan in plan_spaces(part, [part.graph.loss]).values():
        assert plan.arena_bytes >= 0  # plan_memory verified it: no live overlap


def test_cpu_only_is_the_schedule_unchanged():
    prog = program("gpt")
    part = partition(prog.order, prog.graph, ["cpu"], {})
    assert [n.op for n in part.graph.nodes] == [n.op for n in prog.order]
    assert set(part.backend.values()) == {"cpu"}
    check_spaces(part)


@pytest.mark.parametrize("name", ["mlp", "gpt", "cnn", "lstm"])
def test_vulkan_takes_what_it_has_shaders_for_with_explicit_transfers(name):
    prog = program(name)
    part = partition(prog.order, prog.graph, ["vulkan", "cpu"], {"vulkan": supports}, prefer="vulkan")
    check_spaces(part)
    for n in part.graph.nodes:
        if n.op in ("transfer", "state_transfer"):
            continue
        want = "vulkan" if supports(n) else "cpu"
        if not OPS[n.op].view:
            assert part.backend[id(n)] == want, n
    on_vk = {n.op for n in part.nodes_on("vulkan")}
    assert {"linear", "linear_bwd_weight", "cross_entropy", "cross_entropy_bwd", "sgd_update"} <= on_vk
    if name == "gpt":  # attention stays on the CPU: its inputs and outputs cross over
        assert {n.op for n in part.nodes_on("cpu")} >= {"sdpa", "sdpa_bwd"}
        assert any(n.op == "transfer" and n.attrs["dst"] == "cpu" for n in part.graph.nodes)
    # parameters used on Vulkan are copied in, and the updated ones copied back
    ups = {n.inputs[0].name for n in part.graph.nodes if n.op == "state_transfer" and n.attrs["dst"] == "vulkan"}
    downs = {n.inputs[0].name for n in part.graph.nodes if n.op == "state_transfer" and n.attrs["dst"] == "cpu"}
    updated = {n.inputs[0].name for n in part.nodes_on("vulkan") if n.op == "sgd_update"}
    assert updated and updated <= ups and updated <= downs
    text = format_partition(part)
    assert "vulkan" in text and "transfers:" in text and "segments:" in text


def test_inference_only_backend_gets_only_gradient_free_nodes():
    prog = program("gpt", SPARSE["gpt"])
    everything = lambda n: True  # noqa: E731 - a backend that could run any op
    part = partition(prog.order, prog.graph, ["htp", "cpu"], {"htp": everything}, prefer="htp")
    dep = trained_dependents(prog.order)
    on_htp = part.nodes_on("htp")
    assert on_htp, "the frozen prefix (block 0) should go to the inference-only backend"
    for n in on_htp:
        assert n.phase == "forward"
        assert not any(v is not None and id(v) in dep for v in n.inputs), n
    assert all(n.phase == "forward" for n in on_htp)
    check_spaces(part)


def test_cost_model_keeps_small_work_on_the_cpu_and_moves_big_work():
    prog = program("mlp")
    slow = CostModel({"cpu": Device(20e9, 0.3e-6), "vulkan": Device(200e9, 1e-6, handover_s=1e-3)})
    part = partition(prog.order, prog.graph, ["vulkan", "cpu"], {"vulkan": supports}, slow)
    assert not part.nodes_on("vulkan")
    fast = CostModel({"cpu": Device(1e6, 1e-3), "vulkan": Device(1e12, 1e-7, handover_s=1e-7,
                                                                 transfer_bytes_per_s=1e12, transfer_s=1e-8)})
    part = partition(prog.order, prog.graph, ["vulkan", "cpu"], {"vulkan": supports}, fast)
    assert {n.op for n in part.nodes_on("vulkan")} >= {"linear", "linear_bwd_weight"}
    check_spaces(part)
