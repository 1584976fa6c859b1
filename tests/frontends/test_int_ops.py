"""Input-dependent integer ops (frontends/aten_ext.py, kernels/compare.cpp): cumsum, integer
arithmetic, torch.gather and index.Tensor lowered to the range-checked embedding gather.
Built and stepped; forward and gradients against torch.autograd."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import pockengine as pe

B, T, S, PAD = 2, 6, 10, 1


class PositionsFromIds(torch.nn.Module):
    """RoBERTa-style bookkeeping: positions = cumsum(ids != pad) * (ids != pad) + pad, used by
    an embedding and by a float gather; a float cumsum on the trained path; a padding-mask
    lookup mask[batch_idx, pos_idx] with compile-time index tensors."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(S, 4)
        self.table = torch.nn.Parameter(torch.randn(B, S))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, ids):
        m = ids.ne(PAD).int()
        pos = (torch.cumsum(m, dim=1).type_as(m) * m).long() + PAD
        h = self.lin(x + self.pos(pos))                       # [B, T, 4]
        g = torch.gather(self.table, 1, pos)                  # [B, T], gradient into table
        keep = m.bool()[torch.arange(B)[:, None], torch.arange(T)[None, :]]
        c = torch.cumsum(h, dim=1) * 0.3                      # float cumsum, gradient
        return torch.where(keep[..., None], c + g[..., None], torch.zeros_like(c))


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 4, generator=g)
    ids = torch.randint(2, 9, (B, T), generator=g)
    ids[1, T - 2:] = PAD
    return x, ids, torch.randn(B, T, 4, generator=g)


def test_cumsum_gather_index_step_matches_torch():
    torch.manual_seed(0)
    model = PositionsFromIds()
    ref = copy.deepcopy(model)
    x, ids, y = _data()
    prog = pe.compile(model, (x, ids), (y,), loss="mse", optimizer=pe.SGD(lr=0.1))
    ops = {n.op for n in prog.graph.nodes}
    assert {"cumsum", "compare", "embedding"} <= ops, ops
    trainer = prog.build()
    np.testing.assert_allclose(trainer.forward((x, ids)), ref(x, ids).detach().numpy(), rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for seed in (0, 1):
        x, ids, y = _data(seed)
        loss = torch.nn.functional.mse_loss(ref(x, ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(trainer.step((x, ids), (y,)) - loss.item()) < 1e-5
    got = trainer.state_dict()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(got[name], p.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_gather_ids_out_of_range_name_input_position_value():
    class G(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(B, S))

        def forward(self, x, ids):
            return torch.gather(self.table, 1, ids) * x

    x, ids = torch.randn(B, T), torch.randint(0, S, (B, T))
    trainer = pe.compile(G(), (x, ids), (x,), loss="mse").build()
    bad = ids.clone()
    bad[1, 2] = S + 3
    with pytest.raises(pe.PockError, match=rf"input 1 'input1' holds {S + 3} at flat index {T + 2}, outside \[0, {S}\)"):
        trainer.step((x, bad), (x,))


def test_integer_cumsum_forward():
    class C(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, ids):
            return torch.cumsum(ids, dim=0).float() * self.w

    ids = torch.randint(-5, 50, (7, 3))
    trainer = pe.compile(C(), (ids,), (torch.zeros(7, 3),), loss="mse").build()
    np.testing.assert_array_equal(trainer.forward((ids,)), torch.cumsum(ids, 0).float().numpy())


def test_op_outside_the_set_still_fails_at_compile_time():
    class P(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.cumprod(self.lin(x), dim=1)

    with pytest.raises(pe.PockError, match=r"unsupported op aten.cumprod.* in module P"):
        pe.compile(P(), (torch.randn(2, 3),), (torch.randn(2, 3),), loss="mse")
