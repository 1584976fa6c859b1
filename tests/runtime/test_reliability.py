"""Reliability (issue 13): bad input and faults never crash, corrupt or silently
poison training.  One test per class of the issue; each failed before its fix:
out-of-bounds token ids by any path, the non-finite guard, PyTorch's
requires_grad=False, errors at compile time and of the right type, and a
consistent state_dict() under concurrent steps.  Checkpoint faults (concurrent
saves, orphaned temp files, header validation) are in test_reliability_checkpoint.py."""
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from helpers import assert_same, snapshot


# ---------------------------------------------------------------------- 1. out-of-bounds ids
class CatIds(nn.Module):
    """Ids reach the embedding through torch.cat and integer arithmetic; class targets
    reach cross_entropy through torch.cat."""

    def __init__(self, vocab=12, d=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, vocab)

    def forward(self, a, b):
        return self.fc(self.emb(torch.cat([a, b + 1], dim=1)))


def cat_loss(out, t1, t2):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.cat([t1, t2], dim=1).reshape(-1))


@pytest.fixture(scope="module")
def cat_trainer():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 10, (2, 3), generator=g), torch.randint(0, 10, (2, 3), generator=g)
    t1, t2 = torch.randint(0, 12, (2, 3), generator=g), torch.randint(0, 12, (2, 3), generator=g)
    prog = pe.compile(CatIds(), (a, b), (t1, t2), loss=cat_loss, optimizer=pe.AdamW(lr=0.01))
    return prog.build(), (a, b), (t1, t2)


@pytest.mark.parametrize("value", [11, 12, 10**6, -2, -10**6, 2**62])
def test_ids_through_arithmetic_never_read_out_of_bounds(cat_trainer, value):
    t, (a, b), targets = cat_trainer
    before = snapshot(t)
    bad = b.clone()
    bad[1, 2] = value  # the embedding sees value + 1
    with pytest.raises(pe.PockError, match=rf"embedding in emb \(Embedding\): index {value + 1} at flat position 11 "
                                           r"of 'cat' \(computed from input 'input0', input 'input1'\) is outside "
                                           r"\[0, 12\)"):
        t.step((a, bad), targets)
    with pytest.raises(pe.PockError, match=rf"index {value + 1} at flat position 11 of .cat"):
        t.forward((a, bad))
    assert_same(snapshot(t), before)
    assert np.isfinite(t.step((a, b), targets))  # still trains


def test_ids_and_targets_through_cat_are_checked_at_entry(cat_trainer):
    t, (a, b), (t1, t2) = cat_trainer
    before = snapshot(t)
    bad = a.clone()
    bad[0, 1] = 12
    with pytest.raises(pe.PockError, match=r"input 0 'input0' holds 12 at flat index 1, outside \[0, 12\)"):
        t.step((bad, b), (t1, t2))
    for value in (12, -1, 10**6):  # class targets through cat: an error, not a skipped row
        bad = t2.clone()
        bad[1, 0] = value
        with pytest.raises(pe.PockError, match=rf"target 1 'target1' holds {value} at flat index 3"):
            t.step((a, b), (t1, bad))
    assert_same(snapshot(t), before)
    ignored = t2.clone()
    ignored[1, 0] = -100  # cross_entropy's ignore_index stays valid
    assert np.isfinite(t.step((a, b), (t1, ignored)))


# ---------------------------------------------------------------------- 2. non-finite guard
class Guarded(nn.Module):
    """sqrt(t) scales the input (its gradient is the last one complete), sqrt(s)
    the output (its gradient is the first): both are inf at 0 with a finite loss."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)
        self.s, self.t = nn.Parameter(torch.ones(())), nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x * torch.sqrt(self.t)))) * torch.sqrt(self.s)


def guard_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(5, 4, generator=g),), (torch.randint(0, 3, (5,), generator=g),)


@pytest.fixture(scope="module")
def guard_prog():
    torch.manual_seed(0)
    return pe.compile(Guarded(), *guard_batch(0), optimizer=pe.AdamW(lr=0.01))


def test_nonfinite_input_or_loss_applies_no_update(guard_prog):
    t, clean = guard_prog.build(), guard_prog.build()
    for tr in (t, clean):
        tr.step(*guard_batch(1))
    assert t.skipped_steps == 0 and t.last_step_status == "ok"
    before = snapshot(t)
    (x,), y = guard_batch(2)
    for poison in (float("nan"), float("inf"), -float("inf")):
        bad = x.clone()
        bad[2, 1] = poison
        loss = t.step((bad,), y)
        assert not np.isfinite(loss)
        assert t.last_step_status == "skipped" and "input 0 'input0' holds" in t.last_step_message
        assert_same(snapshot(t), before)  # weights, AdamW state and the step count
    # a non-finite loss from finite data (sqrt of a negative weight): no backward pass, no update
    t.set_tensor("s", np.array(-1.0, np.float32))
    before = snapshot(t)
    loss = t.step((x,), y)
    assert np.isnan(loss) and t.last_step_message == "the loss is NaN or inf: step skipped, no update applied"
    assert_same(snapshot(t), before)
    assert t.skipped_steps == 4
    t.set_tensor("s", clean.get_tensor("s"))
    # the next good step trains exactly as if the bad ones never happened
    assert t.step(*guard_batch(3)) == clean.step(*guard_batch(3))
    assert t.last_step_status == "ok"
    assert_same(snapshot(t), snapshot(clean))


def test_nonfinite_gradient_applies_no_update(guard_prog):
    t = guard_prog.build()
    t.step(*guard_batch(1))
    t.set_tensor("s", np.zeros((), np.float32))  # d loss / d s = inf, loss finite
    before = snapshot(t)
    loss = t.step(*guard_batch(2))
    assert np.isfinite(loss)
    assert t.last_step_message == "the gradient of 's' is NaN or inf: step skipped, no update applied"
    assert_same(snapshot(t), before)
    t.strict = True
    with pytest.raises(pe.PockError, match="the gradient of 's' is NaN or inf"):
        t.step(*guard_batch(2))
    assert_same(snapshot(t), before)
    assert t.skipped_steps == 2


def late_overflow_trainers(prog):
    """Two trainers of prog after one good step, the first with t = 0: d loss / d t =
    sum(x * ...) / (2 sqrt(t)) is then inf while the loss is finite, and t's gradient is
    the last one complete (t scales the input)."""
    out = []
    for _ in range(2):
        tr = prog.build()
        tr.step(*guard_batch(1))
        out.append(tr)
    assert_same(snapshot(out[0]), snapshot(out[1]))
    out[0].set_tensor("t", np.zeros((), np.float32))
    return out


def late_bad_batch():
    return guard_batch(2)


def test_late_nonfinite_gradient_skips_the_whole_step_exactly(guard_prog):
    """exact_skip (the default): every update runs after every gradient is checked, so a
    gradient that overflows late in the backward pass, with a finite loss and finite data,
    leaves weights and AdamW state bit-identical, and the next good step is bit-identical
    to a trainer that never saw the bad batch.  (Before: 'partial', earlier updates applied.)"""
    assert guard_prog.exact_skip and guard_prog.stats()["exact_skip"]
    t, clean = late_overflow_trainers(guard_prog)
    before = snapshot(t)
    loss = t.step(*late_bad_batch())
    assert np.isfinite(loss)
    assert t.last_step_status == "skipped", t.last_step_message
    assert t.last_step_message == "the gradient of 't' is NaN or inf: step skipped, no update applied"
    assert t.skipped_steps == 1
    assert_same(snapshot(t), before)  # weights, AdamW state and the step count
    t.set_tensor("t", clean.get_tensor("t"))
    for k in (3, 4):
        assert t.step(*guard_batch(k)) == clean.step(*guard_batch(k))
        assert t.last_step_status == "ok"
        assert_same(snapshot(t), snapshot(clean))
    t.strict = True
    t.set_tensor("t", np.zeros((), np.float32))
    before = snapshot(t)
    with pytest.raises(pe.PockError, match="the gradient of 't' is NaN or inf: step skipped"):
        t.step(*late_bad_batch())
    assert_same(snapshot(t), before)


def test_late_nonfinite_gradient_without_exact_skip_is_partial():
    """exact_skip=False: updates run as soon as their gradient is complete, each checked by
    its own update kernel; the late one and every later one are skipped and the step says so."""
    torch.manual_seed(0)
    prog = pe.compile(Guarded(), *guard_batch(0), optimizer=pe.AdamW(lr=0.01), exact_skip=False,
                      name="guarded_not_exact")
    assert not prog.exact_skip and prog.stats()["arena_bytes"] < prog.stats()["arena_bytes_no_reorder"]
    t, _ = late_overflow_trainers(prog)
    before = snapshot(t)
    loss = t.step(*late_bad_batch())
    assert np.isfinite(loss)
    assert t.last_step_status == "partial"
    assert "the gradient of 't' is NaN or inf" in t.last_step_message
    assert "earlier update(s) of this step had already run" in t.last_step_message
    after = snapshot(t)
    assert after[1] == before[1]  # the step does not count
    for name, value in after[0].items():
        assert np.all(np.isfinite(value)), name  # nothing poisoned
    for name in ("t", "t:exp_avg", "t:exp_avg_sq"):
        np.testing.assert_array_equal(after[0][name], before[0][name], err_msg=name)
    assert not np.array_equal(after[0]["fc2.weight"], before[0]["fc2.weight"])  # an earlier update ran


def test_exact_skip_must_be_a_bool():
    with pytest.raises(pe.PockError, match="exact_skip must be True or False"):
        pe.compile(Guarded(), *guard_batch(0), exact_skip="yes")


# ---------------------------------------------------------------------- 5. requires_grad=False
class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


@pytest.mark.parametrize("update", ["full", {"fc*": 1.0}])
def test_requires_grad_false_is_frozen(update):
    torch.manual_seed(0)
    model = TwoLayers()
    model.fc1.weight.requires_grad_(False)
    frozen = model.fc1.weight.detach().numpy().copy()
    prog = pe.compile(model, *guard_batch(0), update=update, optimizer=pe.SGD(lr=0.5, weight_decay=0.1))
    assert "fc1.weight" not in prog.trained and "fc1.bias" in prog.trained
    t = prog.build()
    for i in range(3):
        t.step(*guard_batch(i))
    np.testing.assert_array_equal(t.state_dict()["fc1.weight"], frozen)
    assert not np.array_equal(t.state_dict()["fc1.bias"], model.fc1.bias.detach().numpy())


# ---------------------------------------------------------------------- 6. errors at the right time
class ClampIds(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        return self.emb(torch.clamp(idx, 0, 9)).sum(-1)


@pytest.mark.parametrize("make, message", [
    (lambda: pe.SGD(lr=float("nan")), "SGD: lr must be a finite number >= 0, got nan"),
    (lambda: pe.SGD(lr=float("inf")), "SGD: lr must be a finite number >= 0"),
    (lambda: pe.SGD(lr=0.1, momentum=float("nan")), "SGD: momentum must be"),
    (lambda: pe.AdamW(weight_decay=float("nan")), "AdamW: weight_decay must be a finite number >= 0, got nan"),
    (lambda: pe.AdamW(eps=float("nan")), "AdamW: eps must be"),
    (lambda: pe.AdamW(betas=(float("nan"), 0.9)), r"AdamW: betas must be in \[0, 1\)"),
    (lambda: pe.AdamW(lr=None), "AdamW: lr must be a finite number"),
])
def test_bad_hyper_parameters_fail_at_construction(make, message):
    with pytest.raises(pe.PockError, match=message):
        make()


def test_integer_data_in_float_ops_fails_at_compile_time():
    x = torch.randn(4, 3)
    y = torch.randint(0, 3, (4, 2))
    with pytest.raises(pe.PockError, match="loss='mse' needs float targets: input 1 .* is i64"):
        pe.compile(nn.Linear(3, 2), (x,), (y,), loss="mse")
    ids = torch.randint(0, 10, (2, 3))
    with pytest.raises(pe.PockError, match="hardtanh needs float32 inputs: input 0 .* is i64"):
        pe.compile(ClampIds(), (ids,), (torch.randn(2, 3),), loss="mse")


@pytest.mark.parametrize("name", ["../evil", "a/b", 'q"uote', "", ".hidden", "x" * 101, "new\nline"])
def test_bad_model_names_are_rejected(name):
    with pytest.raises(pe.PockError, match="model name must be"):
        pe.compile(TwoLayers(), *guard_batch(0), name=name)


def test_unwritable_cache_dir_is_a_pockerror(guard_prog, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # root ignores permissions; a file in the path stops anyone
    monkeypatch.setenv("POCK_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(pe.PockError, match="cannot write build files to .*file.*POCK_CACHE_DIR"):
        guard_prog.build()


def test_paths_big_endian_arrays_and_thread_counts(guard_prog, tmp_path):
    t, ref = guard_prog.build(), guard_prog.build()
    for bad in ["ck\0pt", b"ck\0pt", ""]:
        with pytest.raises(pe.PockError, match="NUL|empty"):
            t.save(tmp_path / bad if isinstance(bad, str) and bad else bad)
        with pytest.raises(pe.PockError, match="NUL|empty"):
            t.load(bad)
    assert list(tmp_path.iterdir()) == []
    (x,), (y,) = guard_batch(1)
    xb = x.numpy().astype(">f4")
    assert t.step((xb,), (y.numpy().astype(">i8"),)) == ref.step((x,), (y,))
    np.testing.assert_array_equal(t.forward((xb,)), ref.forward((x,)))
    for n in (2**32 + 1, 2**31, -1, 0, 1025):
        with pytest.raises(pe.PockError, match=r"number of threads must be in \[1, 1024\]"):
            t.set_num_threads(n)
    t.set_num_threads(1)


# ---------------------------------------------------------------------- 7. state_dict during a step
def test_state_dict_during_steps_on_another_thread_is_consistent():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 3))
    x, y = torch.randn(16, 64), torch.randint(0, 3, (16,))
    t = pe.compile(model, (x,), (y,), optimizer=pe.SGD(lr=0.01)).build()
    history, stop = {}, threading.Event()

    def train():
        for _ in range(300):
            t.step((x,), (y,))
            sd = t.state_dict()  # the same thread: consistent by construction
            history[int(sd["1.num_batches_tracked"])] = sd
        stop.set()

    worker = threading.Thread(target=train)
    worker.start()
    seen = 0
    while not stop.is_set():
        sd = t.state_dict()
        n = int(sd["1.num_batches_tracked"])
        if n == 0:
            continue
        while n not in history and not stop.is_set():
            pass
        if n in history:
            for k, v in history[n].items():
                np.testing.assert_array_equal(sd[k], v, err_msg=f"{k} mixed with another step than {n}")
            seen += 1
    worker.join()
    assert seen > 0
