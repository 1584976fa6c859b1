"""Activation fusion: BN/conv/linear + ReLU(6) become one kernel call, and the
step still matches PyTorch."""
import numpy as np
import torch
import torch.nn as nn

import pockengine as pe
from helpers import reference_train
from models import MODELS, batches


def test_cnn_batchnorm_relu6_is_fused_and_the_preactivation_never_exists():
    torch.manual_seed(0)
    data = batches("cnn")
    prog = pe.compile(MODELS["cnn"](), *data[0], optimizer=pe.SGD(lr=0.1))
    fused = [n for n in prog.order if n.attrs.get("act")]
    assert sorted(n.attrs["act"] for n in fused) == ["relu6", "relu6", "relu6"]
    assert all(n.op == "batch_norm_train" for n in fused)
    assert not [n for n in prog.order if n.op == "hardtanh"]
    assert "pk::batch_norm_train_fwd_act(" in prog.source() and "pk::Act::Relu6" in prog.source()
    # inference graph too (eval-mode BatchNorm)
    assert [n.op for n in prog.forward_order if n.attrs.get("act")] == ["batch_norm_eval"] * 3


def test_linear_relu_fused_unless_the_preactivation_is_used_elsewhere():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.relu(self.a(x))          # fusable
            z = self.b(h)
            return self.c(torch.relu(z) + z)   # z is read twice: not fusable

    torch.manual_seed(0)
    m = M()
    data = [((torch.randn(5, 6),), (torch.randint(0, 3, (5,)),))]
    prog = pe.compile(m, *data[0], optimizer=pe.SGD(lr=0.1, momentum=0.9))
    assert [(n.source.split()[0], n.attrs.get("act")) for n in prog.order if n.op == "linear"] == \
        [("a", "relu"), ("b", None), ("c", None)]
    trainer = prog.build()
    losses = [trainer.step(*data[0]) for _ in range(3)]
    ref_losses, ref = reference_train(m, data, "cross_entropy", "full", pe.SGD(lr=0.1, momentum=0.9), 3)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.state_dict()[name], p.detach().numpy(), rtol=1e-4, atol=1e-6)
