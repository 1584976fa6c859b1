"""Variable-length text in a fixed-shape step: right-padded batches whose pad
targets are ignore_index (-100) train exactly like PyTorch's
F.cross_entropy(ignore_index=-100) (mean over the real tokens), fp64-judged."""
import copy

import numpy as np
import torch

from helpers import compiled_train
from models import GPT
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
import pockengine as pe
from pockengine.compiler.program import resolve_update


def padded_batches(n=3, seed=0, pad_id=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(1, 64, (2, 8), generator=g)
        y = torch.randint(1, 64, (2, 8), generator=g)
        lengths = torch.randint(3, 9, (2,), generator=g)
        for row, length in enumerate(lengths.tolist()):
            x[row, length:] = pad_id
            y[row, length:] = -100  # causal attention: real tokens never see the right padding
        out.append(((x,), (y,)))
    return out


def test_padded_batches_match_pytorch_ignore_index():
    torch.manual_seed(0)
    model = GPT().train()
    original = copy.deepcopy(model).state_dict()
    data = padded_batches()
    opt = lambda: pe.AdamW(lr=1e-3, weight_decay=0.01)  # noqa: E731
    ref = fp64_reference(model, data, "cross_entropy", "full", opt(), 4)
    losses, trainer, _ = compiled_train(model, data, "cross_entropy", "full", opt(), 4)
    assert_losses_close(losses, ref)
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, "full")
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)
    # an all-padding batch: no NaN, no update (PyTorch would give NaN)
    before = trainer.state_dict()
    x, y = data[0][0][0], torch.full((2, 8), -100)
    assert trainer.step((x,), (y,)) == 0.0
    after = trainer.state_dict()
    assert all(np.isfinite(v).all() for v in after.values())
