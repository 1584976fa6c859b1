"""Every supported op: forward value and the gradient of every float input and
parameter, through the compiled C++ step, against torch.autograd (float32)."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from helpers import check_op

torch.manual_seed(0)
R = torch.randn


def _ids(n, high, shape):
    return torch.randint(0, high, shape)


CASES = {
    # dense layers
    "linear": lambda: check_op(lambda x, m: m(x), R(6, 5), modules=[nn.Linear(5, 7)]),
    "linear_3d_nobias": lambda: check_op(lambda x, m: m(x), R(2, 3, 5), modules=[nn.Linear(5, 4, bias=False)]),
    "matmul_batched": lambda: check_op(lambda a, b: a @ b, R(2, 3, 4, 5), R(2, 3, 5, 6)),
    "matmul_broadcast_rhs": lambda: check_op(lambda a, b: a @ b, R(2, 3, 4, 5), R(5, 6)),
    "matmul_broadcast_lhs": lambda: check_op(lambda a, b: torch.matmul(a, b), R(4, 5), R(3, 5, 2)),
    "bmm_transposed": lambda: check_op(lambda a, b: torch.bmm(a, b.transpose(1, 2)), R(2, 3, 4), R(2, 5, 4)),
    "conv2d": lambda: check_op(lambda x, m: m(x), R(2, 3, 9, 8), modules=[nn.Conv2d(3, 4, 3, stride=2, padding=1)]),
    "conv2d_dilated_nobias": lambda: check_op(lambda x, m: m(x), R(1, 2, 10, 10),
                                             modules=[nn.Conv2d(2, 3, 3, dilation=2, bias=False)]),
    "conv2d_grouped": lambda: check_op(lambda x, m: m(x), R(2, 4, 6, 6), modules=[nn.Conv2d(4, 6, 3, groups=2, padding=1)]),
    "conv2d_depthwise": lambda: check_op(lambda x, m: m(x), R(2, 6, 7, 7), modules=[nn.Conv2d(6, 6, 3, groups=6, padding=1)]),
    "conv2d_1x1": lambda: check_op(lambda x, m: m(x), R(2, 6, 5, 5), modules=[nn.Conv2d(6, 8, 1)]),
    "embedding": lambda: check_op(lambda i, m: m(i), _ids(0, 10, (3, 4)), modules=[nn.Embedding(10, 6)]),
    "embedding_padding_idx": lambda: check_op(lambda i, m: m(i), torch.tensor([[0, 1, 2, 0]]),
                                              modules=[nn.Embedding(5, 3, padding_idx=0)]),
    # normalisation
    "layer_norm": lambda: check_op(lambda x, m: m(x), R(3, 4, 8), modules=[nn.LayerNorm(8)]),
    "layer_norm_2d_noaffine": lambda: check_op(lambda x: F.layer_norm(x, (4, 5)), R(3, 4, 5)),
    "batch_norm_train": lambda: check_op(lambda x, m: m(x), R(4, 3, 5, 5), modules=[nn.BatchNorm2d(3).train()]),
    "batch_norm_eval": lambda: check_op(lambda x, m: m(x), R(4, 3, 5, 5), modules=[_trained_bn().eval()]),
    "batch_norm_1d": lambda: check_op(lambda x, m: m(x), R(8, 6), modules=[nn.BatchNorm1d(6).train()]),
    # pooling
    "max_pool2d": lambda: check_op(lambda x: F.max_pool2d(x, 2), R(2, 3, 8, 8)),
    "max_pool2d_pad_ceil": lambda: check_op(lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), R(1, 2, 9, 9)),
    "avg_pool2d": lambda: check_op(lambda x: F.avg_pool2d(x, 3, 2, 1), R(2, 3, 9, 9)),
    "avg_pool2d_exclude_pad_ceil": lambda: check_op(
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), R(1, 2, 8, 8)),
    "adaptive_avg_pool2d": lambda: check_op(lambda x: F.adaptive_avg_pool2d(x, 1), R(2, 3, 5, 6)),
    "adaptive_avg_pool2d_3x2": lambda: check_op(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), R(2, 3, 7, 5)),
    # activations
    "relu": lambda: check_op(torch.relu, R(4, 5)),
    "relu6": lambda: check_op(F.relu6, R(4, 5) * 5),
    "hardtanh": lambda: check_op(lambda x: F.hardtanh(x, -0.5, 0.7), R(4, 5)),
    "gelu": lambda: check_op(F.gelu, R(4, 5)),
    "gelu_tanh": lambda: check_op(lambda x: F.gelu(x, approximate="tanh"), R(4, 5)),
    "silu": lambda: check_op(F.silu, R(4, 5)),
    "sigmoid": lambda: check_op(torch.sigmoid, R(4, 5)),
    "tanh": lambda: check_op(torch.tanh, R(4, 5)),
    "exp_log_sqrt": lambda: check_op(lambda x: torch.exp(x) + torch.log(x.abs() + 1) + torch.sqrt(x * x + 1), R(3, 4)),
    "rsqrt_neg_pow": lambda: check_op(lambda x: -torch.rsqrt(x * x + 1) + (x * x + 1) ** 1.5, R(3, 4)),
    "softmax": lambda: check_op(lambda x: torch.softmax(x, dim=1), R(3, 5, 2)),
    "log_softmax": lambda: check_op(lambda x: torch.log_softmax(x, dim=-1), R(3, 5)),
    # elementwise and reductions
    "add_sub_broadcast": lambda: check_op(lambda a, b: a + b - 2 * b, R(3, 1, 5), R(4, 1)),
    "mul_div_broadcast": lambda: check_op(lambda a, b: a * b / (b * b + 1), R(2, 3, 4), R(3, 1)),
    "scalar_ops": lambda: check_op(lambda x: (x * 3 + 1) / 2 - 0.5, R(3, 4)),
    "where_masked_fill": lambda: check_op(lambda x, m: torch.where(m, x, x * 2).masked_fill(~m, 0.5),
                                          R(3, 4), torch.rand(3, 4) > 0.5),
    "sum_mean": lambda: check_op(lambda x: x.sum(dim=(0, 2)).sum() + x.mean(dim=1).sum(0), R(3, 4, 5)),
    "sum_keepdim_all": lambda: check_op(lambda x: x.sum(-1, keepdim=True) * x.mean(), R(3, 4)),
    # layout
    "reshape_permute_transpose": lambda: check_op(lambda x: x.reshape(2, 12).t().reshape(3, 4, 2).permute(2, 0, 1),
                                                  R(2, 3, 4)),
    "expand_unsqueeze": lambda: check_op(lambda x: x.unsqueeze(1).expand(3, 4, 5) * 1.5, R(3, 5)),
    "slice_step_select": lambda: check_op(lambda x: x[:, 1:5:2] + x[:, -1:].expand(3, 2) + x[1, :2], R(3, 6)),
    "split_cat": lambda: check_op(lambda x: torch.cat(x.split([2, 3], 1)[::-1], 1), R(3, 5)),
    "stack_flatten": lambda: check_op(lambda a, b: torch.stack([a, b], 1).flatten(1), R(3, 4), R(3, 4)),
    # attention
    "sdpa_causal": lambda: check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                    R(2, 2, 5, 4), R(2, 2, 5, 4), R(2, 2, 5, 3)),
    "sdpa_bool_mask": lambda: check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                       R(2, 3, 4), R(2, 5, 4), R(2, 5, 4), _bool_mask(3, 5)),
    "sdpa_float_mask_batched": lambda: _sdpa_with_constant_mask(R(2, 1, 3, 5)),
    # recurrent
    "lstm": lambda: check_op(lambda x, m: m(x)[0], R(2, 5, 3), modules=[nn.LSTM(3, 4, batch_first=True)]),
    "lstm_2layer_proj_state": lambda: check_op(lambda x, h, c, m: m(x, (h, c))[0].sum(1) + m(x, (h, c))[1][0][1],
                                               R(2, 4, 3), R(2, 2, 2), R(2, 2, 5),
                                               modules=[nn.LSTM(3, 5, num_layers=2, proj_size=2, batch_first=True)]),
    "lstm_seq_first": lambda: check_op(lambda x, m: m(x)[0], R(4, 2, 3), modules=[nn.LSTM(3, 4)]),
    "gru": lambda: check_op(lambda x, h, m: m(x, h)[0], R(2, 5, 3), R(1, 2, 4), modules=[nn.GRU(3, 4, batch_first=True)]),
    "gru_2layer_nobias": lambda: check_op(lambda x, m: m(x)[1], R(3, 4, 2),
                                          modules=[nn.GRU(2, 3, num_layers=2, bias=False, batch_first=True)]),
    # losses
    "cross_entropy": lambda: check_op(lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1), R(6, 5), _ids(0, 5, (6,))),
    "cross_entropy_ignore": lambda: check_op(lambda x, y: F.cross_entropy(x, y, ignore_index=2), R(6, 5),
                                             torch.tensor([0, 2, 1, 2, 4, 3])),
    "nll_loss": lambda: check_op(lambda x, y: F.nll_loss(torch.log_softmax(x, 1), y), R(6, 5), _ids(0, 5, (6,))),
    "mse_loss": lambda: check_op(lambda a, b: F.mse_loss(a, b), R(3, 4), R(3, 4)),
}


def _trained_bn():
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(3))
        bn.running_var.copy_(torch.rand(3) + 0.5)
        bn.weight.copy_(torch.randn(3))
    return bn


def _sdpa_with_constant_mask(mask):
    """A float mask captured as a constant (masks get no gradient: PockError if one is asked for)."""
    return check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                    R(2, 2, 3, 4), R(2, 2, 5, 4), R(2, 2, 5, 4))


def test_attention_mask_gradient_matches_autograd():
    """A trained float mask (Swin's, BEiT's, mT5's relative-position bias passed as attn_mask)
    gets its gradient (it used to be a PockError): per-batch and broadcast over the batch."""
    check_op(lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), R(1, 3, 4), R(1, 3, 3))
    check_op(lambda q, m: F.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=m), R(2, 2, 3, 4), R(3, 3))


def _bool_mask(L, S):
    m = torch.rand(L, S) > 0.4
    m[:, 0] = True
    return m


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_forward_and_gradient(case):
    CASES[case]()


def test_dropout_train_mode_masks_and_scales():
    """Dropout uses PockEngine's own RNG: kept elements are scaled by 1/(1-p),
    the rest are zero, and the gradient flows only through kept elements."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(64, 32))

        def forward(self, x):
            return F.dropout(self.w * x, p=0.25, training=True)

    x, r = torch.ones(1), torch.ones(64, 32)
    trainer = pe.compile(M(), (x,), (r,), loss=lambda out, r: (out * r).sum(), optimizer=pe.SGD(lr=1.0)).build()
    loss = trainer.step((x,), (r,))
    grad = 1.0 - trainer.state_dict()["w"]
    kept = grad != 0
    assert np.allclose(grad[kept], 1 / 0.75)
    assert 0.6 < kept.mean() < 0.9
    assert loss == pytest.approx(kept.sum() / 0.75, rel=1e-5)


def test_finite_differences_agree_with_gradient_rules():
    """Directional finite differences of the compiled loss agree with the
    compiled gradient for a model chaining many rules."""
    torch.manual_seed(1)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3, padding=1)
            self.ln = nn.LayerNorm(16)
            self.fc = nn.Linear(16, 3)

        def forward(self, x):
            h = F.avg_pool2d(F.gelu(self.conv(x)), 2).flatten(1)
            return self.fc(torch.tanh(self.ln(h)))

    x, y = torch.randn(3, 2, 4, 4), torch.randint(0, 3, (3,))
    trainer = pe.compile(M(), (x,), (y,), loss="cross_entropy", optimizer=pe.SGD(lr=1.0)).build()
    start = trainer.state_dict()
    trainer.step((x,), (y,))
    grad = {k: start[k] - v for k, v in trainer.state_dict().items()}
    rng = np.random.default_rng(0)
    direction = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in start.items()}
    eps = 1e-2

    def loss_at(t):
        trainer.load_state_dict({k: start[k] + t * direction[k] for k in start})
        return trainer.step((x,), (y,))

    fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float((grad[k] * direction[k]).sum()) for k in start)
    assert fd == pytest.approx(analytic, rel=2e-2)
