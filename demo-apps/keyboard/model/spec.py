"""pock-build spec of the keyboard next-word model (the SDK tests and apps use it):

    pock-build demo-apps/keyboard/model/spec.py:make --platform android --soc sm8550

`make()` returns pe.compile's keyword arguments: the word-level LSTM LM of the
demo at its on-device shape (batch 4 x 16 words), AdamW, full update.
`make_sparse()` is the same model with the embedding frozen (its lookup is the
frozen prefix an NPU can run) and only the LSTM and output layer trained.
"""
import torch

import pockengine as pe
from pockengine.demo import KeyboardLM

VOCAB, BATCH, SEQ = 1500, 4, 16


def example_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, y


def make():
    torch.manual_seed(0)
    x, y = example_batch()
    return {"model": KeyboardLM(VOCAB), "example_inputs": (x,), "example_targets": (y,),
            "loss": "cross_entropy", "update": "full", "optimizer": pe.AdamW(lr=3e-3), "name": "keyboard"}


def make_sparse():
    spec = make()
    spec["update"] = {"lstm.*": 1.0, "out.*": 1.0}
    return spec
