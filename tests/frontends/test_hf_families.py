"""Hugging Face families built from tiny configs (hf_zoo.py) train 3 steps like PyTorch:
judged against a PyTorch fp64 run of the same steps (numerics.py), frozen elements
bit-identical, under a full (AdamW) and a sparse (SGD) scheme."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import pockengine as pe  # noqa: E402
from hf_zoo import FAMILIES  # noqa: E402
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference  # noqa: E402
from pockengine.program import resolve_update  # noqa: E402

STEPS = 3
OPTIMIZERS = {"full": lambda: pe.AdamW(lr=1e-3, weight_decay=0.01),
              "sparse": lambda: pe.SGD(lr=0.05, momentum=0.9)}


def sparse_update(model) -> dict:
    """The last third of the parameters in full, plus the first half of the input channels
    of the first 2-D weight of the rest: a partial-channel update like bench/search picks."""
    named = [(n, p) for n, p in model.named_parameters()]
    cut = len(named) - max(1, len(named) // 3)
    update = {n: 1.0 for n, _ in named[cut:]}
    first = next((n for n, p in named[:cut] if p.dim() >= 2 and p.shape[1] > 1), None)
    if first:
        update[first] = 0.5
    return update


def _batches(x, y):
    """Three batches: the example, then the same with shifted ids / noise (same shapes)."""
    out = [(x, y)]
    for s in (1, 2):
        xs = tuple((t + s) % t.max().clamp(min=1) if not t.is_floating_point() else t + 0.1 * s for t in x)
        out.append((xs, tuple((t + s) % max(int(t.max()), 1) for t in y)))
    return out


def run_family(name, scheme):
    torch.manual_seed(0)
    model, x, y, loss, output = FAMILIES[name]()
    original = copy.deepcopy(model.state_dict())
    update = "full" if scheme == "full" else sparse_update(model)
    data = _batches(x, y)
    ref = fp64_reference(model, data, loss, update, OPTIMIZERS[scheme](), STEPS)
    prog = pe.compile(model, x, y, loss=loss, update=update, optimizer=OPTIMIZERS[scheme](), output=output)
    trainer = prog.build()
    losses = [trainer.step(*data[i]) for i in range(STEPS)]
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)
    return prog, trainer


@pytest.mark.parametrize("scheme", ["full", "sparse"])
@pytest.mark.parametrize("name", ["llama", "gpt2", "gpt2_eager", "bert", "qwen2", "mistral", "phi3", "gemma"])
def test_family_trains_like_pytorch(name, scheme):
    run_family(name, scheme)


def test_llama_step_has_no_mask_code():
    """The causal mask, position ids and rotary tables are folded to constants at compile time."""
    model, x, y, loss, output = FAMILIES["llama"]()
    prog = pe.compile(model, x, y, loss=loss, output=output)
    ops = {n.op for n in prog.graph.nodes}
    assert not ops & {"compare", "cast", "cos", "sin"}, ops
    assert any(v.kind == "const" for v in prog.graph.state.values())


def test_unsupported_op_names_op_and_module():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.special.erfcx(self.lin(x))

    with pytest.raises(pe.PockError, match=r"special_erfcx.*lin \(Linear\)"):
        pe.compile(Odd(), (torch.randn(2, 4),), (torch.randn(2, 4),), loss="mse")
