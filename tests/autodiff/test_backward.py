"""autodiff/backward.py: the gradient of a tied weight, summed over its uses (sum_grads)."""
from __future__ import annotations

import copy

import pytest
import torch

import pockengine as pe
from models import GPT, batches
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
from pockengine.autodiff import backward
from pockengine.ops import FULL


def _compile(model, data, update):
    return pe.compile(model, *data[0], loss="cross_entropy", update=update, optimizer=pe.SGD(lr=0.5, momentum=0.9))


@pytest.mark.parametrize("update", ["full", {"tok.weight": 0.5, "ln_f.*": 1}])
def test_tied_embedding_rows_are_summed_onto_the_head_gradient(update, monkeypatch):
    torch.manual_seed(0)
    model = GPT(vocab=500).train()  # a table large enough to set the arena's peak (the ids stay < 64)
    original = copy.deepcopy(model.state_dict())
    data = batches("gpt")
    data[0][0][0][0, :4] = 7  # a repeated token: several rows summed onto one
    prog = _compile(model, data, update)
    tables = [n for n in prog.graph.nodes if n.op == "embedding_bwd"]
    assert len(tables) == 1 and len(tables[0].inputs) == 3  # dy, ids, the head's gradient
    assert tables[0].inputs[2].producer.op in ("linear_bwd_weight", "slice")
    assert not [n for n in prog.graph.nodes if n.op == "add" and n.out.shape == tables[0].out.shape]

    # the same step with the dense sum (a zero-filled table gradient, then an add) needs more arena
    monkeypatch.setattr(backward, "sum_grads", lambda b, old, new: b.add("add", [old, new]))
    dense = _compile(model, data, update)
    assert [n for n in dense.graph.nodes if n.op == "add" and n.out.shape == tables[0].out.shape]
    assert prog.stats()["arena_bytes"] < dense.stats()["arena_bytes"]

    ref = fp64_reference(model, data, "cross_entropy", update, pe.SGD(lr=0.5, momentum=0.9), 3)
    with prog.build() as trainer:
        losses = [trainer.step(*data[i]) for i in range(3)]
        state = trainer.state_dict()
    assert_losses_close(losses, ref)
    k = 16 if isinstance(update, dict) else FULL
    trained = {n: FULL for n, _ in model.named_parameters()} if k is FULL else {"tok.weight": k, "ln_f.weight": FULL,
                                                                                "ln_f.bias": FULL}
    assert_state_close_fp64(state, ref, original, trained, names=[n for n in original if n != "head.weight"])
