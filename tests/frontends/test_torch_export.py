"""frontends/torch_export.py: what a user sees when torch.export cannot trace their model."""
import pytest
import torch
import torch.nn as nn

import pockengine as pe


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent: the branch depends on the values, not the shapes
            return h * 2
        return h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(4, 4), Gate())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def test_a_data_dependent_branch_is_one_pock_error_naming_the_module_and_line(capfd):
    x, y = torch.randn(2, 4), torch.randint(0, 3, (2,))
    with pytest.raises(pe.PockError) as err:
        pe.compile(Net(), (x,), (y,))
    msg = str(err.value)
    assert "data-dependent control flow" in msg and "module 'blocks.1' (Gate.forward" in msg, msg
    assert f"test_torch_export.py:{Gate.forward.__code__.co_firstlineno + 2}" in msg, msg
    assert "`if h.sum() > 0:" in msg and "torch.where" in msg
    out, errout = capfd.readouterr()
    assert "def forward(self" not in out + errout  # torch's graph dump (about 40 lines, twice) is held back
    assert len((out + errout).splitlines()) <= 2, out + errout
