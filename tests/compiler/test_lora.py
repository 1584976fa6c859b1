"""LoRA as an update scheme of the compiled step (pockengine/schemes/lora.py), judged
against a PyTorch LoRA reference written here (a torch wrapper module, PEFT's
maths) run in fp32 and fp64 (tests/numerics.py)."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from helpers import compiled_train
from models import GPT, MLP, batches
from numerics import assert_losses_close, assert_outputs_close, assert_state_close_fp64, fp64_reference


class RefLoRALinear(nn.Module):
    """The reference: PEFT's LoRA Linear (no dropout) written out in torch."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, g: torch.Generator):
        super().__init__()
        self.weight, self.bias = base.weight, base.bias
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5), generator=g)
        self.s = alpha / r

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + self.s * (x @ self.lora_A.T) @ self.lora_B.T


def ref_lora(model, targets, r, alpha, seed=0):
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n in targets]
    for n in names:
        parent, _, child = n.rpartition(".")
        p = model.get_submodule(parent) if parent else model
        setattr(p, child, RefLoRALinear(getattr(p, child), r, alpha, g))
    return model


ADAPTERS = {"*.lora_A": 1.0, "*.lora_B": 1.0}


@pytest.mark.parametrize("extra", [None, {"ln_f.*": 1.0, "blocks.1.fc1.weight": 0.5}])
def test_lora_gpt_matches_pytorch_lora_fp64_judged(extra):
    torch.manual_seed(0)
    model = GPT().train()
    data = batches("gpt")
    lora = pe.LoRA(rank=4, alpha=8, targets=["*.qkv", "blocks.*.fc2"])
    opt = lambda: pe.AdamW(lr=1e-2, weight_decay=0.01)  # noqa: E731
    update = "none" if extra is None else extra
    steps = 4
    inputs, targets = data[0]
    prog = pe.compile(model, inputs, targets, update=update, optimizer=opt(), lora=lora)
    trainer = prog.build()
    ref_model = ref_lora(model, {"blocks.0.qkv", "blocks.1.qkv", "blocks.0.fc2", "blocks.1.fc2"}, 4, 8)
    original = copy.deepcopy(ref_model).state_dict()
    # PEFT's init, same generator order: A equal, B zero, so the first forward is the base model's
    for name, value in original.items():
        if "lora_" in name:
            np.testing.assert_array_equal(trainer.get_tensor(name), value.numpy(), err_msg=name)
    ref_update = dict(ADAPTERS, **(extra or {}))
    ref = fp64_reference(ref_model, data, "cross_entropy", ref_update, opt(), steps)
    losses = [trainer.step(*data[i % len(data)]) for i in range(steps)]
    assert_losses_close(losses, ref)
    trained = {n: k for n, k in prog.trained.items()}
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)
    ref.model32.eval()
    ref.model64.eval()
    assert_outputs_close(trainer.forward(inputs), ref.model32, ref.model64, inputs, "forward")
    # the caller's model is untouched, and the model's own parameters are unchanged by compile
    assert not any("lora" in n for n, _ in model.named_parameters())


def test_lora_update_none_trains_only_adapters_and_frozen_weight_grads_are_dead():
    torch.manual_seed(0)
    model = GPT().train()
    inputs, targets = batches("gpt")[0]
    lora = pe.LoRA(rank=2, alpha=4, targets=["*.qkv"])
    prog = pe.compile(model, inputs, targets, update="none", optimizer=pe.AdamW(lr=1e-3), lora=lora)
    assert sorted(prog.trained) == ["blocks.0.qkv.lora_A", "blocks.0.qkv.lora_B",
                                    "blocks.1.qkv.lora_A", "blocks.1.qkv.lora_B"]
    wgrads = [n for n in prog.graph.nodes if n.op in ("linear_bwd_weight", "matmul_bwd_weight")]
    # only the adapters' two weight gradients per adapted layer survive; no base weight gradient
    assert len([n for n in prog.graph.nodes if n.op == "linear_bwd_weight"]) == 4, wgrads
    full = pe.compile(model, inputs, targets, update="full", optimizer=pe.AdamW(lr=1e-3)).stats()
    st = prog.stats()
    assert st["trainable_elements"] == 2 * (2 * 32 + 96 * 2)
    assert st["optimizer_state_bytes"] == 2 * 4 * st["trainable_elements"]
    assert st["flops_per_step"] < full["flops_per_step"]
    assert st["arena_bytes"] < full["arena_bytes"]


def test_merged_state_dict_loads_into_the_base_model_and_gives_the_same_outputs():
    torch.manual_seed(0)
    model = MLP().train()
    data = batches("mlp")
    lora = pe.LoRA(rank=3, alpha=6, targets=["net.0", "net.4"])
    _, trainer, prog = None, None, None
    prog = pe.compile(model, *data[0], update={"net.2.*": 1.0}, optimizer=pe.SGD(lr=0.1), lora=lora)
    trainer = prog.build()
    for i in range(3):
        trainer.step(*data[i])
    merged = trainer.merged_state_dict()
    assert set(merged) == set(model.state_dict())
    base = copy.deepcopy(model).eval()
    base.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in merged.items()})
    with torch.no_grad():
        want = base(*data[0][0]).numpy()
    np.testing.assert_allclose(trainer.forward(data[0][0]), want, rtol=1e-5, atol=1e-6)


def test_lora_bad_input_names_the_problem():
    model = MLP()
    x, y = batches("mlp")[0]
    with pytest.raises(pe.PockError, match="matches no nn.Linear"):
        pe.compile(model, x, y, update="none", lora=pe.LoRA(targets=["*.q_proj"]))
    with pytest.raises(pe.PockError, match="rank"):
        pe.LoRA(rank=0)
    with pytest.raises(pe.PockError, match="lora must be"):
        pe.compile(model, x, y, update="none", lora={"rank": 8})
