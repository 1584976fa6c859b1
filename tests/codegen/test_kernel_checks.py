"""codegen.kernel_checks: the exact non-finite guard's gradient checks made by the kernels
that compute the gradients (a weight gradient's GEMM as it stores it, an embedding's rows
as it sums them) instead of a second pass over each gradient; a tied table's gradient (the
head's GEMM, then the embedding's rows onto it) is checked by both.  Each case: the step
names the parameter, leaves every weight and optimizer state bit-identical, and a clean
step trains bit for bit like one with the separate checks."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from pockengine import codegen
from helpers import assert_same, snapshot

V, D = 70, 40  # 70 classes: a weight gradient of 70 rows takes the blocked GEMM (not the GEMV path)


class Lm(nn.Module):
    """Float features plus an embedding of ids, a Linear, and a head: with `tied`, the head is
    the embedding's table (F.linear(h, emb.weight)); logits scaled by 1000."""

    def __init__(self, tied=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.fc = nn.Linear(D, D)
        self.head = None if tied else nn.Linear(D, V)

    def forward(self, x, idx):
        h = self.fc(x + self.emb(idx))
        return 1000.0 * (F.linear(h, self.emb.weight) if self.head is None else self.head(h))


def batch(seed=0, n=6, fill=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g) if fill is None else torch.full((n, D), fill)
    return (x, torch.randint(0, V, (n,), generator=g)), (torch.randint(0, V, (n,), generator=g),)


def compile_lm(tied=False, update="full"):
    torch.manual_seed(0)
    return pe.compile(Lm(tied), *batch(), update=update, optimizer=pe.AdamW(lr=1e-3))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gradients_are_checked_by_their_kernels(tied):
    src = compile_lm(tied).source()
    assert src.count("pk::linear_bwd_weight_finite(") == 2  # fc and the head (tied: its part of the table)
    assert src.count("pk::embedding_rows_finite(") == 1
    # left to a separate scan: the biases (bias_bwd has no checking form); never a table
    assert f"pk::all_finite(d_emb_weight, {V * D})" not in src
    assert "pk::all_finite(d_fc_weight" not in src and "pk::all_finite(d_head_weight" not in src


def zero(t, *names):
    for n in names:
        t.set_tensor(n, np.zeros_like(t.get_tensor(n)))


@pytest.mark.parametrize("case", ["fc", "head", "emb", "tied head"])
def test_an_overflowing_gradient_skips_the_step_exactly(case):
    """Finite data, a finite loss, one gradient that overflows: the step is skipped, every
    tensor bit-identical, the message names the parameter."""
    tied = case == "tied head"
    # emb: fc frozen, so the overflowing dh reaches the embedding's rows and no weight gradient
    t = compile_lm(tied, {"emb.*": 1.0, "head.*": 1.0} if case == "emb" else "full").build()
    t.step(*batch(1))
    if case == "fc":  # fc's weight 0 (h = its bias), its input 3e38: d fc.weight = dh^T x overflows
        inputs = batch(2, fill=3e38)
        zero(t, "fc.weight", "emb.weight")
        name = "fc.weight"
    elif case == "emb":  # fc's input 0, the head's weight ~1e37: d emb rows = dh @ I = 1000 dlogits @ W
        inputs = batch(2, fill=0.0)
        zero(t, "emb.weight", "fc.bias")
        t.set_tensor("fc.weight", np.eye(D, dtype=np.float32))
        t.set_tensor("head.weight", t.get_tensor("head.weight") * np.float32(1e37))
        name = "emb.weight"
    else:  # the head's part, dlogits^T h with h = 3e38 and the head's weight 0: logits finite
        inputs = batch(2, fill=3e38)
        zero(t, "emb.weight" if tied else "head.weight")
        t.set_tensor("fc.weight", np.eye(D, dtype=np.float32))
        name = "emb.weight" if tied else "head.weight"
    before = snapshot(t)
    loss = t.step(*inputs)
    assert np.isfinite(loss)
    assert t.last_step_message == f"the gradient of '{name}' is NaN or inf: step skipped, no update applied"
    assert_same(snapshot(t), before)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_kernel_checks_train_like_separate_checks(tied, monkeypatch):
    checked = compile_lm(tied).build()
    monkeypatch.setattr(codegen, "kernel_checks", lambda order, checks: {})
    prog = compile_lm(tied)  # the separate all_finite scans
    assert "_finite(" not in prog.source().replace("pk::all_finite(", "")
    separate = prog.build()
    for s in range(3):
        assert checked.step(*batch(s)) == separate.step(*batch(s))
    assert_same(snapshot(checked), snapshot(separate))
