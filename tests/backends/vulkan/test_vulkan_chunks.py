"""A long Vulkan step is split into functions of at most EmitOptions.chunk_nodes nodes, as the
CPU's is (tests/codegen/test_chunks.py): each chunk gets the device and its memory from
train_step, which takes the device lock and writes the step's scalars once; the chunked
library trains exactly as the one-function library does, and the non-finite guard still
stops the step from a chunk."""
import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine import codegen
from pockengine.compiler import program
from pockengine.backends.vulkan import emit_vulkan

from models import GPT, batches
from vk_helpers import needs_vulkan

pytestmark = needs_vulkan


def _build(mp, chunk_nodes):
    torch.manual_seed(0)
    inputs, targets = batches("gpt")[0]
    prog = pe.compile(GPT(), inputs, targets, optimizer=pe.SGD(lr=0.05, momentum=0.9))
    source = emit_vulkan(prog, options=codegen.EmitOptions(chunk_nodes=chunk_nodes))
    return source, program.build(prog, source)


@pytest.fixture(scope="module")
def mp():
    m = pytest.MonkeyPatch()
    yield m
    m.undo()


@pytest.fixture(scope="module")
def one(mp):
    source, trainer = _build(mp, 10 ** 9)
    yield source, trainer
    trainer.close()


@pytest.fixture(scope="module")
def chunked(mp, one):  # after `one`: the patch below is the last one set
    source, trainer = _build(mp, 16)
    yield source, trainer
    trainer.close()


def test_vulkan_step_is_split_into_functions(one, chunked):
    text = chunked[0].text
    assert "train_step_0(" not in one[0].text
    k = text.count("pock_status train_step_")
    assert k >= 3 and f"pock_status train_step_{k}(" not in text
    assert "pvk::Device* const vk, uint8_t* const D)" in text
    assert text.count("std::lock_guard<std::mutex> lock(pvk::step_lock(vk));") == 1  # once, in train_step
    assert text.count("pvk::run(vk, ") == one[0].text.count("pvk::run(vk, ")  # the same segments


def test_chunked_vulkan_step_is_bit_identical(one, chunked):
    a, b = one[1], chunked[1]
    for x, y in batches("gpt"):
        assert a.step(x, y) == b.step(x, y)
    sa, sb = a.state_dict(), b.state_dict()
    for name in sa:
        np.testing.assert_array_equal(sa[name], sb[name])


def test_guard_stops_the_vulkan_step_from_a_chunk(chunked):
    _, trainer = chunked
    x, y = batches("gpt")[0]
    name = next(n for n in trainer.state_dict() if n.endswith("weight"))
    w = trainer.state_dict()[name].copy()
    w.flat[0] = np.nan
    trainer.set_tensor(name, w)
    before = {n: v.copy() for n, v in trainer.state_dict().items()}
    loss = trainer.step(x, y)
    assert not np.isfinite(loss) and trainer.last_step_status == "skipped"
    for n, v in trainer.state_dict().items():
        np.testing.assert_array_equal(v, before[n])
