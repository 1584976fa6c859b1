"""trainer.save(path, trained_only=True): only the trained tensors + optimizer
state, tied to the frozen base weights by hash (pockengine/trained_ckpt.py)."""
import copy

import numpy as np
import pytest
import torch

import pockengine as pe
from models import GPT, batches


def _prog():
    torch.manual_seed(0)
    x, y = batches("gpt")[0]
    lora = pe.LoRA(rank=2, alpha=4, targets=["*.qkv"])
    return pe.compile(GPT(), x, y, update={"ln_f.*": 1.0}, optimizer=pe.AdamW(lr=1e-2), lora=lora)


def test_trained_only_checkpoint_is_small_and_restores_training_exactly(tmp_path):
    prog = _prog()
    data = batches("gpt")
    a = prog.build()
    for i in range(3):
        a.step(*data[i])
    a.save(tmp_path / "full.pockckpt")
    a.save(tmp_path / "lite.pockckpt", trained_only=True)
    full_size = (tmp_path / "full.pockckpt").stat().st_size
    lite_size = (tmp_path / "lite.pockckpt").stat().st_size
    assert lite_size < 0.25 * full_size, (lite_size, full_size)
    b = prog.build()  # fresh trainer: base weights, step 0
    b.load(tmp_path / "lite.pockckpt")
    assert b.step_count == a.step_count == 3
    for name, value in a.state_dict().items():
        np.testing.assert_array_equal(b.get_tensor(name), value, err_msg=name)
    # AdamW state and step count restored: the next steps are bit-identical
    for i in range(2):
        assert a.step(*data[i]) == b.step(*data[i])
    np.testing.assert_array_equal(a.get_tensor("blocks.0.qkv.lora_B"), b.get_tensor("blocks.0.qkv.lora_B"))


def test_trained_only_checkpoint_rejects_other_base_weights_and_corruption(tmp_path):
    prog = _prog()
    a = prog.build()
    a.step(*batches("gpt")[0])
    path = tmp_path / "lite.pockckpt"
    a.save(path, trained_only=True)
    b = prog.build()
    w = b.get_tensor("blocks.0.fc1.weight")
    b.set_tensor("blocks.0.fc1.weight", w + 1)
    before = copy.deepcopy(b.state_dict())
    with pytest.raises(pe.PockError, match="other base weights"):
        b.load(path)
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    (tmp_path / "bad.pockckpt").write_bytes(bytes(blob))
    c = prog.build()
    with pytest.raises(pe.PockError, match="corrupt"):
        c.load(tmp_path / "bad.pockckpt")
    for name, value in before.items():
        np.testing.assert_array_equal(b.get_tensor(name), value, err_msg=name)
