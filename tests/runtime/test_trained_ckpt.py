"""trainer.save(path, trained_only=True): only the trained tensors + optimizer
state, tied to the frozen base weights by hash (pockengine/runtime/trained_ckpt.py)."""
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


# ---------------------------------------------------------------- the C API's trained-only checkpoints
def _c_save_trained(trainer, path) -> None:
    """pock_save_trained (native/runtime/trained_ckpt.cpp), what the Kotlin and Swift SDKs call."""
    import ctypes
    fn = trainer._lib.pock_save_trained
    fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_void_p, ctypes.c_char_p]
    trainer._check(fn(trainer._live(), str(path).encode()))


def _c_load(trainer, path) -> None:
    """pock_load, which reads a trained-only file by its magic."""
    trainer._check(trainer._lib.pock_load(trainer._live(), str(path).encode()))


def test_c_and_python_trained_only_checkpoints_are_one_format(tmp_path):
    prog = _prog()
    data = batches("gpt")
    a = prog.build()
    for i in range(3):
        a.step(*data[i])
    a.save(tmp_path / "py.pockckpt", trained_only=True)
    _c_save_trained(a, tmp_path / "c.pockckpt")
    # the same bytes from both writers
    assert (tmp_path / "py.pockckpt").read_bytes() == (tmp_path / "c.pockckpt").read_bytes()
    for writer, reader in (("py", _c_load), ("c", lambda t, p: t.load(p))):  # Python's file into C, C's into Python
        b = prog.build()
        reader(b, tmp_path / f"{writer}.pockckpt")
        assert b.step_count == 3
        for name, value in a.state_dict().items():
            np.testing.assert_array_equal(b.get_tensor(name), value, err_msg=f"{writer}: {name}")
        np.testing.assert_array_equal(b.get_tensor("blocks.0.qkv.lora_A:exp_avg"), a.get_tensor("blocks.0.qkv.lora_A:exp_avg"))


def test_c_load_of_a_trained_only_checkpoint_validates_before_touching_state(tmp_path):
    prog = _prog()
    a = prog.build()
    a.step(*batches("gpt")[0])
    path = tmp_path / "lite.pockckpt"
    _c_save_trained(a, path)
    b = prog.build()
    b.set_tensor("blocks.0.fc1.weight", b.get_tensor("blocks.0.fc1.weight") + 1)  # other base weights
    before = copy.deepcopy(b.state_dict())
    with pytest.raises(pe.PockError, match="other base weights"):
        _c_load(b, path)
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    (tmp_path / "bad.pockckpt").write_bytes(bytes(blob))
    with pytest.raises(pe.PockError, match="corrupt"):
        _c_load(b, tmp_path / "bad.pockckpt")
    (tmp_path / "short.pockckpt").write_bytes(bytes(blob[:40]))
    with pytest.raises(pe.PockError, match="corrupt|truncated"):
        _c_load(b, tmp_path / "short.pockckpt")
    for name, value in before.items():
        np.testing.assert_array_equal(b.get_tensor(name), value, err_msg=name)
    assert b.step_count == 0
