"""Test helpers: a PyTorch reference for training steps under PockEngine's
update semantics, and a one-line per-op check through the compiled C++ path."""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.ops import FULL
from pockengine.frontends.torch_export import resolve_loss
from pockengine.compiler.program import resolve_update


def torch_optimizer(opt, params):
    if isinstance(opt, pe.SGD):
        return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, dampening=opt.dampening,
                               weight_decay=opt.weight_decay, nesterov=opt.nesterov)
    return torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)


def reference_train(model, batches, loss, update, optimizer, steps):
    """Train a copy of model with torch: full gradients, masked to the updated
    slices, frozen slices restored after each step. Returns (losses, model)."""
    model = copy.deepcopy(model)
    named = dict(model.named_parameters())
    trained = resolve_update({n: tuple(p.shape) for n, p in named.items()}, update)
    for n, p in named.items():
        p.requires_grad_(n in trained)
    params = [named[n] for n in named if n in trained]
    opt = torch_optimizer(optimizer, params)
    loss_fn = resolve_loss(loss)
    losses = []
    for i in range(steps):
        inputs, targets = batches[i % len(batches)]
        opt.zero_grad()
        value = loss_fn(model(*inputs), *targets)
        value.backward()
        losses.append(value.item())
        frozen = {}
        for n, k in trained.items():
            if k is not FULL:
                named[n].grad[:, k:] = 0
                frozen[n] = named[n].detach()[:, k:].clone()
        opt.step()
        with torch.no_grad():
            for n, saved in frozen.items():
                named[n][:, trained[n]:] = saved
    return losses, model


def compiled_train(model, batches, loss, update, optimizer, steps):
    inputs, targets = batches[0]
    prog = pe.compile(model, inputs, targets, loss=loss, update=update, optimizer=optimizer)
    trainer = prog.build()
    losses = [trainer.step(*batches[i % len(batches)]) for i in range(steps)]
    return losses, trainer, prog


def assert_state_close(trainer, ref_model, original, trained, rtol=1e-4, atol=1e-5):
    """Every parameter/buffer matches the reference; frozen elements are bit-identical to the original."""
    sd = trainer.state_dict()
    for name, ref in ref_model.state_dict().items():
        got, want = sd[name], ref.detach().numpy()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
        orig = original[name].detach().numpy()
        k = trained.get(name)
        if k is None and name in dict(ref_model.named_parameters()):
            assert np.array_equal(got, orig), f"frozen parameter {name} changed"
        elif k is not None and k is not FULL:
            assert np.array_equal(got[:, k:], orig[:, k:]), f"frozen slice of {name} changed"


class _OpModule(nn.Module):
    """fn(*(tensor + delta)) where each float tensor gets a zero parameter delta:
    after one SGD step with lr=1, -delta is exactly the gradient."""

    def __init__(self, fn, tensors, modules):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(modules)
        self.n = len(tensors)
        for i, t in enumerate(tensors):
            self.register_buffer(f"t{i}", t.clone())
            if t.is_floating_point():
                self.register_parameter(f"d{i}", nn.Parameter(torch.zeros_like(t)))

    def forward(self, dummy):
        args = []
        for i in range(self.n):
            t = getattr(self, f"t{i}")
            args.append(t + getattr(self, f"d{i}") if hasattr(self, f"d{i}") else t)
        return self.fn(*args, *self.mods)


def _weighted_sum(out, *weights):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum((o * w).sum() for o, w in zip(outs, weights))


def op_case(fn, tensors, modules=(), seed=0):
    """(module, dummy input, fn's outputs, random loss weights): fn as a module whose
    float inputs are parameters, trained on loss = sum(out * weight) (_weighted_sum)."""
    torch.manual_seed(seed)
    module = _OpModule(fn, tensors, modules)
    dummy = torch.zeros(1)
    with torch.no_grad():
        out = module(dummy)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return module, dummy, outs, tuple(torch.randn_like(o) for o in outs)


def check_op(fn, *tensors, modules=(), rtol=1e-4, atol=1e-5, seed=0):
    """Check fn's forward value and the gradient of every float input and
    every module parameter through the compiled C++ path against torch.autograd."""
    module, dummy, outs, weights = op_case(fn, tensors, modules, seed)
    ref = copy.deepcopy(module)
    ref_loss = _weighted_sum(ref(dummy), *weights)
    ref_loss.backward()
    prog = pe.compile(module, (dummy,), weights, loss=_weighted_sum, optimizer=pe.SGD(lr=1.0))
    trainer = prog.build()
    before = {k: v.copy() for k, v in trainer.state_dict().items()}
    loss = trainer.step((dummy,), weights)
    np.testing.assert_allclose(loss, ref_loss.item(), rtol=rtol, atol=atol * max(1, math.sqrt(sum(o.numel() for o in outs))))
    after = trainer.state_dict()
    for name, p in ref.named_parameters():
        want = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
        got = before[name] - after[name]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"gradient of {name}")
    return prog, trainer


def snapshot(trainer):
    """A trainer's whole state: every state tensor (weights, buffers, optimizer state) by
    name, its step count and its learning rate (for assert_same)."""
    return {t.name: trainer.get_tensor(t.name) for t in trainer.tensors}, trainer.step_count, trainer.learning_rate


def assert_same(a, b):
    """Two snapshots equal bit for bit (a differing tensor is named)."""
    (sa, *rest_a), (sb, *rest_b) = a, b
    assert rest_a == rest_b and sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def run_pytest_in_child(path, timeout=1800) -> None:
    """Run one test file in a child pytest and assert it passed. For cases that import
    TensorFlow, whose LLVM cannot share a process with Mesa lavapipe's (test_keras.py)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                       capture_output=True, text=True, timeout=timeout, cwd=root)
    assert r.returncode == 0, f"{Path(path).name} failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-2000:]
