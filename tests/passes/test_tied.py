"""passes/tied.py: a tied weight named by its alias trains through that module's use only."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pockengine as pe
from models import GPT, batches
from pockengine.passes.tied import split_tied_uses

ALIASES = {"head.weight": "tok.weight"}


def test_split_tied_uses():
    assert split_tied_uses({"head.weight": 0.5, "ln_f.*": 1}, ALIASES) == (
        {"tok.weight": 0.5, "ln_f.*": 1}, {"tok.weight": "head"})
    # named as itself too (exactly or by a glob): the summed gradient of every use, as in PyTorch
    assert split_tied_uses({"head.weight": 1, "tok.*": 1}, ALIASES)[1] == {}
    assert split_tied_uses({"head.weight": 1, "tok.weight": 0.25}, ALIASES) == ({"tok.weight": 0.25}, {})
    assert split_tied_uses("full", ALIASES) == ("full", {})


def _torch_head_only(model, data, lr, steps):
    """PyTorch: tok.weight and ln_f trained with the embedding lookup detached."""
    model = copy.deepcopy(model).train()
    model.tok.forward = lambda idx, emb=model.tok: F.embedding(idx, emb.weight.detach())
    for p in model.parameters():
        p.requires_grad_(False)
    params = [model.tok.weight, model.ln_f.weight, model.ln_f.bias]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    losses = []
    for i in range(steps):
        (x,), (y,) = data[i % len(data)]
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, model.head.out_features), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_head_use_only_trains_like_pytorch_and_drops_the_blocks_backward():
    torch.manual_seed(0)
    model = GPT().train()
    original = copy.deepcopy(model.state_dict())
    data = batches("gpt")
    update = {"head.weight": 1, "ln_f.*": 1}
    prog = pe.compile(model, *data[0], loss="cross_entropy", update=update, optimizer=pe.SGD(lr=0.5, momentum=0.9))
    backward = [n for n in prog.graph.nodes if n.phase == "backward"]
    assert backward and not [n for n in backward if n.source.startswith("blocks")]  # no backprop into the blocks
    full = pe.compile(model, *data[0], loss="cross_entropy", update={"tok.weight": 1, "ln_f.*": 1},
                      optimizer=pe.SGD(lr=0.5, momentum=0.9))
    assert prog.stats()["arena_bytes"] < full.stats()["arena_bytes"]
    ref_losses, ref = _torch_head_only(model, data, 0.5, 4)
    with prog.build() as trainer:
        losses = [trainer.step(*data[i % len(data)]) for i in range(4)]
        state = trainer.state_dict()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():
        if name.startswith(("tok.", "head.", "ln_f.")):
            np.testing.assert_allclose(state[name], value.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
        else:
            assert np.array_equal(state[name], original[name].numpy()), name  # frozen: bit-identical
    assert np.array_equal(state["head.weight"], state["tok.weight"])  # still one tensor


def test_an_alias_is_a_search_candidate_of_its_own():
    from pockengine.search import SchemeCompiler
    torch.manual_seed(0)
    model = GPT()
    compiler = SchemeCompiler(model, *batches("gpt")[0])
    head_only, both = compiler.stats({"head.weight": 1}), compiler.stats({"tok.weight": 1})
    assert head_only["flops_per_step"] < both["flops_per_step"]
    assert compiler.scheme_key({"head.weight": 1}) != compiler.scheme_key({"tok.weight": 1})


def test_bad_alias_use_is_a_pock_error():
    with pytest.raises(pe.PockError, match="two aliases"):
        split_tied_uses({"a.weight": 1, "b.weight": 1}, {"a.weight": "w", "b.weight": "w"})
