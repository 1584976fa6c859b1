"""Forward and gradient of the ops Hugging Face families add (frontends/aten_ext.py), each
checked against torch.autograd with check_op. Several ops share one compiled module so the
file builds a few C++ steps, not one per op."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import check_op


def R(*shape):
    return torch.randn(*shape)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rms_norm(x, w, eps=1e-6):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps)).to(x.dtype)


def test_padding_conv1d_norm_repeat():
    def fn(x, y, conv):
        padded = F.pad(x, (1, 2, 0, 1), value=0.5)                    # constant_pad_nd
        cropped = F.pad(x, (-1, 1))                                     # negative pad crops
        c1 = conv(y)                                                    # Conv1d
        norm = torch.linalg.vector_norm(x, dim=(-1,), keepdim=True)     # linalg_vector_norm
        rep = x.repeat(2, 1, 3)                                         # repeat
        return padded, cropped, c1, norm, rep

    check_op(fn, R(2, 3, 4), R(2, 3, 9), modules=[nn.Conv1d(3, 4, 3, stride=2, padding=1)])


def test_rotary_rmsnorm_gqa_minmax_masks():
    def fn(q, k, w, pos, a, b):
        cos, sin = pos.cos(), pos.sin()                                 # cos/sin of a trained input
        rq = q * cos + _rotate_half(q) * sin                            # rotary: slices, neg, cat
        kv = k[:, :, None].expand(2, 2, 2, 5, 4).reshape(2, 4, 5, 4)    # repeat_kv (GQA)
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        att = F.scaled_dot_product_attention(rq, kv, kv, attn_mask=causal)
        norm = _rms_norm(att, w)                                        # RMSNorm with fp32 upcast
        mn, mx = torch.minimum(a, b), torch.maximum(a, b)
        gated = F.silu(a) * b                                           # SwiGLU
        keep = (a > 0.1) & (b < 0.5)                                    # input-dependent mask
        masked = torch.where(keep, a, torch.zeros_like(a)) + keep.float()
        return norm, mn, mx, gated, masked

    check_op(fn, R(2, 4, 5, 4), R(2, 2, 5, 4), R(4), R(5, 4), R(3, 6), R(3, 6))
