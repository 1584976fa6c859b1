"""pock-build specs of SmolLM2-135M personalization (LoRA r=8 on q_proj/v_proj, the
demo's phone scheme), one per frozen_dtype, for the package sizes in bench/llm_results.md:

    pock-build bench/smollm2_spec.py:bf16 --platform android --cxx aarch64-linux-gnu-g++
    pock-build bench/smollm2_spec.py:int8 --platform ios

SMOLLM2_SEQ (default 128) sets the fixed sequence length of the step.
"""
import os

import torch

import pockengine as pe


def _spec(frozen_dtype: str) -> dict:
    from pockengine.demo_llm import Logits, load_smollm2
    _, model = load_smollm2()
    seq = int(os.environ.get("SMOLLM2_SEQ", "128"))
    x = torch.zeros(1, seq, dtype=torch.int64)
    return dict(model=Logits(model), example_inputs=(x,), example_targets=(x.clone(),), update="none",
                lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]), optimizer=pe.AdamW(lr=1e-4),
                frozen_dtype=frozen_dtype, name=f"smollm2_{frozen_dtype}")


def fp32():
    return _spec("fp32")


def bf16():
    return _spec("bf16")


def fp16():
    return _spec("fp16")


def int8():
    return _spec("int8")


def q4():
    return _spec("q4")
