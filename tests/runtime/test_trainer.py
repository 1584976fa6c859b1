"""pockengine.Trainer over the hand-written tiny model (tests/native/runtime/
fixtures/tiny_model.cpp): y = x @ W^T + b + c, MSE, SGD with momentum 0.9."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
try:
    import pockengine.runtime.trainer  # noqa: F401
except ImportError:  # not installed: use the checkout
    sys.path.insert(0, str(ROOT / "toolchain"))
from pockengine.build.host import build_shared_library  # noqa: E402
from pockengine.runtime.checkpoint import read_checkpoint, write_checkpoint  # noqa: E402
from pockengine.errors import PockError  # noqa: E402
from pockengine.runtime.trainer import Trainer  # noqa: E402
from helpers import assert_same, snapshot  # noqa: E402

TINY = ROOT / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"
STATE_DICT_KEYS = ["fc.weight", "fc.bias", "steps_seen"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_shared_library([TINY], tmp_path_factory.mktemp("tiny"), kernels=False)


@pytest.fixture(scope="module")
def multi_lib(tmp_path_factory):
    return build_shared_library([TINY], tmp_path_factory.mktemp("multi"), ["-DTINY_MULTI"], kernels=False)


@pytest.fixture
def trainer(lib):
    with Trainer(lib) as t:
        yield t


def batch(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    ids = rng.integers(0, 5, size=4)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    return (x, ids), (y,)


def random_state(trainer, seed):
    rng = np.random.default_rng(seed)
    sd = {"fc.weight": rng.standard_normal((2, 3)).astype(np.float32),
          "fc.bias": rng.standard_normal(2).astype(np.float32),
          "steps_seen": np.array(0, dtype=np.int64)}
    trainer.load_state_dict(sd)
    return sd


class Reference:
    """The tiny model's math in numpy (float32 throughout)."""

    def __init__(self, w, b, c=None):
        self.w, self.b = w.copy(), b.copy()
        self.c = np.zeros(2, np.float32) if c is None else c
        self.bw, self.bb = np.zeros_like(w), np.zeros_like(b)

    def forward(self, x):
        return x @ self.w.T + self.b + self.c

    def step(self, x, y, lr):
        d = self.forward(x) - y
        loss = np.mean(d * d)
        dy = np.float32(2.0 / d.size) * d
        self.bw = np.float32(0.9) * self.bw + dy.T @ x
        self.bb = np.float32(0.9) * self.bb + dy.sum(0)
        self.w -= np.float32(lr) * self.bw
        self.b -= np.float32(lr) * self.bb
        return float(loss)


# ---------------------------------------------------------------------- description
def test_describes_the_model(trainer):
    assert trainer.model_name == "tiny" and trainer.model_hash == "7e57000000000001"
    inputs = [(i.name, i.shape, i.dtype.name) for i in trainer.inputs]
    assert inputs == [("x", (4, 3), "float32"), ("ids", (4,), "int64")]
    assert [(i.name, i.shape) for i in trainer.targets] == [("target", (4, 2))]
    assert [(i.name, i.shape) for i in trainer.outputs] == [("y", (4, 2))]
    kinds = {t.name: t.kind for t in trainer.tensors}
    assert kinds == {"fc.weight": "param", "fc.bias": "param", "steps_seen": "buffer",
                     "fc.weight:momentum_buffer": "optimizer_state", "fc.bias:momentum_buffer": "optimizer_state",
                     "_tensor_constant0": "constant"}
    assert trainer.step_count == 0
    assert trainer.learning_rate == pytest.approx(0.1)
    assert "tiny" in repr(trainer)


# ---------------------------------------------------------------------- numerics
def test_steps_match_numpy(trainer):
    sd = random_state(trainer, 0)
    ref = Reference(sd["fc.weight"], sd["fc.bias"])
    trainer.learning_rate = 0.05
    for i in range(10):
        inputs, targets = batch(i)
        loss = trainer.step(inputs, targets)
        assert isinstance(loss, float)
        assert loss == pytest.approx(ref.step(inputs[0], targets[0], 0.05), rel=1e-5)
    np.testing.assert_allclose(trainer.get_tensor("fc.weight"), ref.w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_tensor("fc.bias"), ref.b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_tensor("fc.weight:momentum_buffer"), ref.bw, rtol=1e-5, atol=1e-6)
    assert trainer.step_count == 10
    assert trainer.state_dict()["steps_seen"] == 10  # the model saw ctx.step = 0..9


def test_loss_falls(trainer):
    inputs, targets = batch(1)
    losses = [trainer.step(inputs, targets) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]


def test_forward_matches_numpy_and_uses_constants(trainer):
    sd = random_state(trainer, 3)
    (x, ids), _ = batch(5)
    ref = Reference(sd["fc.weight"], sd["fc.bias"])
    out = trainer.forward((x, ids))
    assert isinstance(out, np.ndarray) and out.shape == (4, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref.forward(x), rtol=1e-6, atol=1e-6)
    c = np.array([10.0, -10.0], np.float32)
    trainer.set_tensor("_tensor_constant0", c)
    np.testing.assert_allclose(trainer.forward((x, ids)), Reference(sd["fc.weight"], sd["fc.bias"], c).forward(x),
                               rtol=1e-6, atol=1e-5)
    assert list(trainer.state_dict()) == STATE_DICT_KEYS  # no optimizer state, no constants
    assert trainer.step_count == 0


def test_multiple_outputs_and_ignore_index(multi_lib):
    with Trainer(multi_lib) as t:
        (x, ids), (y,) = batch(0)
        y_out, y_sum = t.forward((x, ids))
        np.testing.assert_allclose(y_sum, y_out.sum(1), rtol=1e-6)
        t.step((x, ids), (y, np.array([0, 1, -100, 1])))
        with pytest.raises(PockError, match=r"target 1 'labels' holds 2 at flat index 3, outside \[0, 2\) "
                                            r"and not the ignore index -100"):
            t.step((x, ids), (y, np.array([0, 1, -100, 2])))


def test_non_finite_loss_is_returned(trainer):
    trainer.set_tensor("fc.bias", np.array([np.inf, 0], np.float32))
    inputs, targets = batch(0)
    assert not np.isfinite(trainer.step(inputs, targets))


# ---------------------------------------------------------------------- inputs
def test_accepts_torch_tensors_lists_and_views(trainer):
    random_state(trainer, 1)
    (x, ids), (y,) = batch(2)
    want = trainer.forward((x, ids))
    xt = torch.from_numpy(x).requires_grad_(True)
    np.testing.assert_array_equal(trainer.forward((xt, torch.from_numpy(ids))), want)
    np.testing.assert_array_equal(trainer.forward([x.tolist(), ids.tolist()]), want)
    xf = np.asfortranarray(x)  # not C-contiguous
    np.testing.assert_array_equal(trainer.forward((xf, ids)), want)
    np.testing.assert_array_equal(trainer.forward((torch.from_numpy(x.T.copy()).T, ids)), want)
    np.testing.assert_array_equal(trainer.forward((x, [int(i) for i in ids])), want)
    trainer.step((xt, torch.from_numpy(ids)), (torch.from_numpy(y),))
    assert trainer.step_count == 1


@pytest.mark.parametrize("inputs, targets, message", [
    (lambda x, i: (x.astype(np.float64), i), None,
     r"input 0 'x': expected shape \(4, 3\) float32, got \(4, 3\) float64"),
    (lambda x, i: (x, i.astype(np.int32)), None, r"input 1 'ids': expected shape \(4,\) int64, got \(4,\) int32"),
    (lambda x, i: (x[:3], i), None, r"input 0 'x': expected shape \(4, 3\) float32, got \(3, 3\) float32"),
    (lambda x, i: (torch.zeros(4, 3, dtype=torch.float64), i), None, r"input 0 'x'.*float64"),
    (lambda x, i: (torch.zeros(4, 3, dtype=torch.bfloat16), i), None, r"input 0 'x'.*bfloat16"),
    (lambda x, i: (x,), None, r"expected 2 inputs \(x, ids\), got 1"),
    (lambda x, i: (x, i, i), None, r"expected 2 inputs \(x, ids\), got 3"),
    (lambda x, i: (x, [0.5, 1, 2, 3]), None, r"input 1 'ids': expected shape \(4,\) int64, got \(4,\) float64"),
    (lambda x, i: (x, "abcd"), None, r"input 1 'ids': expected an array or tensor.*got str"),
    (lambda x, i: (x, np.array([0, 1, 5, 2])), None, r"input 1 'ids' holds 5 at flat index 2, outside \[0, 5\)"),
    (None, lambda y: (y.reshape(8),), r"target 0 'target': expected shape \(4, 2\) float32, got \(8,\) float32"),
    (None, lambda y: (), r"expected 1 targets \(target\), got 0"),
])
def test_bad_inputs_raise_pock_error(trainer, inputs, targets, message):
    (x, ids), (y,) = batch(0)
    before = snapshot(trainer)
    ins = inputs(x, ids) if inputs else (x, ids)
    tgs = targets(y) if targets else (y,)
    with pytest.raises(PockError, match=message):
        trainer.step(ins, tgs)
    if targets is None:
        with pytest.raises(PockError, match=message):
            trainer.forward(ins)
    assert_same(snapshot(trainer), before)


def test_status_codes_come_through(trainer):
    (x, _), (y,) = batch(0)
    with pytest.raises(PockError) as e:
        trainer.step((x, np.array([0, 1, 9, 2])), (y,))
    assert e.value.status == 4 and isinstance(e.value, ValueError)


# ---------------------------------------------------------------------- state dicts
def test_state_dict_roundtrip(lib, trainer):
    random_state(trainer, 4)
    for i in range(3):
        trainer.step(*batch(i))
    sd = trainer.state_dict()
    assert list(sd) == STATE_DICT_KEYS
    assert sd["fc.weight"].dtype == np.float32 and sd["steps_seen"].dtype == np.int64 and sd["steps_seen"].shape == ()
    sd["fc.weight"][0, 0] = 123.0  # a copy, not a view of the trainer
    assert trainer.state_dict()["fc.weight"][0, 0] != 123.0
    with Trainer(lib) as other:
        other.load_state_dict(trainer.state_dict())
        inputs, _ = batch(9)
        np.testing.assert_array_equal(other.forward(inputs), trainer.forward(inputs))
        assert other.step_count == 0  # the step count is not part of a state dict


def test_load_state_dict_takes_a_torch_state_dict(trainer):
    torch.manual_seed(0)
    fc = torch.nn.Linear(3, 2)
    sd = {f"fc.{k}": v for k, v in fc.state_dict().items()}
    sd["steps_seen"] = torch.tensor(7)
    trainer.load_state_dict(sd)
    x = torch.randn(4, 3)
    np.testing.assert_allclose(trainer.forward((x, torch.zeros(4, dtype=torch.long))), fc(x).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    # float64 values are converted like torch's copy_ does
    trainer.load_state_dict({k: np.asarray(v, np.float64) if k != "steps_seen" else v for k, v in sd.items()})


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd.pop("fc.bias"), r"missing keys: 'fc.bias'"),
    (lambda sd: sd.update(extra=np.zeros(2)), r"unexpected keys: 'extra'"),
    (lambda sd: sd.update({"fc.weight:momentum_buffer": np.zeros((2, 3), np.float32)}),
     r"unexpected keys: 'fc.weight:momentum_buffer'"),
    (lambda sd: sd.update({"fc.weight": np.zeros((3, 2), np.float32)}),
     r"'fc.weight': expected shape \(2, 3\) float32, got \(3, 2\) float32"),
    (lambda sd: sd.update(steps_seen=np.array(1.5)), r"'steps_seen': expected dtype int64, got float64"),
])
def test_load_state_dict_is_strict_and_all_or_nothing(trainer, change, message):
    random_state(trainer, 6)
    before = snapshot(trainer)
    sd = {k: v + 1 for k, v in trainer.state_dict().items()}
    change(sd)
    with pytest.raises(PockError, match=message):
        trainer.load_state_dict(sd)
    assert_same(snapshot(trainer), before)


def test_load_state_dict_reports_every_problem(trainer):
    with pytest.raises(PockError) as e:
        trainer.load_state_dict({"fc.weight": np.zeros((1, 1), np.float32), "bogus": np.zeros(1)})
    msg = str(e.value)
    assert "'fc.bias'" in msg and "'steps_seen'" in msg and "'bogus'" in msg and "(1, 1)" in msg


def test_tied_parameter_aliases(lib):
    with Trainer(lib, aliases={"head.weight": "fc.weight"}) as t:
        random_state(t, 10)
        sd = t.state_dict()
        assert list(sd) == STATE_DICT_KEYS + ["head.weight"]
        assert sd["head.weight"] is sd["fc.weight"]  # one tensor, two names, as in torch
        np.testing.assert_array_equal(t.get_tensor("head.weight"), t.get_tensor("fc.weight"))
        del sd["head.weight"]
        t.load_state_dict(sd)  # the tied name may be left out
        sd["head.weight"] = np.full((2, 3), 5.0, np.float32)
        t.load_state_dict(sd)  # the later name wins, as in torch
        np.testing.assert_array_equal(t.get_tensor("fc.weight"), sd["head.weight"])
        with pytest.raises(PockError, match=r"'head.weight': expected shape \(2, 3\)"):
            t.load_state_dict({**sd, "head.weight": np.zeros(3, np.float32)})


def test_get_and_set_tensor_errors(trainer):
    with pytest.raises(PockError, match="unknown state tensor 'nope'"):
        trainer.get_tensor("nope")
    with pytest.raises(PockError, match="unknown state tensor 'nope'"):
        trainer.set_tensor("nope", np.zeros(2))
    with pytest.raises(PockError, match=r"expected shape \(2,\) float32, got \(3,\)"):
        trainer.set_tensor("fc.bias", np.zeros(3, np.float32))


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_roundtrip(lib, trainer, tmp_path):
    random_state(trainer, 7)
    for i in range(4):
        trainer.step(*batch(i))
    trainer.learning_rate = 0.03
    path = tmp_path / "ckpt.pock"
    trainer.save(path)
    saved = snapshot(trainer)
    inputs, _ = batch(42)
    out = trainer.forward(inputs)
    for i in range(3):
        trainer.step(*batch(i))
    trainer.learning_rate = 0.5
    trainer.load(str(path))
    assert_same(snapshot(trainer), saved)
    np.testing.assert_array_equal(trainer.forward(inputs), out)
    assert trainer.step_count == 4 and trainer.learning_rate == pytest.approx(0.03)
    with Trainer(lib, checkpoint=path) as other:
        assert_same(snapshot(other), saved)
        # training resumes identically
        np.testing.assert_array_equal(other.step(*batch(5)), trainer.step(*batch(5)))
        assert_same(snapshot(other), snapshot(trainer))
    assert not list(tmp_path.glob("*.tmp-*"))


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:len(b) // 2], "corrupt or truncated"),
    (lambda b: b[:-1], "corrupt or truncated"),
    (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "CRC-32 mismatch"),
    (lambda b: b"", "not a PockEngine checkpoint"),
    (lambda b: b"garbage" * 10, "not a PockEngine checkpoint"),
])
def test_corrupt_checkpoint_leaves_file_and_state_intact(lib, trainer, tmp_path, damage, message):
    random_state(trainer, 8)
    trainer.step(*batch(0))
    good = tmp_path / "good.pock"
    trainer.save(good)
    good_bytes = good.read_bytes()
    trainer.step(*batch(1))
    before = snapshot(trainer)
    bad = tmp_path / "bad.pock"
    bad.write_bytes(damage(good_bytes))
    with pytest.raises(PockError, match=message):
        trainer.load(bad)
    assert_same(snapshot(trainer), before)
    with pytest.raises(PockError, match=message):
        Trainer(lib, checkpoint=bad)
    assert good.read_bytes() == good_bytes
    trainer.load(good)  # the good one still loads


def test_checkpoint_for_another_model(lib, multi_lib, tmp_path):
    with Trainer(multi_lib) as m, Trainer(lib) as t:
        m.save(tmp_path / "multi.pock")
        with pytest.raises(PockError, match="checkpoint is for model 7e57000000000002 but this library is "
                                            "7e57000000000001"):
            t.load(tmp_path / "multi.pock")


def test_failed_save_keeps_the_existing_checkpoint(trainer, tmp_path):
    path = tmp_path / "ckpt.pock"
    trainer.save(path)
    old = path.read_bytes()
    trainer.step(*batch(0))
    with pytest.raises(PockError, match="cannot save checkpoint.*missing"):
        trainer.save(tmp_path / "missing" / "ckpt.pock")
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "f").write_text("x")
    with pytest.raises(PockError, match="cannot save checkpoint"):
        trainer.save(tmp_path / "adir")
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "ckpt.pock"]
    with pytest.raises(PockError, match="cannot read checkpoint"):
        trainer.load(tmp_path / "nothing.pock")


def test_python_checkpoint_module_matches_the_runtime(lib, trainer, tmp_path):
    random_state(trainer, 9)
    trainer.step(*batch(0))
    trainer.save(tmp_path / "c.pock")
    ckpt = read_checkpoint(tmp_path / "c.pock")
    assert ckpt.model_hash == trainer.model_hash and ckpt.step == 1
    assert ckpt.lr == pytest.approx(trainer.learning_rate)
    assert list(ckpt.tensors) == [t.name for t in trainer.tensors]
    for t in trainer.tensors:
        kind, arr = ckpt.tensors[t.name]
        assert kind == t.kind
        np.testing.assert_array_equal(arr, trainer.get_tensor(t.name))
    # written by Python (e.g. a bundle's initial weights), loaded by the runtime
    kind, w = ckpt.tensors["fc.weight"]
    ckpt.tensors["fc.weight"] = (kind, w + 1)
    ckpt.step, ckpt.lr = 0, 0.25
    write_checkpoint(tmp_path / "py.pock", ckpt)
    with Trainer(lib, checkpoint=tmp_path / "py.pock") as other:
        np.testing.assert_array_equal(other.get_tensor("fc.weight"), w + 1)
        assert other.step_count == 0 and other.learning_rate == 0.25
    # the Python writer output is byte-identical to the runtime's
    ckpt = read_checkpoint(tmp_path / "c.pock")
    write_checkpoint(tmp_path / "again.pock", ckpt)
    assert (tmp_path / "again.pock").read_bytes() == (tmp_path / "c.pock").read_bytes()
    (tmp_path / "bad.pock").write_bytes((tmp_path / "c.pock").read_bytes()[:-3])
    with pytest.raises(PockError, match="corrupt or truncated"):
        read_checkpoint(tmp_path / "bad.pock")


# ---------------------------------------------------------------------- settings and lifetime
def test_settings(trainer):
    trainer.learning_rate = 0.25
    assert trainer.learning_rate == 0.25
    with pytest.raises(PockError, match="learning rate"):
        trainer.learning_rate = -1
    trainer.set_num_threads(2)
    with pytest.raises(PockError, match="threads"):
        trainer.set_num_threads(0)


def test_trainers_are_independent(lib):
    with Trainer(lib) as a, Trainer(lib) as b:
        a.step(*batch(0))
        assert a.step_count == 1 and b.step_count == 0
        assert not np.array_equal(a.state_dict()["fc.weight"], b.state_dict()["fc.weight"])


def test_use_after_close(lib, tmp_path):
    t = Trainer(lib)
    t.close()
    t.close()  # twice is fine
    assert t.closed
    inputs, targets = batch(0)
    calls = [lambda: t.step(inputs, targets), lambda: t.forward(inputs), t.state_dict,
             lambda: t.load_state_dict({}), lambda: t.save(tmp_path / "x"), lambda: t.load(tmp_path / "x"),
             lambda: t.learning_rate, lambda: setattr(t, "learning_rate", 0.1), lambda: t.step_count,
             lambda: t.set_num_threads(1), lambda: t.get_tensor("fc.bias"),
             lambda: t.set_tensor("fc.bias", np.zeros(2, np.float32))]
    for call in calls:
        with pytest.raises(PockError, match="trainer is closed"):
            call()
    with Trainer(lib) as t2:
        pass
    assert t2.closed
    assert not (tmp_path / "x").exists()


def test_bad_library_path(tmp_path):
    with pytest.raises(PockError, match="cannot load model library"):
        Trainer(tmp_path / "nope.so")
