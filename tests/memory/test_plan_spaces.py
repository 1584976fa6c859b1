"""memory.plan.plan_spaces is the one planner: the Program's plan of the all-CPU step and, after
partitioning, the plan of every memory space of a partitioned step (codegen.segmented_step)."""
import sys
from pathlib import Path

import pytest
import torch

import pockengine as pe
from pockengine.backends.vulkan import supports
from pockengine.memory.plan import plan_spaces, verify_plan
from pockengine.passes.partition import partition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import MODELS, batches  # noqa: E402


def program(name):
    torch.manual_seed(0)
    return pe.compile(MODELS[name](), *batches(name)[0], optimizer=pe.SGD(lr=0.1, momentum=0.9))


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_cpu_only_partition_plans_as_the_program(name):
    prog = program(name)
    part = partition(prog.order, prog.graph, ["cpu"], {})
    g = part.graph
    plan = plan_spaces(g.nodes, g, [g.loss], part.space)
    assert set(plan) == {"cpu"} and plan["cpu"].arena_bytes == prog.plan.arena_bytes
    for n in g.nodes:  # every value at the offset the Program's plan gives its original
        for o, orig in zip(n.outputs, part.origin[id(n)].outputs):
            if o is not None and not o.in_state:
                assert plan["cpu"].offset(o) == prog.plan.offset(orig), repr(o)


def test_partitioned_step_gets_a_plan_per_space():
    prog = program("gpt")
    part = partition(prog.order, prog.graph, ["vulkan", "cpu"], {"vulkan": supports}, prefer="vulkan")
    g = part.graph
    plans = plan_spaces(g.nodes, g, [g.loss], part.space, keep_whole=[g.loss])
    assert set(plans) == {"cpu", "vulkan"}
    for plan in plans.values():
        verify_plan(plan)
    host = plans["cpu"]
    for v in (*g.inputs, *g.targets, g.loss):
        host.offset(v)  # the host's values are in the host's arena
    loss = next(b for b in host.buffers if b.value is g.loss)
    assert (loss.first, loss.last) == (-1, len(g.nodes))  # reserved for the whole step (the guard's copy)
    for n in g.nodes:
        for o in n.outputs:
            if o is not None and part.space[id(o)] == "vulkan":
                assert id(o) in plans["vulkan"].offsets and id(o) not in host.offsets
