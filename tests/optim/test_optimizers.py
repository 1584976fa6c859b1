"""The optimizer records (optim/optimizers.py): the update region of a (partial) update, the
update node and state each optimizer emits, hyper-parameter checks, and the update formulas
the reference backend applies against torch.optim itself (the compiled kernels are checked
against the reference in tests/backends/test_reference.py)."""
import math

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.backends.reference import _adamw, _region, _sgd
from pockengine.ir.graph import Graph
from pockengine.optim.optimizers import update_region


def _param(shape):
    g = Graph("t")
    p = g.add_state("w", shape, "f32", "param", data=np.zeros(shape, np.float32))
    return g, p


@pytest.mark.parametrize("shape,k,want", [((4, 6), None, (1, 24, 24)), ((4, 6), 6, (1, 24, 24)),
                                          ((4, 6), 2, (4, 2, 6)), ((8, 16, 3, 3), 4, (8, 36, 144)),
                                          ((5,), None, (1, 5, 5))])
def test_update_region(shape, k, want):
    g, p = _param(shape)
    assert update_region(p, k) == want
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    if k is not None and len(shape) > 1:  # the region is the first k slices along dim 1
        assert torch.equal(_region(t, want).reshape(shape[0], k, *shape[2:]), t[:, :k])


@pytest.mark.parametrize("opt,op,slots", [(pe.SGD(lr=0.1), "sgd_update", []),
                                          (pe.SGD(lr=0.1, momentum=0.9), "sgd_update", ["w:momentum_buffer"]),
                                          (pe.AdamW(lr=1e-3), "adamw_update", ["w:exp_avg", "w:exp_avg_sq"])])
def test_each_optimizer_emits_one_update_node_and_its_state(opt, op, slots):
    g, p = _param((4, 6))
    grad = g.new_value("d_w", (4, 2), "f32")
    opt.emit(g, p, grad, 2, "fc")
    (node,) = g.nodes
    assert node.op == op and node.phase == "update" and node.inputs[0] is p and node.inputs[1] is grad
    assert node.attrs["region"] == (4, 2, 6)
    state = [v for v in node.inputs[2:] if v is not None]
    assert [v.name for v in state] == slots
    assert all(v.kind == "opt_state" and v.shape == (4, 2) for v in state)  # only the updated slices


@pytest.mark.parametrize("make,match", [(lambda: pe.SGD(lr=float("nan")), "lr must be a finite number"),
                                        (lambda: pe.SGD(lr=0.1, momentum=-1), "momentum must be"),
                                        (lambda: pe.SGD(lr=0.1, nesterov=True), "nesterov"),
                                        (lambda: pe.AdamW(betas=(0.9, 1.0)), r"betas must be in \[0, 1\)"),
                                        (lambda: pe.AdamW(betas=(0.9,)), "betas must be two numbers")])
def test_bad_hyperparameters_are_named(make, match):
    with pytest.raises(pe.PockError, match=match):
        make()


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "sgd_nesterov", "adamw"])
def test_reference_update_formulas_match_torch_optim(name):
    torch.manual_seed(0)
    w0 = torch.randn(3, 5)
    grads = [torch.randn(3, 5) for _ in range(4)]
    attrs = {"sgd": dict(momentum=0.0, dampening=0.0, weight_decay=0.01, nesterov=False),
             "sgd_momentum": dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
             "sgd_nesterov": dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=True),
             "adamw": dict(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01)}[name]
    w = torch.nn.Parameter(w0.clone())
    if name == "adamw":
        opt = torch.optim.AdamW([w], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
        slots = [torch.zeros(3, 5), torch.zeros(3, 5)]
    else:
        opt = torch.optim.SGD([w], lr=1e-2, **attrs)
        slots = [torch.zeros(3, 5)]
    ours = w0.clone()
    for t, g in enumerate(grads, 1):
        w.grad = g.clone()
        opt.step()
        (_adamw if name == "adamw" else _sgd)(ours, g, slots, attrs, 1e-2, t)
    torch.testing.assert_close(ours, w.detach(), rtol=1e-6, atol=1e-7)
