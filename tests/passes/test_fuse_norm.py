"""RMSNorm fusion (passes/fuse_norm.py, kernels/rms_norm.cpp): the written-out pattern with
the fp32 upcast becomes one rms_norm node; forward and gradients match torch.autograd."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import pockengine as pe


class RMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm, verbatim in substance
    def __init__(self, d, eps=1e-6, gemma=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d) * 0.3 + (0.0 if gemma else 1.0))
        self.eps, self.gemma = eps, gemma

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((1.0 + self.weight) if self.gemma else self.weight) * x.to(dtype)


class Net(torch.nn.Module):
    def __init__(self, gemma=False):
        super().__init__()
        self.inp = torch.nn.Linear(6, 16)
        self.norm = RMSNorm(16, gemma=gemma)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.out(self.norm(self.inp(x)))


@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm_fused_and_trains_like_torch(gemma):
    torch.manual_seed(0)
    model = Net(gemma)
    ref = copy.deepcopy(model)
    x, y = torch.randn(3, 7, 6) * 4, torch.randn(3, 7, 5)
    prog = pe.compile(model, (x,), (y,), loss="mse", optimizer=pe.SGD(lr=0.1))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("rms_norm") == 1 and ops.count("rms_norm_bwd") == 1, ops
    assert "rsqrt" not in ops and "mean" not in ops
    trainer = prog.build()
    np.testing.assert_allclose(trainer.forward((x,)), ref(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(trainer.step((x,), (y,)) - loss.item()) < 1e-5
    got = trainer.state_dict()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(got[name], p.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def test_rms_norm_weight_frozen_or_input_frozen():
    """Only dx (weight frozen) / only dw (first layer frozen): the unwanted output is left out."""
    torch.manual_seed(1)
    model = Net()
    x, y = torch.randn(4, 6), torch.randn(4, 5)
    for update in ({"norm.weight": 1.0}, {"inp.weight": 1.0, "out.weight": 1.0}):
        prog = pe.compile(model, (x,), (y,), loss="mse", update=update, optimizer=pe.SGD(lr=0.1))
        bwd = [n for n in prog.graph.nodes if n.op == "rms_norm_bwd"]
        assert len(bwd) == 1
        ref = copy.deepcopy(model)
        trained = [p for n, p in ref.named_parameters() if n in update]
        loss = torch.nn.functional.mse_loss(ref(x), y)
        grads = torch.autograd.grad(loss, trained)
        trainer = prog.build()
        assert abs(trainer.step((x,), (y,)) - loss.item()) < 1e-5
        got = trainer.state_dict()
        for (n, p), gr in zip([(n, p) for n, p in ref.named_parameters() if n in update], grads):
            np.testing.assert_allclose(got[n], (p - 0.1 * gr).detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
