"""Each Vulkan shader against the CPU kernel: forward values (through the loss)
and gradients (through one SGD step with lr=1) of small ops, on this machine's
Vulkan device (lavapipe in CI).  Ops are grouped so each group builds once."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from models import Rotary
from vk_helpers import check_vulkan_op, needs_vulkan

pytestmark = needs_vulkan


def r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_gemm_linear_forward_both_backward_products_and_matmul():
    lin, lin_nb = nn.Linear(12, 7), nn.Linear(7, 5, bias=False)
    check_vulkan_op(lambda x, a, b, l1, l2: (l2(F.relu(l1(x))), l1(x[:3]) * 0.5, torch.bmm(a, b)),
                    r(9, 12), r(2, 3, 4, seed=1), r(2, 4, 6, seed=2), modules=(lin, lin_nb),
                    ops=("linear", "linear_bwd_input", "linear_bwd_weight", "bias_bwd", "matmul"))


def test_pointwise_activations_forward_and_backward():
    x = r(70) * 3  # more than one workgroup of 64
    check_vulkan_op(lambda x: (F.gelu(x), F.gelu(x, approximate="tanh"), torch.relu(x), torch.sigmoid(x),
                               torch.tanh(x), F.silu(x), F.hardtanh(x, -1.5, 2.0), F.relu6(x)), x,
                    ops=("gelu", "gelu_bwd", "relu", "relu_bwd", "sigmoid", "sigmoid_bwd", "tanh", "tanh_bwd",
                         "silu", "silu_bwd", "hardtanh", "hardtanh_bwd"), rtol=2e-5, atol=2e-6)


def test_unary_maths_and_scalars():
    x = r(5, 6).abs() + 0.5
    check_vulkan_op(lambda x: (torch.exp(x), torch.log(x), torch.sqrt(x), torch.rsqrt(x), -x, (x - 1).abs(),
                               1 / x, x * 3.0 + 2.0, 1.0 - x), x,
                    ops=("exp", "log", "sqrt", "rsqrt", "mul_scalar", "add_scalar"), rtol=2e-5, atol=2e-6)


def test_binary_broadcasting_and_reductions():
    check_vulkan_op(lambda a, b, c: (a + b, a * c, a - c, a / (b.abs() + 1), a.sum(dim=1), a.mean(dim=(0, 2))),
                    r(3, 4, 5), r(4, 5, seed=1), r(3, 1, 5, seed=2),
                    ops=("add", "mul", "sub", "div", "sum", "mean", "sum_to"))


def test_layout_copies():
    check_vulkan_op(lambda a, b: (a.permute(2, 0, 1) * 1.0, a[:, 1:3] * 2.0, torch.cat([a, b], dim=1) * 1.0,
                                  a[:, :1].expand(3, 4, 5) * 1.0),
                    r(3, 4, 5), r(3, 2, 5, seed=1), ops=("permute", "slice", "slice_bwd", "cat", "expand"))


def test_layer_norm_and_embedding():
    ln, ln_plain = nn.LayerNorm(24), nn.LayerNorm(24, elementwise_affine=False)
    emb = nn.Embedding(11, 24, padding_idx=3)
    idx = torch.tensor([[1, 3, 3, 10], [0, 1, 5, 3]])
    check_vulkan_op(lambda x, i, ln, lnp, emb: (ln(x + emb(i)), lnp(x) * 2.0), r(2, 4, 24), idx,
                    modules=(ln, ln_plain, emb), ops=("layer_norm", "layer_norm_bwd", "embedding", "embedding_bwd"),
                    rtol=2e-5, atol=2e-6)


def test_cross_entropy_with_ignore_index_and_label_smoothing():
    t = torch.tensor([1, 4, -100, 0, 2, 4, 3])
    check_vulkan_op(lambda x, t: (F.cross_entropy(x, t) + F.cross_entropy(x * 0.5, t, label_smoothing=0.1)),
                    r(7, 5) * 2, t, ops=("cross_entropy", "cross_entropy_bwd"))


def test_sgd_and_adamw_updates_over_steps():
    for opt in (pe.SGD(lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=True),
                pe.SGD(lr=0.1, momentum=0.9, dampening=0.1), pe.AdamW(lr=1e-2, weight_decay=0.1)):
        lin = nn.Linear(6, 4)
        check_vulkan_op(lambda x, lin: lin(x), r(5, 6), modules=(lin,), optimizer=opt, steps=3,
                        ops=("sgd_update",) if isinstance(opt, pe.SGD) else ("adamw_update",))


class _RMSNorm(nn.Module):  # Llama's RMSNorm, fp32 upcast included (passes/fuse_norm.py fuses it)
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(1.0 + 0.1 * r(d, seed=5)), eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def test_fused_rms_norm_and_swiglu():
    norm, gate, up = _RMSNorm(20), nn.Linear(20, 70, bias=False), nn.Linear(20, 70, bias=False)
    check_vulkan_op(lambda x, norm, gate, up: F.silu(gate(norm(x))) * up(norm(x)), r(2, 3, 20),
                    modules=(norm, gate, up), ops=("rms_norm", "rms_norm_bwd", "swiglu", "swiglu_bwd"),
                    rtol=2e-5, atol=2e-6)


def test_fused_rope():
    rot = Rotary(d=24, heads=3, kv_heads=1, T=5, per_batch=True)
    check_vulkan_op(lambda x, rot: rot(x), r(2, 5, 24), modules=(rot,), ops=("rope", "rope_bwd"), rtol=2e-5,
                    atol=2e-6)
