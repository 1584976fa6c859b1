"""The non-finite guard on the Vulkan backend (issue 13): the host checks the loss and the
gradients (reading the device buffer) before the updates.  exact_skip (the default): one
check of everything before the first update, so a NaN loss, an inf early gradient or an inf
late gradient leaves weights and optimizer state bit-identical and the next good step equals
a trainer that never saw the bad batch.  exact_skip=False: each update's own gradient is
checked before it runs (its segment split there); nothing NaN ever reaches the state.
(Before: the Vulkan step had no guard at all and every case below poisoned the weights.)"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from test_reliability import Guarded, assert_same, guard_batch, snapshot  # noqa: E402
from vk_helpers import needs_vulkan, on_vulkan

pytestmark = needs_vulkan
# (tensor, value): a NaN loss (sqrt(-1)), an inf gradient of s (the first complete), of t (the last)
POISONS = [("s", -1.0, "the loss is NaN or inf"), ("s", 0.0, "the gradient of 's' is NaN or inf"),
           ("t", 0.0, "the gradient of 't' is NaN or inf")]


@pytest.fixture(scope="module", params=[True, False], ids=["exact", "not_exact"])
def prog(request):
    torch.manual_seed(0)
    return pe.compile(Guarded(), *guard_batch(0), optimizer=pe.AdamW(lr=0.01), exact_skip=request.param,
                      name=f"vk_guarded_{int(request.param)}")


@pytest.mark.parametrize("name,value,message", POISONS)
def test_vulkan_step_skips_nonfinite_loss_and_gradients(prog, name, value, message):
    t, clean = (prog.build(backends=["vulkan", "cpu"]) for _ in range(2))
    on_vulkan(t, "adamw_update", "cross_entropy", "linear_bwd_weight")
    for tr in (t, clean):
        tr.step(*guard_batch(1))
    t.set_tensor(name, np.array(value, np.float32))
    before = snapshot(t)
    loss = t.step(*guard_batch(2))
    assert t.last_step_status == "skipped", t.last_step_message
    assert t.last_step_message == f"{message}: step skipped, no update applied"
    assert np.isnan(loss) if message.startswith("the loss") else np.isfinite(loss)
    assert_same(snapshot(t), before)
    t.set_tensor(name, clean.get_tensor(name))
    assert t.step(*guard_batch(3)) == clean.step(*guard_batch(3))
    assert t.last_step_status == "ok"
    assert_same(snapshot(t), snapshot(clean))
