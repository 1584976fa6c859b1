"""The partitioner: backends per node, the inference-only rule, the cost model,
explicit transfer nodes and one verified memory plan per backend."""
import pytest
import torch

import pockengine as pe
from models import MODELS, SPARSE, batches
from pockengine.backends.vulkan import supports
from pockengine.ops import REGISTRY
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
        if not REGISTRY[n.op].view:
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


@pytest.fixture
def npu():
    """A prefix backend registered for the test: htp's record, but without batch_norm_eval."""
    from dataclasses import replace

    from pockengine.backends import get, register, unregister
    from pockengine.passes.prefix import torch_supports
    register(replace(get("htp"), name="npu", supports=lambda n: torch_supports(n) and n.op != "batch_norm_eval"))
    try:
        yield "npu"
    finally:
        unregister("npu")


def frozen_stem_cnn():
    torch.manual_seed(0)
    model = MODELS["cnn"]().eval()  # the frozen stem's BatchNorms use running statistics
    return pe.compile(model, *batches("cnn")[0], update=SPARSE["cnn"], optimizer=pe.AdamW(lr=1e-3))


def test_the_partitioner_decides_the_frozen_prefix(npu):
    """split_prefix cuts where the partitioner puts the prefix backend's nodes: an op the
    backend's record does not support ends the prefix there (it and what follows stay on
    the CPU), whatever the cost model says, and format_partition shows the prefix backend."""
    from pockengine.passes.prefix import split_prefix
    prog = frozen_stem_cnn()
    stem = ["conv2d", "batch_norm_eval"] * 3
    slow = CostModel({**CostModel().devices, "htp": Device(1.0, 1.0, 1.0), npu: Device(1.0, 1.0, 1.0)})
    part = partition(prog.order, prog.graph, ["htp", "cpu"], cost=slow)
    ops = [n.op for n in part.nodes_on("htp") if not REGISTRY[n.op].view]
    # the step also slices the stem's output for project.weight's sparse gradient: work the
    # inference pass does not share, so the split leaves it to the CPU
    assert [op for op in ops if op != "slice"] == stem and ops.count("slice") == 1
    check_spaces(part)
    prefix, suffix = split_prefix(prog, "htp")
    assert [n.op for n in prefix.nodes] == stem
    assert [n.op for n in prefix.partition.nodes_on("htp") if not REGISTRY[n.op].view] == stem
    assert "slice" in [n.op for n in suffix.graph.nodes if n.phase == "forward"]
    text = format_partition(prefix.partition)
    assert "\n  htp        6 nodes" in text and "segments: htp[" in text, text

    part = partition(prog.order, prog.graph, [npu, "cpu"], cost=slow)
    assert [n.op for n in part.nodes_on(npu) if not REGISTRY[n.op].view] == ["conv2d"]
    assert f"\n  {npu:7}    1 nodes" in format_partition(part)
    check_spaces(part)
    prefix, suffix = split_prefix(prog, npu)
    assert [n.op for n in prefix.nodes] == ["conv2d"]
    assert [n.op for n in suffix.graph.nodes if n.phase == "forward"][:2] == ["batch_norm_eval", "conv2d"]
    assert [o["shape"] for o in prefix.outputs] == [list(prefix.nodes[0].outputs[0].shape)]


def test_a_prefix_backend_that_runs_nothing_gives_no_prefix(npu):
    """A model whose first op the prefix backend cannot run has no prefix: the whole step
    stays on the CPU (no error)."""
    from dataclasses import replace

    from pockengine.backends import get, register
    from pockengine.passes.prefix import split_prefix
    prog = frozen_stem_cnn()
    register(replace(get(npu), supports=lambda n: n.op != "conv2d"), replace=True)
    assert not partition(prog.order, prog.graph, [npu, "cpu"]).nodes_on(npu)
    assert split_prefix(prog, npu) == (None, prog)
