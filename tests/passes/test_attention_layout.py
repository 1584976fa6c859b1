"""passes/attention.py: the head permutes and the GQA head repeat around rope/sdpa are absorbed into
the ops (sdpa attrs["layout"], rope attrs["tmajor"]); forward and gradients against torch.autograd
for both layouts (and mixed), grouped-query heads, masks, and the copy count of tiny models' steps."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from models import GPT, rotate_half

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontends"))

COPIES = ("permute", "expand", "sum_to", "slice", "slice_bwd", "cat")


class Attn(nn.Module):
    """HF-style attention: projections split into heads, optional rope, repeat_kv (or enable_gqa),
    sdpa, heads merged before o_proj. head_major_kv: k/v are also scaled after the permute, so
    they stay [B, H, T, D] (a mixed layout)."""

    def __init__(self, heads=4, kv_heads=4, D=8, T=6, rope=False, mask="causal", frontend_gqa=False,
                 head_major_kv=False, per_batch=False):
        super().__init__()
        d = heads * D
        self.H, self.Hk, self.D, self.mask, self.rope = heads, kv_heads, D, mask, rope
        self.frontend_gqa, self.head_major_kv = frontend_gqa, head_major_kv
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, kv_heads * D), nn.Linear(d, kv_heads * D)
        self.o = nn.Linear(d, d)
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
        pos = torch.arange(T).float()
        if per_batch:
            pos = torch.stack([pos, pos + 2.0])
        emb = torch.cat((pos[..., None] * inv,) * 2, dim=-1)
        self.register_buffer("cos", emb.cos().unsqueeze(-3), persistent=False)
        self.register_buffer("sin", emb.sin().unsqueeze(-3), persistent=False)
        g = torch.Generator().manual_seed(5)
        self.register_buffer("bmask", torch.rand(T, T, generator=g) < 0.7, persistent=False)
        self.bmask[:, 0] = True
        self.register_buffer("fmask", torch.randn(1, 1, T, T, generator=g), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(x).view(B, T, self.Hk, self.D).transpose(1, 2)
        v = self.v(x).view(B, T, self.Hk, self.D).transpose(1, 2)
        if self.rope:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        if self.head_major_kv:
            k, v = k * 1.5, v * 0.5
        gqa = self.Hk != self.H
        if gqa and not self.frontend_gqa:  # transformers' repeat_kv
            g = self.H // self.Hk
            k = k[:, :, None].expand(B, self.Hk, g, T, self.D).reshape(B, self.H, T, self.D)
            v = v[:, :, None].expand(B, self.Hk, g, T, self.D).reshape(B, self.H, T, self.D)
        kw = {"enable_gqa": True} if gqa and self.frontend_gqa else {}
        if self.mask == "causal":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        elif self.mask == "bool":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bmask, **kw)
        elif self.mask == "float":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.fmask, **kw)
        else:
            a = F.scaled_dot_product_attention(q, k, v, **kw)
        return self.o(a.transpose(1, 2).reshape(B, T, self.H * self.D))


def trains_like_torch(model, x, y, lr=0.1, steps=2):
    ref = copy.deepcopy(model)
    prog = pe.compile(model, (x,), (y,), loss="mse", optimizer=pe.SGD(lr=lr))
    trainer = prog.build()
    np.testing.assert_allclose(trainer.forward((x,)), ref(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for _ in range(steps):
        loss = F.mse_loss(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(trainer.step((x,), (y,)) - loss.item()) < 1e-5
    got = trainer.state_dict()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(got[name], p.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    return prog


CASES = {
    "mha_causal": dict(),
    "gqa_rope_causal": dict(kv_heads=2, rope=True),
    "gqa_rope_bool_mask": dict(heads=6, kv_heads=2, rope=True, mask="bool"),
    "mqa_float_mask": dict(kv_heads=1, mask="float"),
    "gqa_frontend_rope_per_batch": dict(kv_heads=2, rope=True, mask="none", frontend_gqa=True, per_batch=True),
    "mixed_head_major_kv": dict(kv_heads=2, rope=True, head_major_kv=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_strided_attention_trains_like_torch(case):
    torch.manual_seed(0)
    kw = CASES[case]
    model = Attn(**kw)
    x, y = torch.randn(2, 6, model.H * model.D), torch.randn(2, 6, model.H * model.D)
    prog = trains_like_torch(model, x, y)
    ops = [n.op for n in prog.graph.nodes]
    (sdpa,) = [n for n in prog.graph.nodes if n.op == "sdpa"]
    if kw.get("head_major_kv"):  # k/v read by a mul: they stay [B, H, T, D] and repeat_kv goes
        assert sdpa.attrs["layout"] == (1, 0, 0, 1) and ops.count("permute") == 4, ops
        assert sdpa.inputs[1].shape == (2, 2, 6, 8), sdpa
    else:
        assert sdpa.attrs["layout"] == (1, 1, 1, 1), sdpa
        assert not any(op in COPIES for op in ops), ops
    if kw.get("rope"):  # q's rope (and k's unless k stays head-major) reads [B, T, H, D]
        tm = [bool(n.attrs.get("tmajor")) for n in prog.graph.nodes if n.op == "rope"]
        assert tm == ([True, False] if kw.get("head_major_kv") else [True, True]), tm


def test_strided_sdpa_matches_head_major_reference():
    """The compiled sdpa with [B, T, H, D] operands against its torch reference and the
    unfused (pass disabled) program: same outputs, same gradients."""
    from pockengine.ops.record import REGISTRY
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 7, 2, 8), torch.randn(2, 7, 2, 6)
    a = {"causal": False, "scale": 0.3, "layout": (1, 1, 1, 1)}
    got = REGISTRY["sdpa"].torch([q, k, v, None], a)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1),
                                          v.transpose(1, 2).repeat_interleave(2, 1), scale=0.3).transpose(1, 2)
    torch.testing.assert_close(got, want)
    shapes = REGISTRY["sdpa"].infer([_V(q.shape), _V(k.shape), _V(v.shape), None], a)
    assert shapes[0][0] == (2, 5, 4, 6) and shapes[1][0] == (2, 4, 5)  # out, and each row's log-sum-exp


class _V:
    def __init__(self, shape):
        self.shape = tuple(shape)


def _copies(prog):
    return [n.op for n in prog.graph.nodes if n.op in COPIES]


def test_tiny_llama_step_has_no_layout_copies():
    pytest.importorskip("transformers")
    import hf_zoo
    torch.manual_seed(0)
    model, x, y, loss, out = hf_zoo.llama()
    prog = pe.compile(model, x, y, loss=loss, output=out, optimizer=pe.AdamW(lr=1e-3))
    assert _copies(prog) == []  # was 16 permutes + 4 expands (and 4 sum_to) for 2 layers
    sdpa = [n for n in prog.graph.nodes if n.op in ("sdpa", "sdpa_bwd")]
    assert len(sdpa) == 4 and all(n.attrs["layout"] == (1, 1, 1, 1) for n in sdpa)


def test_tiny_gpt_step_has_no_layout_copies():
    torch.manual_seed(0)
    model = GPT(vocab=64, d=32, layers=2, heads=2, seq=8)
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    prog = pe.compile(model, (x,), (y,), loss="cross_entropy", optimizer=pe.AdamW(lr=1e-3))
    # was 28: 16 permutes, 6 slices and 6 slice_bwd (the qkv split); one sum_to stays (the position
    # embedding's batch broadcast)
    assert [op for op in _copies(prog) if op != "sum_to"] == []
    sdpa = [n for n in prog.graph.nodes if n.op in ("sdpa", "sdpa_bwd")]
    assert len(sdpa) == 4 and all(n.attrs["packed"] == ((0, 2, 16), (32, 2, 16), (64, 2, 16)) for n in sdpa)


class FusedQKV(nn.Module):
    """GPT-2-style fused projection split into q, k, v (in a given order), heads, sdpa."""

    def __init__(self, order=(0, 1, 2), H=2, D=8):
        super().__init__()
        self.order, self.H, self.D = order, H, D
        self.qkv, self.o = nn.Linear(H * D, 3 * H * D), nn.Linear(H * D, H * D)

    def forward(self, x):
        B, T, d = x.shape
        parts = self.qkv(x).split(d, dim=-1)
        q, k, v = (parts[i].reshape(B, T, self.H, self.D).transpose(1, 2) for i in self.order)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_packed_qkv_trains_like_torch(order):
    torch.manual_seed(3)
    model = FusedQKV(order)
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    prog = trains_like_torch(model, x, y)
    assert [n.op for n in prog.graph.nodes if n.op in COPIES] == []
