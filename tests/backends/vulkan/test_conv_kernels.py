"""conv2d, batch norm and pooling shaders against the CPU kernels (as test_kernels.py):
forward values through the loss and gradients through one SGD step with lr=1."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from vk_helpers import check_vulkan_op, needs_vulkan

pytestmark = needs_vulkan


def r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_conv2d_dense_strided_dilated_grouped_depthwise_forward_and_both_gradients():
    stem = nn.Conv2d(3, 6, 3, stride=2, padding=1)            # bias, stride 2
    dil = nn.Conv2d(6, 4, 3, padding=2, dilation=2, bias=False)
    grouped = nn.Conv2d(4, 6, (3, 1), stride=(1, 2), padding=(1, 0), groups=2)
    dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)  # depthwise
    pw = nn.Conv2d(6, 5, 1)                                   # pointwise, fused relu6 below
    check_vulkan_op(lambda x, s, d, g, w, p: F.relu6(p(w(g(d(s(x)))))), r(2, 3, 9, 8), modules=(stem, dil, grouped, dw, pw),
                    ops=("conv2d", "conv2d_bwd_input", "conv2d_bwd_weight", "conv2d_bwd_bias"), rtol=2e-5, atol=2e-6)


def test_conv2d_weight_gradient_of_a_partly_trained_weight():
    conv = nn.Conv2d(4, 3, 3, padding=1, bias=False)
    prog, vk = check_vulkan_op(lambda x, c: c(x), r(2, 4, 5, 5), modules=(conv,), ops=("conv2d_bwd_weight",),
                               update={"mods.0.weight": 0.5}, rtol=2e-5, atol=2e-6)
    assert any(n.op == "conv2d_bwd_weight" and n.attrs["k"] == 2 for n in vk.partition.nodes_on("vulkan"))


def test_batch_norm_train_with_running_stats_fused_act_and_eval_mode():
    bn, bn_plain = nn.BatchNorm2d(5), nn.BatchNorm2d(5, affine=False, momentum=0.3)
    bn_eval = nn.BatchNorm2d(5).eval()
    with torch.no_grad():
        bn_eval.running_mean.copy_(r(5, seed=3))
        bn_eval.running_var.copy_(r(5, seed=4).abs() + 0.5)
        bn_eval.weight.copy_(r(5, seed=5))
    x = r(3, 5, 4, 6) * 2 + 1
    prog, vk = check_vulkan_op(lambda x, b, bp, be: (F.relu6(b(x)), bp(x * 0.5) * 2.0, be(x), F.relu(b(x * x))), x,
                               modules=(bn, bn_plain, bn_eval),
                               ops=("batch_norm_train", "batch_norm_train_bwd", "batch_norm_eval", "batch_norm_eval_bwd",
                                    "assign", "add_scalar"), steps=2, rtol=2e-5, atol=2e-6)
    state = vk.state_dict()
    # bn runs twice a call: once when check_vulkan_op makes the weights, then two steps
    assert int(state["mods.0.num_batches_tracked"]) == 6
    assert abs(state["mods.1.running_mean"]).max() > 0.01  # the running statistics moved


def test_pooling_max_avg_adaptive_forward_and_backward():
    x = r(2, 3, 7, 9)
    check_vulkan_op(lambda x: (F.max_pool2d(x, 2), F.max_pool2d(x, 3, stride=2, padding=1, dilation=1, ceil_mode=True),
                               F.max_pool2d(x, 2, stride=1, dilation=2), F.avg_pool2d(x, 3, stride=2, padding=1),
                               F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
                               F.avg_pool2d(x, 3, padding=1, divisor_override=4),
                               F.adaptive_avg_pool2d(x, (3, 4)), F.adaptive_avg_pool2d(x, 1)), x,
                    ops=("max_pool2d", "max_pool2d_bwd", "avg_pool2d", "avg_pool2d_bwd", "adaptive_avg_pool2d",
                         "adaptive_avg_pool2d_bwd"), rtol=2e-5, atol=2e-6)


def test_conv_block_with_adamw():
    # no conv bias: before BN its gradient is exactly zero, and AdamW would amplify rounding noise to +-lr
    conv, bn = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
    check_vulkan_op(lambda x, c, b: F.adaptive_avg_pool2d(F.relu(b(c(x))), 1), r(2, 3, 6, 6), modules=(conv, bn),
                    optimizer=pe.AdamW(lr=1e-2, weight_decay=0.1), steps=3, ops=("conv2d", "adamw_update"),
                    rtol=2e-5, atol=2e-6)
