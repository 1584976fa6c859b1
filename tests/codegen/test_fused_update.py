"""codegen.fusable_updates: the optimizer update fused into the weight-gradient GEMM
(pk::linear_bwd_weight_sgd / _adamw) in steps without the exact non-finite guard, and the
unfused path everywhere else; a fused step trains bit for bit like the unfused one."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe


class Tied(nn.Module):
    """The same Linear applied twice: its weight gradient is a sum of two GEMMs."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.out = nn.Linear(12, 5)

    def forward(self, x):
        return self.out(torch.relu(self.a(torch.relu(self.a(x)))))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 10))


def data(n=32, d=40, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


FUSED = ("linear_bwd_weight_sgd(", "linear_bwd_weight_adamw(")


def n_fused(prog):
    src = prog.source()
    return sum(src.count(f) for f in FUSED)


@pytest.mark.parametrize("opt", [pe.SGD(lr=0.1, momentum=0.9), pe.AdamW(lr=1e-2)], ids=["sgd", "adamw"])
def test_fused_only_without_the_exact_guard(opt):
    x, y = data()
    assert n_fused(pe.compile(mlp(), x, y, optimizer=opt, exact_skip=False)) == 2  # both weights
    assert n_fused(pe.compile(mlp(), x, y, optimizer=opt)) == 0  # exact_skip=True: gradients checked first


def test_partial_update_is_fused_and_accumulated_gradient_is_not():
    x, y = data()
    prog = pe.compile(mlp(), x, y, update={"0.weight": 0.5, "2.*": 1.0}, optimizer=pe.SGD(lr=0.1, momentum=0.9),
                      exact_skip=False)
    assert n_fused(prog) == 2  # the first 20 input columns of 0.weight: region rows of stride 40
    x2, y2 = data(d=12, classes=5)
    prog = pe.compile(Tied(), x2, y2, optimizer=pe.SGD(lr=0.1), exact_skip=False)
    assert n_fused(prog) == 1  # out.weight only: a.weight's gradient is the sum of two products


@pytest.mark.parametrize("opt", [pe.SGD(lr=0.1, momentum=0.9, weight_decay=1e-2), pe.AdamW(lr=1e-2)],
                         ids=["sgd", "adamw"])
def test_fused_step_trains_bit_for_bit_like_the_unfused_one(opt):
    x, y = data()
    fused = pe.compile(mlp(), x, y, optimizer=opt, exact_skip=False).build()
    plain = pe.compile(mlp(), x, y, optimizer=opt).build()
    for s in range(3):
        xb, yb = data(seed=s)
        assert fused.step(xb, yb) == plain.step(xb, yb)
    for name in ("0.weight", "2.weight", "0.bias"):
        np.testing.assert_array_equal(fused.get_tensor(name), plain.get_tensor(name), err_msg=name)


def test_fused_sgd_matches_torch_optim():
    x, y = data()
    t = pe.compile(mlp(), x, y, optimizer=pe.SGD(lr=0.1, momentum=0.9), exact_skip=False).build()
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(3):
        xb, yb = data(seed=s)
        t.step(xb, yb)
        opt.zero_grad()
        nn.functional.cross_entropy(ref(xb), yb).backward()
        opt.step()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(t.get_tensor(name), p.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
