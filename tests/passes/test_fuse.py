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
    fused = [n for n in prog.order if n.attrs.get("act") and n.phase == "forward"]
    assert sorted(n.attrs["act"] for n in fused) == ["relu6", "relu6", "relu6"]
    assert all(n.op == "batch_norm_train" for n in fused)
    # and their backward through relu6 folded into batch_norm_train_bwd (the next test)
    assert [n.op for n in prog.order if n.attrs.get("act") and n.phase == "backward"] == ["batch_norm_train_bwd"] * 3
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


def test_batchnorm_backward_takes_the_activation_gradient_with_the_same_bits(monkeypatch):
    """relu_bwd / relu6's hardtanh_bwd feeding only a batch_norm_train_bwd is folded into it
    (pk::batch_norm_train_bwd_act masks dy as it reads it): no masked gradient is written, and
    the step gives the unfused step's bits, which match PyTorch."""
    import pockengine.compiler.program as program

    for act in (nn.ReLU, nn.ReLU6):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), act(), nn.Conv2d(8, 8, 1),
                          nn.BatchNorm2d(8), act(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
        g = torch.Generator().manual_seed(1)
        data = [((torch.randn(4, 3, 7, 7, generator=g) * 2,), (torch.randint(0, 5, (4,), generator=g),))
                for _ in range(3)]
        opt = pe.SGD(lr=0.2, momentum=0.9)
        prog = pe.compile(m, *data[0], optimizer=opt)
        name = "relu" if act is nn.ReLU else "relu6"
        assert [n.attrs.get("act") for n in prog.order if n.op == "batch_norm_train_bwd"] == [name, name]
        assert not [n for n in prog.order if n.op in ("relu_bwd", "hardtanh_bwd")]
        assert prog.source().count("pk::batch_norm_train_bwd_act(") == 2
        fused = prog.build()
        losses = [fused.step(*d) for d in data]
        with monkeypatch.context() as mp:
            mp.setattr(program, "fuse_activation_grads", lambda graph: graph)
            plain_prog = pe.compile(m, *data[0], optimizer=opt)
            assert len([n for n in plain_prog.order if n.op in ("relu_bwd", "hardtanh_bwd")]) == 2
            plain = plain_prog.build()
        assert [plain.step(*d) for d in data] == losses
        for k, v in plain.state_dict().items():
            np.testing.assert_array_equal(fused.state_dict()[k], v, err_msg=k)
        ref_losses, ref = reference_train(m, data, "cross_entropy", "full", opt, 3)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        for k, p in ref.named_parameters():
            np.testing.assert_allclose(fused.state_dict()[k], p.detach().numpy(), rtol=1e-4, atol=1e-5)
