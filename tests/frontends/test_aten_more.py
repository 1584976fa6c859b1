"""Op classes beyond the first Hugging Face set (frontends/aten_more.py and the extended
index/sdpa/promotion converters): built and stepped, forward and every parameter's gradient
against torch.autograd (one SGD step with lr=1 leaves p - grad)."""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

import pockengine as pe


class Vision(torch.nn.Module):
    """BiT/wav2vec2/MobileViT/Funnel patterns: weight standardization (batch norm without
    stats on a weight), group norm, bilinear (both align_corners) and nearest upsampling,
    slice_scatter, a leading-':' index with compile-time ids, max/min reductions."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.gn = torch.nn.GroupNorm(2, 4)
        self.conv2 = torch.nn.Conv2d(4, 4, 1, bias=False)
        self.src = torch.nn.Parameter(torch.randn(2, 4, 2, 6))
        self.register_buffer("cols", torch.tensor([[0, 2], [5, 1]]), persistent=False)

    def forward(self, x):
        w = self.conv.weight
        w = F.batch_norm(w.reshape(1, 4, -1), None, None, training=True, momentum=0.0, eps=1e-6).reshape_as(w)
        h = self.gn(F.conv2d(x, w, self.conv.bias, padding=1))                       # 2 x 4 x 6 x 6
        a = F.interpolate(h, size=(9, 7), mode="bilinear", align_corners=False)
        b = F.interpolate(h, scale_factor=1.5, mode="bilinear", align_corners=True)    # 9 x 9
        n = F.interpolate(self.conv2(h), scale_factor=2, mode="nearest")               # 12 x 12
        h = torch.slice_scatter(h, self.src * h[:, :, :2].mean(), dim=2, start=2, end=4)
        picked = h[:, :, :, self.cols]                                                 # 2 x 4 x 6 x 2 x 2
        m = h.amax(dim=(2, 3)) + h.max(dim=2).values.min(dim=-1).values                   # Hiera's pooling
        return torch.cat([a.mean((2, 3)), b.mean((2, 3)), n.mean((2, 3)), picked.sum((2, 3, 4)) + m], 1)


class Attention(torch.nn.Module):
    """Swin's learned bias through sdpa's attn_mask, Falcon's broadcast k/v, grouped-query
    k/v (enable_gqa), a ':'-led index and index_select with input-dependent ids, bool + float
    promotion, argmax/argmin and x[arange, argmax] (CLIP's pooled token), max/min with indices."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.kv = torch.nn.Linear(8, 8)
        self.bias = torch.nn.Parameter(0.5 * torch.randn(2, 5, 5))
        self.table = torch.nn.Parameter(torch.randn(3, 10, 4))

    def forward(self, x, ids):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 2, 4).transpose(1, 2)                                # 2 heads
        k, v = self.kv(x).view(b, t, 2, 4).transpose(1, 2).split(1, dim=1)           # 1 head each
        y1 = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)             # broadcast k/v
        y2 = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
        looked = self.table[:, ids] + self.table.index_select(1, ids[0])[:, None]      # 3 x 2 x 5 x 4
        pad = ids.gt(4)                                                                # bool
        y = torch.cat([y1, y2], -1).transpose(1, 2).reshape(b, t, 16)
        y = y + looked.sum(0).repeat(1, 1, 4) + pad[..., None]
        pooled = y[torch.arange(b), ids.argmax(-1)]                                      # CLIP's pooled token
        first = y.max(dim=1).indices.float() + pooled                                  # 2 x 16
        return y + first[:, None] + y.min(dim=-1, keepdim=True).values + ids.argmin()


def _check(model, inputs, target):
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    trainer = pe.compile(model, inputs, (target,), loss="mse", optimizer=pe.SGD(lr=1.0)).build()
    np.testing.assert_allclose(trainer.forward(inputs), ref(*inputs).detach().numpy(), rtol=1e-5, atol=1e-5)
    loss = F.mse_loss(ref(*inputs), target)
    loss.backward()
    assert abs(trainer.step(inputs, (target,)) - loss.item()) < 1e-5
    got = trainer.state_dict()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(p.detach().numpy() - got[name], p.grad.numpy(), rtol=1e-4, atol=2e-6,
                                   err_msg=name)


def test_norms_resampling_slice_scatter_match_autograd():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    _check(Vision(), (torch.randn(2, 3, 6, 6, generator=g),), torch.randn(2, 16, generator=g))


def test_attention_bias_gradient_broadcast_kv_and_index_match_autograd():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x, ids = torch.randn(2, 5, 8, generator=g), torch.randint(0, 10, (2, 5), generator=g)
    _check(Attention(), (x, ids), torch.randn(2, 5, 16, generator=g))


class Transposed(torch.nn.Module):
    """DPT's ConvTranspose2d upsampling (stride, padding, output_padding, groups, dilation)
    and an audio-decoder ConvTranspose1d."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = torch.nn.ConvTranspose2d(6, 2, (2, 3), stride=(1, 2), dilation=(2, 1), bias=False)
        self.up1d = torch.nn.ConvTranspose1d(3, 4, 4, stride=2, padding=1)

    def forward(self, x, s):
        y = self.up2(torch.tanh(self.up(x)))                                            # 2 x 2 x 13 x 23
        return torch.cat([y.mean((2, 3)), self.up1d(s).mean(2)], 1)


def test_transposed_convolutions_match_autograd():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    x, s = torch.randn(2, 4, 5, 5, generator=g), torch.randn(2, 3, 7, generator=g)
    _check(Transposed(), (x, s), torch.randn(2, 6, generator=g))


class Activations(torch.nn.Module):
    """Mamba's softplus, Swin2SR's leaky ReLU, ELU/SELU, hard-swish/sigmoid, Mish, log1p/expm1,
    a recurrent scan's select_scatter and copy_, baddbmm."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.w = torch.nn.Parameter(torch.randn(2, 6, 6))

    def forward(self, x):
        h = self.lin(x) * 3                                                             # 2 x 4 x 6
        acts = [F.softplus(h), F.softplus(h, beta=2.0), F.leaky_relu(h, 0.2), F.elu(h), F.selu(h),
                F.hardswish(h), F.hardsigmoid(h), F.mish(h), torch.log1p(h.abs()), torch.expm1(h * 0.3)]
        y = torch.stack(acts).sum(0)
        state = torch.zeros_like(y)
        for t in range(y.shape[1]):
            state[:, t] = torch.tanh(y[:, t] + (state[:, t - 1] if t else 0))          # select_scatter
        buf = torch.empty_like(state)
        buf.copy_(state[:, :1])
        return torch.baddbmm(state + buf, state, self.w, beta=0.5, alpha=2.0)


def test_activations_scan_writes_baddbmm_match_autograd():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    _check(Activations(), (torch.randn(2, 4, 6, generator=g),), torch.randn(2, 4, 6, generator=g))


def test_low_precision_buffer_read_only_at_compile_time_is_folded():
    """RecurrentGemma's bf16 normalizer, cast to float32 before use: folded to a float32
    constant; the step never holds the bf16 tensor."""
    class Normalized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("normalizer", torch.tensor(2.0, dtype=torch.bfloat16), persistent=False)

        def forward(self, x):
            return self.lin(x) * self.normalizer.type(x.dtype)

    prog = pe.compile(Normalized(), (torch.randn(2, 4),), (torch.randn(2, 4),), loss="mse")
    assert all(v.dtype in ("f32", "i64", "u8") for v in prog.graph.state.values())
    assert not any("normalizer" in n and v.kind != "const" for n, v in prog.graph.state.items())
