"""A tiny 2-layer Llama (hf_zoo.llama: RoPE, GQA, RMSNorm, SwiGLU) fine-tuned with LoRA on
q_proj/v_proj over frozen weights in fp32, bf16, int8 and q4: the same steps as a PyTorch LoRA
reference (test_lora.ref_lora) holding the same rounded weights, judged against fp64."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import pockengine as pe  # noqa: E402
from hf_zoo import llama  # noqa: E402
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference  # noqa: E402
from pockengine.schemes.quant import round_trip  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))
from test_lora import ref_lora  # noqa: E402


@pytest.mark.parametrize("frozen_dtype", ["fp32", "bf16", "int8", "q4"])
def test_tiny_llama_lora_matches_pytorch_lora(frozen_dtype):
    torch.manual_seed(0)
    model, x, y, loss, output = llama()
    data = [(x, y), (((x[0] + 1) % 64,), ((y[0] + 3) % 64,))]
    lora = pe.LoRA(rank=4, alpha=8, targets=["*.q_proj", "*.v_proj"])
    opt = lambda: pe.AdamW(lr=1e-3, weight_decay=0.01)  # noqa: E731
    update = {"model.norm.weight": 1.0}
    prog = pe.compile(model, x, y, loss=loss, update=update, optimizer=opt(), output=output, lora=lora,
                      frozen_dtype=frozen_dtype)
    trainer = prog.build()
    targets = {n for n, m in model.named_modules() if n.endswith(("q_proj", "v_proj"))}
    ref_model = ref_lora(model, targets, 4, 8)
    lowp = {n for n, v in prog.state.items() if v.kind == "param" and v.dtype != "f32"}
    if frozen_dtype != "fp32":
        assert any(n.endswith("mlp.gate_proj.weight") for n in lowp) and "model.embed_tokens.weight" in lowp
    with torch.no_grad():
        for n, p in ref_model.named_parameters():
            if n in lowp:
                d = "int8" if prog.state[n].dtype == "i8" else frozen_dtype  # q4: embedding tables in int8
                p.copy_(torch.from_numpy(round_trip(p.detach().numpy(), d)))
    original = copy.deepcopy(ref_model.state_dict())
    ref_update = dict(update, **{"*.lora_A": 1.0, "*.lora_B": 1.0})
    steps = 3
    ref = fp64_reference(ref_model, data, loss, ref_update, opt(), steps)
    losses = [trainer.step(*data[i % len(data)]) for i in range(steps)]
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, dict(prog.trained))
    # only the adapters and the final norm train: two weight gradients per adapted Linear, no base one
    assert sum(n.op == "linear_bwd_weight" for n in prog.graph.nodes) == 2 * len(prog.lora_adapters) == 8
