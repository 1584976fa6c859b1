"""The generated C++ of many configurations, pinned by sha256 digest (no C++ build: fast).

The golden models (test_golden.py) and tests/models.py's models × update schemes ×
optimizers × frozen_dtype × exact_skip × backends (cpu, vulkan) are compiled, their step's
source emitted and hashed together with prog.stats(); a compiler refactor must keep every
digest (a bug fix that changes generated code says so in its commit).  Regenerate with

    POCK_REGEN_DIGESTS=1 pytest tests/codegen/test_emit_digests.py

and explain the change in the commit."""
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import pockengine as pe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import MODELS, SPARSE, batches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_golden import tiny_gpt, tiny_mlp  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "emit_digests.json"


class DropBN(nn.Module):
    """Dropout and batch norm (train-mode behaviour the inference graph must drop)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8, 5)
        self.bn1 = nn.BatchNorm1d(5)

    def forward(self, x):
        h = self.drop(torch.relu(self.bn(self.conv(x))))
        return self.bn1(self.fc(h.mean((2, 3))))


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=1e4,
                      tie_word_embeddings=True, max_position_embeddings=16)
    return LlamaForCausalLM(cfg).float().train()


def _model(kind):
    torch.manual_seed(0)
    if kind == "dropbn":
        g = torch.Generator().manual_seed(0)
        return DropBN().train(), (torch.randn(4, 3, 6, 6, generator=g),), (torch.randint(0, 5, (4,), generator=g),)
    if kind == "llama":
        g = torch.Generator().manual_seed(0)
        return tiny_llama(), (torch.randint(0, 40, (1, 6), generator=g),), (torch.randint(0, 40, (1, 6), generator=g),)
    (x, y), = [batches(kind, n=1)[0]]
    return MODELS[kind](), x, y


SGDM = lambda: pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)  # noqa: E731
ADAMW = lambda: pe.AdamW(lr=1e-3)  # noqa: E731
SPARSE_EXTRA = {"dropbn": {"conv.weight": 0.5, "bn.*": 1.0, "fc.*": 1.0},
                "llama": {"model.layers.1.self_attn.*": 1.0, "model.layers.1.mlp.up_proj.*": 1.0,
                          "model.norm.weight": 1.0}}


def configurations():
    """{config id: (model kind, pe.compile keywords, backends)}."""
    out = {}
    for kind in ("mlp", "cnn", "gpt", "lstm", "dropbn"):
        sparse = SPARSE.get(kind) or SPARSE_EXTRA[kind]
        for uname, update in (("full", "full"), ("sparse", sparse)):
            for oname, opt in (("sgdm", SGDM), ("adamw", ADAMW)):
                out[f"{kind}-{uname}-{oname}"] = (kind, dict(update=update, optimizer=opt), ["cpu"])
    for kind, dtype in (("mlp", "int8"), ("gpt", "bf16"), ("cnn", "fp16"), ("dropbn", "int8")):
        out[f"{kind}-sparse-sgdm-{dtype}"] = (kind, dict(update=SPARSE.get(kind) or SPARSE_EXTRA[kind],
                                                        optimizer=SGDM, frozen_dtype=dtype), ["cpu"])
    for kind in ("mlp", "cnn", "gpt", "dropbn"):
        out[f"{kind}-sparse-adamw-noexact"] = (kind, dict(update=SPARSE.get(kind) or SPARSE_EXTRA[kind],
                                                          optimizer=ADAMW, exact_skip=False), ["cpu"])
    out["gpt-lora-adamw"] = ("gpt", dict(update="none", optimizer=ADAMW,
                                         lora=pe.LoRA(rank=2, alpha=4, targets=["*.qkv"])), ["cpu"])
    out["llama-sparse-adamw"] = ("llama", dict(update=SPARSE_EXTRA["llama"], optimizer=ADAMW, output="logits"),
                                 ["cpu"])
    out["llama-lora-adamw-bf16"] = ("llama", dict(update="none", optimizer=ADAMW, output="logits",
                                                  frozen_dtype="bf16",
                                                  lora=pe.LoRA(rank=2, alpha=4, targets=["*.q_proj", "*.v_proj"])),
                                    ["cpu"])
    for kind in ("mlp", "cnn", "gpt", "dropbn"):
        out[f"{kind}-sparse-sgdm-vulkan"] = (kind, dict(update=SPARSE.get(kind) or SPARSE_EXTRA[kind],
                                                        optimizer=SGDM), ["vulkan", "cpu"])
    out["mlp-full-adamw-vulkan"] = ("mlp", dict(update="full", optimizer=ADAMW), ["vulkan", "cpu"])
    return out


def digest(prog, backends) -> str:
    h = hashlib.sha256(prog.emit(backends).text.encode())
    h.update(json.dumps(prog.stats(), sort_keys=True, default=str).encode())
    return h.hexdigest()


def all_digests() -> dict:
    out = {"golden-tiny_mlp": digest(tiny_mlp(), ["cpu"]), "golden-tiny_gpt": digest(tiny_gpt(), ["cpu"])}
    for cid, (kind, kw, backends) in configurations().items():
        model, x, y = _model(kind)
        kw = dict(kw, optimizer=kw["optimizer"]())
        prog = pe.compile(model, x, y, name=cid.replace("-", "_"), **kw)
        out[cid] = digest(prog, backends)
    return out


def test_generated_code_digests_unchanged():
    got = all_digests()
    assert len(got) >= 32
    if os.environ.get("POCK_REGEN_DIGESTS"):
        FIXTURE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(FIXTURE.read_text())
    changed = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not changed, f"generated code (or stats) changed for {changed} (POCK_REGEN_DIGESTS=1 to accept)"
