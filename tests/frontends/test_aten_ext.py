"""Compile-time checks of the converters beyond the core set (frontends/aten_ext.py) and of
compile-time evaluation (passes/const_eval.py); compile only, no C++ build."""
from __future__ import annotations

import pytest
import torch

import pockengine as pe


class _Gather(torch.nn.Module):
    def __init__(self, ids):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))
        self.register_buffer("ids", torch.tensor(ids), persistent=False)

    def forward(self, x):
        return self.w[self.ids].sum(0) * x


def test_constant_index_ids_are_range_checked_at_compile_time():
    with pytest.raises(pe.PockError, match=r"index ids out of range \[0, 4\)"):
        pe.compile(_Gather([0, 5]), (torch.randn(3),), (torch.randn(3),), loss="mse")
    prog = pe.compile(_Gather([0, 3]), (torch.randn(3),), (torch.randn(3),), loss="mse")
    assert "embedding" in {n.op for n in prog.graph.nodes}


def test_masks_from_shapes_fold_to_constants():
    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            t = torch.arange(x.shape[1])
            mask = t[None, :] <= t[:, None]
            s = self.lin(x) @ x.transpose(1, 2)
            return torch.where(mask, s, torch.full_like(s, -1e4)).softmax(-1) @ x

    prog = pe.compile(Causal(), (torch.randn(2, 5, 4),), (torch.randn(2, 5, 4),), loss="mse")
    ops = {n.op for n in prog.graph.nodes}
    assert "compare" not in ops and "where" in ops
    assert any(v.kind == "const" and v.dtype == "u8" for v in prog.graph.state.values())
