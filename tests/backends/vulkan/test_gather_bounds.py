"""Gathers on Vulkan never read with an index out of range (issue 13): the embedding and
cross-entropy shaders check all 64 bits of every index, write zeros / count the row as
ignored and record the first bad position, and the step fails with the CPU's PockError
(layer, value, position, the inputs it comes from) leaving weights and optimizer state
unchanged.  Integer inputs that reach a gather unchanged are checked at the door as on the
CPU (the partitioned graph keeps their ranges).  Before: every case below returned a loss
and "ok"."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from vk_helpers import needs_vulkan, on_vulkan

pytestmark = needs_vulkan
VOCAB, CLASSES = 12, 12


class ShiftedIds(nn.Module):
    """Ids reach the embedding through torch.cat and `+ 1`, computed on the device."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4)
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, a, b):
        return self.fc(self.emb(torch.cat([a, b + 1], dim=1)))


def shifted_targets(out, t):  # class targets computed on the device: only the shader sees them
    return F.cross_entropy(out.reshape(-1, CLASSES), (t + 1).reshape(-1))


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randint(0, 10, (2, 3), generator=g), torch.randint(0, 10, (2, 3), generator=g)),
            (torch.randint(0, CLASSES - 1, (2, 6), generator=g),))


def state(t):
    return {k: v.copy() for k, v in t.state_dict().items()}, t.step_count


def assert_same(a, b):
    assert a[1] == b[1] and a[0].keys() == b[0].keys()
    for k in a[0]:
        np.testing.assert_array_equal(a[0][k], b[0][k], err_msg=k)


@pytest.fixture(scope="module")
def prog():
    torch.manual_seed(0)
    return pe.compile(ShiftedIds(), *batch(0), loss=shifted_targets, optimizer=pe.AdamW(lr=0.01),
                      name="vk_shifted_ids")


@pytest.fixture(scope="module")
def trainers(prog):
    vk, clean = prog.build(backends=["vulkan", "cpu"]), prog.build(backends=["vulkan", "cpu"])
    on_vulkan(vk, "embedding", "cross_entropy", "add_scalar")
    return vk, clean


I64 = np.iinfo(np.int64)


@pytest.mark.parametrize("value", [11, 12, 10**6, -2, -10**6, 2**32 - 1, 2**40, I64.max - 1, I64.min])
def test_ids_out_of_range_on_vulkan_are_a_pockerror(trainers, value):
    vk, clean = trainers
    (a, b), (t,) = batch(1)
    bad = b.clone()
    bad[1, 2] = value
    before = state(vk)
    with pytest.raises(pe.PockError, match=rf"embedding in emb \(Embedding\): index {value + 1} at flat "
                                           rf"position 11 of 'cat' \(computed from input 'input0', input 'input1'\) "
                                           rf"is outside \[0, {VOCAB}\)"):
        vk.step((a, bad), (t,))
    assert_same(state(vk), before)
    assert_same(state(vk), state(clean))
    # the next good step trains as if the bad one never happened
    assert vk.step((a, b), (t,)) == clean.step((a, b), (t,))
    assert_same(state(vk), state(clean))


@pytest.mark.parametrize("value", [CLASSES - 1, -3, 2**31 - 1, 2**36, I64.min])
def test_class_targets_out_of_range_on_vulkan_are_a_pockerror(trainers, value):
    vk, clean = trainers
    (a, b), (t,) = batch(2)
    bad = t.clone()
    bad[1, 4] = value  # flat position 10 of the (12,) targets
    before = state(vk)
    with pytest.raises(pe.PockError, match=rf"cross_entropy target in loss: index {value + 1} at flat "
                                           rf"position 10 of 'reshape_1' \(computed from target 'target0'\) "
                                           rf"is outside \[0, {CLASSES}\)"):
        vk.step((a, b), (bad,))
    assert_same(state(vk), before)
    bad[1, 4] = -101  # + 1 is ignore_index: ignored, not an error
    assert np.isfinite(vk.step((a, b), (bad,))) and vk.last_step_status == "ok"
    clean.step((a, b), (bad,))
    assert_same(state(vk), state(clean))


class PlainIds(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4)
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(self.emb(x)).reshape(-1, CLASSES)


def test_ids_straight_from_an_input_are_checked_at_the_door_on_vulkan():
    torch.manual_seed(0)
    x, y = torch.randint(0, VOCAB, (2, 3)), torch.randint(0, CLASSES, (6,))
    vk = pe.compile(PlainIds(), (x,), (y,), name="vk_plain_ids").build(backends=["vulkan", "cpu"])
    on_vulkan(vk, "embedding", "cross_entropy")
    for value in (VOCAB, -1, 2**40):
        bad = x.clone()
        bad[0, 1] = value
        with pytest.raises(pe.PockError, match=rf"input 0 'input0' holds {value} at flat index 1, outside \[0, {VOCAB}\)"):
            vk.step((bad,), (y,))
        bad_y = y.clone()
        bad_y[3] = value
        with pytest.raises(pe.PockError, match=rf"target 0 'target0' holds {value} at flat index 3"):
            vk.step((x,), (bad_y,))
