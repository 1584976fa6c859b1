"""Bad input raises pe.PockError (a ValueError) naming the problem, never a
crash; a failed call changes nothing, and nothing already saved is lost."""
import os
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from models import MLP, batches
from helpers import assert_same, snapshot
from pockengine.runtime.checkpoint import decode, encode, read_checkpoint


class TokenModel(nn.Module):
    def __init__(self, vocab=10, d=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, vocab)

    def forward(self, idx):
        return self.fc(self.emb(idx))


@pytest.fixture(scope="module")
def mlp_data():
    return batches("mlp", n=2, seed=1)


@pytest.fixture(scope="module")
def mlp_trainer(mlp_data):
    torch.manual_seed(0)
    (x,), (y,) = mlp_data[0]
    prog = pe.compile(MLP(), (x,), (y,), optimizer=pe.SGD(lr=0.1, momentum=0.9))
    return prog.build()


@pytest.fixture(scope="module")
def token_trainer():
    torch.manual_seed(0)
    idx = torch.randint(0, 10, (2, 3))
    return pe.compile(TokenModel(), (idx,), (idx.clone(),), optimizer=pe.SGD(lr=0.1)).build()


def raises(fn, *patterns):
    with pytest.raises(pe.PockError) as info:
        fn()
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in {msg!r}"
    return msg


def test_pockerror_is_a_valueerror():
    assert issubclass(pe.PockError, ValueError)


# ---- step / forward inputs -------------------------------------------------------------------


def test_wrong_shapes(mlp_trainer, mlp_data):
    (x,), (y,) = mlp_data[0]
    t = mlp_trainer
    before = snapshot(t)
    raises(lambda: t.step((x[:4],), (y[:4],)), r"input 0 'input0'", r"expected shape \(8, 16\) float32",
           r"got \(4, 16\) float32")
    raises(lambda: t.step((x,), (y[:4],)), r"target 0 'target0'", r"expected shape \(8,\) int64", r"got \(4,\)")
    raises(lambda: t.step((x.reshape(16, 8),), (y,)), r"got \(16, 8\)")
    raises(lambda: t.forward((torch.randn(8, 15),)), r"expected shape \(8, 16\)", r"got \(8, 15\)")
    raises(lambda: t.forward((x[None],)), r"got \(1, 8, 16\)")
    assert_same(snapshot(t), before)


def test_wrong_dtypes(mlp_trainer, mlp_data):
    (x,), (y,) = mlp_data[0]
    t = mlp_trainer
    before = snapshot(t)
    raises(lambda: t.step((x.double(),), (y,)), "input 0", "float32", r"got \(8, 16\) float64")
    raises(lambda: t.step((x.numpy().astype(np.float64),), (y,)), "float64")
    raises(lambda: t.forward((x.double(),),), "float64")
    raises(lambda: t.step((x,), (y.int(),)), "target 0", "int64", r"got \(8,\) int32")
    raises(lambda: t.step((x,), (y.float(),)), "int64", "float32")
    raises(lambda: t.step((x.half(),), (y,)), "float16")
    raises(lambda: t.step((x.bfloat16(),), (y,)), "bfloat16")
    raises(lambda: t.step(("not a tensor",), (y,)), "input 0", "str")
    assert_same(snapshot(t), before)


def test_wrong_counts(mlp_trainer, mlp_data):
    (x,), (y,) = mlp_data[0]
    t = mlp_trainer
    before = snapshot(t)
    raises(lambda: t.step((x, x), (y,)), r"expected 1 inputs \(input0\), got 2")
    raises(lambda: t.step((), (y,)), r"expected 1 inputs \(input0\), got 0")
    raises(lambda: t.step((x,), ()), r"expected 1 targets \(target0\), got 0")
    raises(lambda: t.step((x,), (y, y)), r"expected 1 targets \(target0\), got 2")
    raises(lambda: t.forward((x, x)), r"expected 1 inputs \(input0\), got 2")
    raises(lambda: t.forward(()), r"expected 1 inputs \(input0\), got 0")
    assert_same(snapshot(t), before)


def test_trainer_still_works_after_errors(mlp_trainer, mlp_data):
    (x,), (y,) = mlp_data[0]
    t = mlp_trainer
    with pytest.raises(pe.PockError):
        t.step((x[:4],), (y,))
    n = t.step_count
    loss = t.step((x,), (y,))
    assert np.isfinite(loss) and t.step_count == n + 1
    assert t.forward((x,)).shape == (8, 5)


def test_out_of_range_class_target(mlp_trainer, mlp_data):
    (x,), (y,) = mlp_data[0]
    t = mlp_trainer
    before = snapshot(t)
    bad = y.clone()
    bad[3] = 5
    raises(lambda: t.step((x,), (bad,)), "target 0 'target0'", "holds 5 at flat index 3", r"outside \[0, 5\)")
    bad[3] = -1
    raises(lambda: t.step((x,), (bad,)), "holds -1", r"outside \[0, 5\)")
    assert_same(snapshot(t), before)
    ignored = y.clone()
    ignored[3] = -100  # the ignore index is fine
    assert np.isfinite(t.step((x,), (ignored,)))


def test_out_of_range_token_ids(token_trainer):
    t = token_trainer
    good = torch.randint(0, 10, (2, 3), generator=torch.Generator().manual_seed(3))
    before = snapshot(t)
    for value in (10, 11, 2**40, -1):
        bad = good.clone()
        bad[1, 2] = value
        raises(lambda: t.step((bad,), (good,)), "input 0 'input0'", f"holds {value} at flat index 5",
               r"outside \[0, 10\)")
        raises(lambda: t.forward((bad,)), "input 0 'input0'", f"holds {value}", r"outside \[0, 10\)")
        raises(lambda: t.step((good,), (bad,)), "target 0 'target0'", f"holds {value}", r"outside \[0, 10\)")
    assert_same(snapshot(t), before)
    assert np.isfinite(t.step((good,), (good,)))


def test_example_input_and_target_may_be_the_same_tensor():
    torch.manual_seed(0)
    idx = torch.randint(0, 10, (2, 3))
    model = TokenModel()
    t = pe.compile(model, (idx,), (idx,), optimizer=pe.SGD(lr=0.0)).build()
    a = torch.randint(0, 10, (2, 3), generator=torch.Generator().manual_seed(1))
    b = torch.randint(0, 10, (2, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = F.cross_entropy(model(a).reshape(-1, 10), b.reshape(-1)).item()
    assert t.step((a,), (b,)) == pytest.approx(want, rel=1e-5)
    bad = a.clone()
    bad[0, 0] = 10
    raises(lambda: t.step((bad,), (b,)), "input 0", r"outside \[0, 10\)")


# ---- compile-time errors ------------------------------------------------------------------------


class CumsumHead(nn.Module):  # cumprod: cumsum is supported now (frontends/aten_ext.py)
    def forward(self, x):
        return torch.cumprod(x, dim=1)


class FFTFeatures(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


class WithOp(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.fc = nn.Linear(16, 5)
        self.body = nn.Sequential(nn.Identity(), inner)

    def forward(self, x):
        return self.body(self.fc(x)) if isinstance(self.body[1], CumsumHead) else self.fc(self.body(x))


@pytest.mark.parametrize("inner, op, module", [(CumsumHead, "cumprod", r"body\.1 \(CumsumHead\)"),
                                               (FFTFeatures, "fft", r"body\.1 \(FFTFeatures\)")])
def test_unsupported_op_names_op_and_module(mlp_data, inner, op, module):
    (x,), (y,) = mlp_data[0]
    msg = raises(lambda: pe.compile(WithOp(inner()), (x,), (y,)), "unsupported op", module)
    assert op in msg.lower()


def test_bad_update_dicts(mlp_data):
    (x,), (y,) = mlp_data[0]
    model = MLP()

    def compile_with(update):
        return lambda: pe.compile(model, (x,), (y,), update=update)

    raises(compile_with({"net.9.weight": 1.0}), r"'net\.9\.weight'", "matches no parameter", r"net\.0\.weight")
    raises(compile_with({"decoder.*": 1.0}), r"'decoder\.\*'", "matches no parameter")
    raises(compile_with({"net.0.weight": 1.5}), r"'net\.0\.weight'", r"\[0, 1\]", "1.5")
    raises(compile_with({"net.0.weight": -0.25}), r"\[0, 1\]", "-0.25")
    raises(compile_with({"net.0.weight": float("nan")}), r"\[0, 1\]")
    raises(compile_with({"net.0.weight": "half"}), r"\[0, 1\]", "'half'")
    raises(compile_with({"net.0.weight": True}), r"\[0, 1\]")
    raises(compile_with({"net.0.bias": 0.5}), r"'net\.0\.bias'", r"\(32,\)", "dim 1")
    raises(compile_with({"net.*.bias": 0.5}), r"'net\.\d\.bias'", "dim 1")
    raises(compile_with({0: 1.0}), "update keys")
    raises(compile_with("partial"), "update must be 'full' or a dict", "'partial'")
    raises(compile_with(["net.0.weight"]), "update must be")
    # the edges of the range are fine
    assert pe.compile(model, (x,), (y,), update={"net.0.weight": 1.0, "net.0.bias": 0}).trained.keys() \
        == {"net.0.weight"}


def test_bad_loss(mlp_data):
    (x,), (y,) = mlp_data[0]
    raises(lambda: pe.compile(MLP(), (x,), (y,), loss="hinge"), "'hinge'", "cross_entropy", "mse")
    raises(lambda: pe.compile(MLP(), (x,), (y,), loss=None), "loss")
    raises(lambda: pe.compile(MLP(), (x,), (y,), loss=lambda out, t: out), "scalar")


def test_bad_examples(mlp_data):
    (x,), (y,) = mlp_data[0]
    raises(lambda: pe.compile(MLP(), (x.tolist(),), (y,)), "example_inputs", "torch tensors")
    raises(lambda: pe.compile(MLP(), [[0.0] * 16] * 8, (y,)), "example_inputs", "torch tensors")
    raises(lambda: pe.compile(MLP(), 3, (y,)), "example_inputs", "int")
    raises(lambda: pe.compile(MLP(), (x,), (y.tolist(),)), "example_targets", "torch tensors")
    raises(lambda: pe.compile(MLP(), (x,), None), "example_targets")
    raises(lambda: pe.compile(MLP().double(), (x.double(),), (y,)), r"example_inputs\[0\]", "float64")
    raises(lambda: pe.compile(MLP(), (x.to(torch.complex64),), (y,)), r"example_inputs\[0\]", "complex64")
    raises(lambda: pe.compile(MLP(), (x[:, :15],), (y,)), "could not trace")


def test_bad_model_and_optimizer(mlp_data):
    (x,), (y,) = mlp_data[0]
    raises(lambda: pe.compile(lambda v: v, (x,), (y,)), "torch.nn.Module", "function")
    raises(lambda: pe.compile(MLP(), (x,), (y,), optimizer=torch.optim.SGD(MLP().parameters(), lr=0.1)),
           "pe.SGD", "SGD")
    raises(lambda: pe.SGD(lr=-1.0), "lr")
    raises(lambda: pe.AdamW(betas=(1.5, 0.9)), "AdamW")


# ---- checkpoints ----------------------------------------------------------------------------------


@pytest.fixture
def saved(mlp_trainer, mlp_data, tmp_path):
    """A good checkpoint on disk, then more training: the trainer's state differs from the file."""
    t = mlp_trainer
    t.step(*mlp_data[0])
    good = tmp_path / "good.pockckpt"
    t.save(good)
    at_save = snapshot(t)
    t.step(*mlp_data[1])
    t.step(*mlp_data[0])
    return t, good, good.read_bytes(), at_save


def _flip_middle(blob):
    b = bytearray(blob)
    b[len(b) // 2] ^= 0x5A
    return bytes(b)


def _wrong_shape(blob):
    ckpt = decode(blob)
    kind, arr = ckpt.tensors["net.2.weight"]
    ckpt.tensors["net.2.weight"] = (kind, arr[:, :31].copy())
    return encode(ckpt)  # a valid file (magic, CRC, hash) for a tensor of the wrong shape


def _missing_tensor(blob):
    ckpt = decode(blob)
    del ckpt.tensors["net.4.bias"]
    return encode(ckpt)


BAD = {
    "flipped byte": (_flip_middle, "corrupt"),
    "truncated to half": (lambda b: b[: len(b) // 2], "corrupt or truncated"),
    "last byte cut": (lambda b: b[:-1], "corrupt or truncated"),
    "empty": (lambda b: b"", "not a PockEngine checkpoint"),
    "text": (lambda b: b"hello, world\n" * 10, "not a PockEngine checkpoint"),
    "wrong shape": (_wrong_shape, r"net\.2\.weight"),
    "missing tensor": (_missing_tensor, r"net\.4\.bias"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_changes_nothing(saved, tmp_path, case):
    t, good, good_bytes, at_save = saved
    make, pattern = BAD[case]
    bad = tmp_path / "bad.pockckpt"
    bad.write_bytes(make(good_bytes))
    before = snapshot(t)
    raises(lambda: t.load(bad), pattern, re.escape(str(bad)))
    assert_same(snapshot(t), before)
    assert good.read_bytes() == good_bytes
    # the good checkpoint still loads, and restores the state it was saved with
    t.load(good)
    assert_same(snapshot(t), at_save)


def test_checkpoint_of_another_model_changes_nothing(saved, mlp_data, tmp_path):
    t, good, good_bytes, at_save = saved
    torch.manual_seed(0)
    (x,), (y,) = mlp_data[0]
    other = pe.compile(nn.Sequential(nn.Linear(16, 5)), (x,), (y,), optimizer=pe.SGD(lr=0.1)).build()
    path = tmp_path / "other.pockckpt"
    other.save(path)
    before = snapshot(t)
    raises(lambda: t.load(path), "model", re.escape(str(path)))
    assert_same(snapshot(t), before)
    assert good.read_bytes() == good_bytes
    raises(lambda: other.load(good), "model")


def test_missing_checkpoint(saved, tmp_path):
    t = saved[0]
    before = snapshot(t)
    raises(lambda: t.load(tmp_path / "nope.pockckpt"), "cannot read checkpoint", "nope.pockckpt",
           "No such file")
    assert_same(snapshot(t), before)


def test_checkpoint_path_that_is_a_directory(saved, tmp_path):
    t = saved[0]
    before = snapshot(t)
    try:
        raises(lambda: t.load(tmp_path), "checkpoint", re.escape(str(tmp_path)))
    finally:
        assert_same(snapshot(t), before)


def test_save_into_missing_directory(saved, tmp_path):
    t = saved[0]
    target = tmp_path / "no" / "such" / "dir" / "w.pockckpt"
    raises(lambda: t.save(target), "cannot save checkpoint", re.escape(str(target)))
    assert not (tmp_path / "no").exists()


def test_failed_save_keeps_the_existing_checkpoint(saved, tmp_path):
    t, good, good_bytes, at_save = saved
    # make writing the (uniquely named) temporary file fail: the save must fail before touching good
    import resource
    import signal
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old_limit[1]))  # files over 1000 bytes: EFBIG
    try:
        raises(lambda: t.save(good), "cannot save checkpoint", re.escape(str(good)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert good.read_bytes() == good_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.pockckpt"]  # the temporary file is gone
    # saving over an existing file replaces it whole and leaves no temporary behind
    t.save(good)
    assert good.read_bytes() != good_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.pockckpt"]
    assert read_checkpoint(good).step == t.step_count
