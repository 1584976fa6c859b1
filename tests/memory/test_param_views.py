"""A parameter viewed before use (bias.reshape(1, -1), .expand) is planned and trained like
any other tensor (it once reached the memory plan unplaced: a KeyError at render time)."""
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
from pockengine.compiler.program import resolve_update


class Viewed(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4) * 0.3)
        self.b = nn.Parameter(torch.randn(4) * 0.1)
        self.g = nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x):
        return (x @ self.w + self.b.reshape(1, -1)) * self.g.reshape(1, 4).expand(x.shape[0], 4)


@pytest.mark.parametrize("update", ["full", {"w": 1.0}, {"b": 1.0, "g": 1.0}])
def test_reshaped_parameter_trains_like_pytorch(update):
    torch.manual_seed(0)
    model = Viewed()
    g = torch.Generator().manual_seed(1)
    data = [((torch.randn(6, 8, generator=g),), (torch.randint(0, 4, (6,), generator=g),)) for _ in range(3)]
    opt = lambda: pe.SGD(lr=0.1, momentum=0.9)  # noqa: E731
    trainer = pe.compile(model, *data[0], update=update, optimizer=opt()).build()
    losses = [trainer.step(*data[i]) for i in range(3)]
    ref = fp64_reference(model, data, "cross_entropy", update, opt(), 3)
    assert_losses_close(losses, ref)
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
    assert_state_close_fp64(trainer.state_dict(), ref, {n: t.clone() for n, t in model.state_dict().items()},
                            trained)
    assert trainer.forward(data[0][0]).shape == (6, 4)
