"""passes/inference.py: one torch.export per compile, the inference graph derived from the
training-mode graph (dropout as identity, batch norm over its running statistics)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.passes import inference
from pockengine.passes.inference import reads_training

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from models import MODELS  # noqa: E402
from test_emit_digests import DropBN, tiny_llama  # noqa: E402


class Noisy(nn.Module):
    """Branches on self.training other than for dropout: needs its own eval-mode export."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x) * (2.0 if self.training else 1.0)


def _data():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 3, 6, 6, generator=g),), (torch.randint(0, 5, (4,), generator=g),)


@pytest.fixture
def count_exports(monkeypatch):
    calls = []
    real = torch.export.export

    def counting(*a, **k):
        calls.append(type(a[0]).__name__)
        return real(*a, **k)
    monkeypatch.setattr(torch.export, "export", counting)
    return calls


def test_one_export_for_dropout_and_batch_norm(count_exports):
    torch.manual_seed(0)
    x, y = _data()
    prog = pe.compile(DropBN().train(), x, y, optimizer=pe.SGD(lr=0.1))
    assert len(count_exports) == 1
    ops = [n.op for n in prog.forward_graph.nodes]
    assert "dropout" not in ops and "batch_norm_train" not in ops and "assign" not in ops
    assert ops.count("batch_norm_eval") == 2
    assert any(n.op == "batch_norm_train" for n in prog.graph.nodes)  # the step keeps batch statistics


def test_same_program_as_two_exports(monkeypatch, count_exports):
    """The derived inference graph is the eval-mode export's: the same generated code (hence the
    same trainer.forward/step results) as exporting twice."""
    torch.manual_seed(0)
    x, y = _data()
    model = DropBN().train()
    one = pe.compile(model, x, y, update={"conv.weight": 0.5, "bn.*": 1.0}, optimizer=pe.AdamW(lr=1e-3))
    monkeypatch.setattr(inference, "reads_training", lambda m: ["forced"])
    two = pe.compile(model, x, y, update={"conv.weight": 0.5, "bn.*": 1.0}, optimizer=pe.AdamW(lr=1e-3))
    assert len(count_exports) == 3
    assert one.source() == two.source() and one.stats() == two.stats()
    assert all(m.training for m in model.modules())  # modes untouched


def test_trainer_forward_is_eval_mode_and_step_trains_batch_norm(count_exports):
    torch.manual_seed(0)
    x, y = _data()
    model = DropBN().train()
    with torch.no_grad():  # non-trivial running statistics
        model.bn.running_mean.uniform_(-0.5, 0.5), model.bn.running_var.uniform_(0.5, 2.0)
    prog = pe.compile(model, x, y, optimizer=pe.SGD(lr=0.0))
    assert len(count_exports) == 1
    trainer = prog.build()
    out = trainer.forward((x[0].numpy(),))
    want = model.eval()(x[0]).detach().numpy()
    model.train()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    rm = trainer.state_dict()["bn.running_mean"].copy()
    trainer.step((x[0].numpy(),), (y[0].numpy(),))
    assert not np.array_equal(trainer.state_dict()["bn.running_mean"], rm)  # train-mode BN updates its stats


def test_a_module_reading_training_is_exported_twice(count_exports):
    torch.manual_seed(0)
    model = Noisy().train()
    assert reads_training(model)[0] == "Noisy: return self.fc(x) * (2.0 if self.training else 1.0)"
    x, y = torch.randn(2, 6), torch.randn(2, 3)
    prog = pe.compile(model, x, y, loss="mse")
    assert len(count_exports) == 2
    assert not any(n.op == "mul" and n.source.startswith("fc") for n in prog.forward_graph.nodes)


@pytest.mark.parametrize("make", [lambda: MODELS["lstm"](), lambda: MODELS["cnn"](), lambda: MODELS["gpt"](),
                                  tiny_llama, lambda: nn.GRU(3, 4, num_layers=2, dropout=0.1)],
                         ids=["lstm", "cnn", "gpt", "llama", "gru"])
def test_known_train_eval_behaviour_needs_one_export(make):
    assert reads_training(make()) == []


@pytest.mark.parametrize("make", [lambda: nn.TransformerEncoderLayer(8, 2),
                                  lambda: nn.InstanceNorm2d(3, track_running_stats=True)],
                         ids=["transformer-layer", "instance-norm"])
def test_other_torch_modules_reading_training_export_twice(make):
    assert reads_training(make())
