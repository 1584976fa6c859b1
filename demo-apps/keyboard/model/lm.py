"""The keyboard's base next-word model: KeyboardLM (embedding -> LSTM -> output
projection) at its shipped size, and its pretrained weights.

VOCAB 10,000 words (4 specials: <pad> <unk> <s> <num>), embedding 96, LSTM hidden 128:
2.37M parameters. base_weights.npz holds them in fp16 (model/pretrain.py writes it).
On the phone the compiled trainer runs batches of BATCH x SEQ words.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

HERE = Path(__file__).resolve().parent
WEIGHTS = HERE / "base_weights.npz"
META = HERE / "base_weights.json"
VOCAB, EMB, HIDDEN = 10_000, 96, 128
BATCH, SEQ = 8, 16


class KeyboardLM(nn.Module):
    """Word-level next-word model: embedding -> LSTM -> output projection."""

    def __init__(self, vocab: int, emb: int = 64, hidden: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.out(h)


def new_model(seed: int = 0) -> KeyboardLM:
    torch.manual_seed(seed)
    return KeyboardLM(VOCAB, emb=EMB, hidden=HIDDEN)


def load_base() -> KeyboardLM:
    """The pretrained base model (fp32 copy of the shipped fp16 weights)."""
    if not WEIGHTS.exists():
        raise FileNotFoundError(f"{WEIGHTS} is missing: run .venv/bin/python demo-apps/keyboard/model/pretrain.py")
    model = new_model()
    with np.load(WEIGHTS) as z:
        model.load_state_dict({k: torch.from_numpy(z[k].astype(np.float32)) for k in z.files})
    return model


def save_base(model: KeyboardLM, meta: dict) -> None:
    tmp = WEIGHTS.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **{k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()})
    tmp.replace(WEIGHTS)
    META.write_text(json.dumps(meta, indent=1) + "\n")


def base_meta() -> dict:
    return json.loads(META.read_text()) if META.exists() else {}


# The sparse scheme the app ships: embedding frozen (its lookup stays a frozen prefix),
# LSTM and output bias fully trained, the output projection on its first half of input
# channels. pe.search_update(model, batches, budget=pe.Budget(memory_mb=...)) chooses
# such a scheme for a memory budget; sim.simulate(schemes={"searched": update}) and
# model/spec.py:make_base(update=...) take its result in place of this one.
SPARSE_UPDATE = {"lstm.*": 1.0, "out.bias": 1.0, "out.weight": 0.5}
