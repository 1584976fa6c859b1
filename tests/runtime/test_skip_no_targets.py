"""A batch with no real token (every label ignore_index) is skipped at pock_step's door
(POCK_ERR_NO_TARGETS): weights, AdamW state and the step count stay bit-identical, the step
is reported "skipped" and counted; one real token is enough to train."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontends"))

import pockengine as pe  # noqa: E402
from helpers import assert_same, snapshot  # noqa: E402
from hf_zoo import llama  # noqa: E402


@pytest.fixture(scope="module")
def trainer():
    torch.manual_seed(0)
    model, x, y, loss, output = llama()
    prog = pe.compile(model, x, y, loss=loss, output=output, optimizer=pe.AdamW(lr=1e-3))
    return prog.build(), x[0], y[0]


@pytest.mark.parametrize("strict", [False, True])
def test_all_ignored_labels_skip_the_step(trainer, strict):
    tr, x, y = trainer
    tr.strict = strict
    tr.step((x,), (y,))  # AdamW state is non-zero from here
    before, skipped = snapshot(tr), tr.skipped_steps
    empty = torch.full_like(y, -100)
    loss = tr.step((x,), (empty,))
    assert loss == 0.0  # nothing to average: reported as 0, as before (the step is skipped, not taken)
    assert tr.last_step_status == "skipped" and tr.skipped_steps == skipped + 1
    assert "no real target" in tr.last_step_message and "-100" in tr.last_step_message
    assert_same(snapshot(tr), before)  # every state tensor, step count and learning rate
    one = empty.clone()
    one[0, 3] = y[0, 3]
    assert np.isfinite(tr.step((x,), (one,))) and tr.last_step_status == "ok"
    assert tr.step_count == before[1] + 1

