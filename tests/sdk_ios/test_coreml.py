"""The frozen prefix as an ML Program: spec inputs/outputs and weights read back."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pockengine.platforms.coreml import export_mlpackage, mlpackage_io, mlpackage_weights


@pytest.mark.parametrize("fp16", [False, True])
def test_embedding_lookup(tmp_path, fp16):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    tokens = torch.randint(0, 50, (2, 5))
    path = export_mlpackage(emb, (tokens,), tmp_path / "emb.mlpackage", ["tokens"], ["emb"], fp16=fp16)
    io = mlpackage_io(path)
    assert io["kind"] == "mlProgram" and io["spec_version"] >= 6  # iOS 15's ML Program
    assert io["inputs"] == [{"name": "tokens", "shape": [2, 5], "dtype": "int32"}]
    assert io["outputs"] == [{"name": "emb", "shape": [2, 5, 8], "dtype": "float32"}]
    (table,) = mlpackage_weights(path).values()
    want = emb.weight.detach().numpy()
    if fp16:
        assert table.dtype == np.float16
        np.testing.assert_array_equal(table, want.astype(np.float16))  # exactly fp16 rounding
    else:
        assert table.dtype == np.float32
        np.testing.assert_array_equal(table, want)


class ConvBNReLU6(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pw = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.pw(F.relu6(self.bn(self.conv(x))))


def test_conv_bn_relu6_stack(tmp_path):
    torch.manual_seed(0)
    m = ConvBNReLU6()
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.5, 0.5)
    m.eval()
    x = torch.randn(1, 3, 6, 6)
    path = export_mlpackage(m, (x,), tmp_path / "stem.mlpackage", ["image"], ["features"])
    io = mlpackage_io(path)
    assert io["inputs"] == [{"name": "image", "shape": [1, 3, 6, 6], "dtype": "float32"}]
    assert io["outputs"] == [{"name": "features", "shape": [1, 4, 6, 6], "dtype": "float32"}]
    w = {k: v for k, v in mlpackage_weights(path).items() if v.dtype == np.float32}
    by_shape = {v.shape: v for v in w.values()}
    # Core ML folds BatchNorm(eval) into the conv: weight * gamma/sqrt(var+eps), beta - mean*scale
    scale = (m.bn.weight / torch.sqrt(m.bn.running_var + m.bn.eps)).detach()
    np.testing.assert_allclose(by_shape[(8, 3, 3, 3)], (m.conv.weight * scale[:, None, None, None]).detach().numpy(),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(by_shape[(8,)], (m.bn.bias - m.bn.running_mean * scale).detach().numpy(),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(by_shape[(4, 8, 1, 1)], m.pw.weight.detach().numpy())
    np.testing.assert_array_equal(by_shape[(4,)], m.pw.bias.detach().numpy())
    # the weights read back compute the module's function
    y = F.conv2d(F.relu6(F.conv2d(x, torch.from_numpy(by_shape[(8, 3, 3, 3)]), torch.from_numpy(by_shape[(8,)]),
                                  padding=1)), torch.from_numpy(by_shape[(4, 8, 1, 1)]), torch.from_numpy(by_shape[(4,)]))
    np.testing.assert_allclose(y.numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert m.training is False


def test_export_restores_train_mode_and_checks_names(tmp_path):
    m = ConvBNReLU6().train()
    x = torch.randn(1, 3, 4, 4)
    export_mlpackage(m, (x,), tmp_path / "a.mlpackage", ["image"], ["features"])
    assert m.training  # exported in eval mode, handed back as it came
    from pockengine.errors import PockError
    with pytest.raises(PockError, match="returns 1 outputs"):
        export_mlpackage(m, (x,), tmp_path / "b.mlpackage", ["image"], ["a", "b"])
