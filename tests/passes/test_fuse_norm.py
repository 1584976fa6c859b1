"""RMSNorm fusion (passes/fuse_norm.py, kernels/rms_norm.cpp): the written-out pattern with
the fp32 upcast becomes one rms_norm node; forward and gradients match torch.autograd."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import pockengine as pe
from models import Rotary


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


def assert_trains_like_torch(prog, ref, x, y, lr, rtol=1e-5, atol=1e-5, steps=2, loss_relative=False):
    """Inference, then `steps` SGD steps with MSE: the compiled step against `ref` in PyTorch
    (losses within 1e-5, relative to the loss when it exceeds 1 with loss_relative)."""
    trainer = prog.build()
    np.testing.assert_allclose(trainer.forward((x,)), ref(x).detach().numpy(), rtol=rtol, atol=atol)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tol = 1e-5 * (max(1.0, loss.item()) if loss_relative else 1.0)
        assert abs(trainer.step((x,), (y,)) - loss.item()) < tol
    got = trainer.state_dict()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(got[name], p.numpy(), rtol=rtol, atol=atol, err_msg=name)


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
    assert_trains_like_torch(prog, ref, x, y, lr=0.1)


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


class SwiGLU(torch.nn.Module):  # LlamaMLP
    def __init__(self, d=16, h=40, up_first=False):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, h, bias=False)
        self.up_proj = torch.nn.Linear(d, h, bias=False)
        self.down_proj = torch.nn.Linear(h, d, bias=False)
        self.up_first = up_first

    def forward(self, x):
        g, u = torch.nn.functional.silu(self.gate_proj(x)), self.up_proj(x)
        return self.down_proj(u * g if self.up_first else g * u)


@pytest.mark.parametrize("up_first", [False, True])
def test_swiglu_fused_and_trains_like_torch(up_first):
    torch.manual_seed(2)
    model = SwiGLU(up_first=up_first)
    ref = copy.deepcopy(model)
    x, y = torch.randn(3, 5, 16) * 2, torch.randn(3, 5, 16)
    prog = pe.compile(model, (x,), (y,), loss="mse", optimizer=pe.SGD(lr=0.2))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("swiglu") == 1 and ops.count("swiglu_bwd") == 1 and "silu" not in ops, ops
    assert_trains_like_torch(prog, ref, x, y, lr=0.2, atol=1e-6)


@pytest.mark.parametrize("per_batch", [False, True])
def test_rope_fused_and_trains_like_torch(per_batch):
    torch.manual_seed(3)
    model = Rotary(per_batch=per_batch)
    ref = copy.deepcopy(model)
    x, y = torch.randn(2, 5, 24), torch.randn(2, 5, 8)
    prog = pe.compile(model, (x,), (y,), loss="mse", optimizer=pe.SGD(lr=0.1))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("rope") == 2 and ops.count("rope_bwd") == 2, ops
    assert "cat" not in ops and "neg" not in ops, ops
    assert_trains_like_torch(prog, ref, x, y, lr=0.1, loss_relative=True)


def test_rope_layout():
    from pockengine.passes.fuse_norm import rope_layout
    assert rope_layout((2, 4, 8, 16), (1, 1, 8, 16)) == (1, 8, 128, 0)
    assert rope_layout((2, 4, 8, 16), (8, 16)) == (1, 8, 128, 0)
    assert rope_layout((2, 4, 8, 16), (2, 1, 8, 16)) == (2, 4, 128, 1)
    assert rope_layout((2, 8, 4, 16), (1, 8, 1, 16)) is None  # cos varies over a dim left of a broadcast one
