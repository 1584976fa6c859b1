"""compile(frozen_dtype=...): frozen weights stored in bf16/fp16/int8 and
dequantized inside the kernels (kernels/lowp.cpp). The reference is a torch
model holding the same rounded weights in fp32 (quant.round_trip), trained by
PyTorch and judged against fp64; the stored tensors really are smaller."""
import copy

import numpy as np
import pytest
import torch

import pockengine as pe
from models import GPT, batches
from numerics import assert_losses_close, assert_outputs_close, assert_state_close_fp64, fp64_reference
from pockengine.schemes.quant import dequantize, quantize, round_trip


STORED = {"bf16": "bf16", "f16": "fp16", "i8": "int8", "q4": "q4"}  # IR dtype -> frozen_dtype
BYTES = {"bf16": 2, "fp16": 2, "int8": 1, "q4": 0.5}


def rounded(model, names, frozen_dtype):
    """frozen_dtype: one for every name, or {name: the frozen_dtype it is stored in}."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in names:
                d = frozen_dtype[n] if isinstance(frozen_dtype, dict) else frozen_dtype
                p.copy_(torch.from_numpy(round_trip(p.detach().numpy(), d)))
    return model


def test_quantize_round_trips_match_torch():
    w = torch.randn(7, 33) * 3
    w[2] = 0
    np.testing.assert_array_equal(round_trip(w.numpy(), "bf16"), w.bfloat16().float().numpy())
    np.testing.assert_array_equal(round_trip(w.numpy(), "fp16"), w.half().float().numpy())
    q, s = quantize(w.numpy(), "i8")
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and s.shape == (7,)
    np.testing.assert_allclose(dequantize(q, "i8", s), w.numpy(), atol=float(s.max()) / 2 + 1e-7)


def test_q4_blocks_are_gguf_q4_1_style():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 64, generator=g).numpy()
    w[1, :32] = 0.5  # a constant block: d = 0, every value is m
    packed, dm = quantize(w, "q4")
    assert packed.dtype == np.uint8 and packed.shape == (5, 32) and dm.shape == (5, 2, 2)
    blocks = w.reshape(5, 2, 32)
    np.testing.assert_array_equal(dm[..., 1], blocks.min(axis=2))
    back = dequantize(packed, "q4", dm)
    assert np.all(np.abs(back - w) <= dm[..., :1].repeat(32, axis=2).reshape(5, 64) / 2 * 1.001 + 1e-6)
    np.testing.assert_array_equal(back[1, :32], 0.5)
    # GGUF's nibble order: byte j of a block holds element j (low) and j + 16 (high)
    q = np.rint((back[0, :32] - dm[0, 0, 1]) / dm[0, 0, 0]).astype(np.uint8)
    np.testing.assert_array_equal(packed[0, :16], q[:16] | (q[16:] << 4))
    # dequantized values quantize to themselves, to rounding (a GGUF Q4_1 model's weights stay what they were)
    np.testing.assert_allclose(round_trip(back, "q4"), back, rtol=0, atol=1e-6 * float(np.abs(w).max()))
    with pytest.raises(pe.PockError, match="multiple of 32"):
        quantize(np.zeros((3, 40), np.float32), "q4")


@pytest.mark.parametrize("frozen_dtype", ["bf16", "fp16", "int8", "q4"])
def test_lowp_frozen_weights_train_like_pytorch_on_rounded_weights(frozen_dtype):
    torch.manual_seed(0)
    model = GPT().train()
    data = batches("gpt")
    update = {"blocks.1.*": 1.0, "ln_f.*": 1.0}
    lora = pe.LoRA(rank=2, alpha=4, targets=["blocks.0.qkv"])
    opt = lambda: pe.AdamW(lr=1e-2, weight_decay=0.01)  # noqa: E731
    prog = pe.compile(model, *data[0], update=update, optimizer=opt(), lora=lora, frozen_dtype=frozen_dtype)
    base = pe.compile(model, *data[0], update=update, optimizer=opt(), lora=lora)
    lowp = {n for n, v in prog.state.items() if v.dtype != "f32" and v.kind == "param"}
    # the frozen linear/embedding weights (tok.weight is tied to the head) are stored low precision
    assert {"tok.weight", "blocks.0.qkv.weight", "blocks.0.fc1.weight", "blocks.0.fc2.weight"} <= lowp
    assert not any(n.startswith("blocks.1.") or "lora" in n for n in lowp)
    stored = {n: STORED[prog.state[n].dtype] for n in lowp}
    # q4 keeps the embedding table (tied to the head) in int8, as GGUF Q4_1 models keep token_embd in Q8_0
    assert stored["tok.weight"] == ("int8" if frozen_dtype == "q4" else frozen_dtype)
    assert stored["blocks.0.fc1.weight"] == frozen_dtype
    saved = sum(base.state[n].nbytes - prog.state[n].nbytes for n in lowp)
    assert saved == sum(base.state[n].numel * (4 - BYTES[stored[n]]) for n in lowp)
    s, b = prog.stats(), base.stats()
    assert s["param_bytes"] == b["param_bytes"] - saved
    assert s["optimizer_state_bytes"] == b["optimizer_state_bytes"]

    trainer = prog.build()
    ref_model = rounded(base.lora_model, lowp, stored)
    original = copy.deepcopy(ref_model).state_dict()
    steps = 3
    ref_update = dict(update, **{"*.lora_A": 1.0, "*.lora_B": 1.0})
    ref = fp64_reference(ref_model, data, "cross_entropy", ref_update, opt(), steps)
    losses = [trainer.step(*data[i % len(data)]) for i in range(steps)]
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, dict(prog.trained))
    ref.model32.eval()
    ref.model64.eval()
    assert_outputs_close(trainer.forward(data[0][0]), ref.model32, ref.model64, data[0][0], "forward")


def test_bad_frozen_dtype():
    x, y = batches("gpt")[0]
    with pytest.raises(pe.PockError, match="frozen_dtype"):
        pe.compile(GPT(), x, y, frozen_dtype="int4")


def test_summary_names_the_frozen_dtype_and_the_models_shapes():
    """summary.md of a q4 build says how frozen weights are stored and shows each weight's shape as
    the model has it, not the packed storage's [N, K / 2]."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    x, y = torch.randn(2, 64), torch.randint(0, 4, (2,))
    text = pe.compile(model, (x,), (y,), update={"2.*": 1.0}, frozen_dtype="q4").summary()
    assert "| frozen_dtype | q4: 1 tensor, 3072 B (16384 B as fp32) |" in text
    assert "| 0.weight | [64, 64] | frozen (q4) | 0 | - |" in text
    assert "| 0.bias | [64] | frozen | 0 | - |" in text
    plain = pe.compile(model, (x,), (y,), update={"2.*": 1.0}).summary()
    assert "| frozen_dtype | fp32 |" in plain and "| 0.weight | [64, 64] | frozen | 0 | - |" in plain
