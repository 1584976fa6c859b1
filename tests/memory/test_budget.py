"""pe.compile(..., memory_budget_mb=N) (memory/budget.py, passes/recompute.py): the compiler
recomputes what the backward pass reads so the step's private memory fits N MiB, with the
same kernels on the same bits (budgeted steps bit-identical to unbudgeted ones); a budget
that cannot be met names the smallest reachable; prog.stats() counts private and mapped bytes."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.memory.budget import MIB

from models import GPT  # noqa: E402

# 3 layers, 32 tokens: the blocks' saved activations outweigh the logits (so recomputing pays)
B, T, V = 1, 32, 32


def _ids(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return LlamaForCausalLM(cfg).train(), (_ids(0),), (_ids(1),), "cross_entropy", "logits"


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=3, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(cfg).train(), (_ids(0),), (_ids(1),), "cross_entropy", "logits"


def gpt():
    """A GPT-2-style LM with nn.Linear projections (HF GPT-2's Conv1D takes no LoRA adapter)."""
    torch.manual_seed(0)
    return GPT(vocab=V, d=64, layers=3, heads=4, seq=T).train(), (_ids(0),), (_ids(1),), "cross_entropy", None

SCHEMES = {
    "full": dict(update="full"),
    # exact_skip=False: each update right after its gradient.  With the exact guard every
    # gradient of a full update is alive at once before the updates, and in a 3-layer, 32-token
    # Llama those gradients (not the activations) are the peak, so no recomputation lowers it
    "full-interleaved": dict(update="full", exact_skip=False),
    "sparse": dict(update={"*.layers.2.mlp.*": 0.5, "*.h.2.mlp.*.weight": 0.5, "*.layers.1.self_attn.o_proj.*": 1.0,
                           "*.h.1.attn.c_proj.*": 1.0}),
    "lora": dict(update="none", lora=pe.LoRA(rank=4, alpha=8, targets=["*.q_proj", "*.v_proj"])),
    "lora-gpt": dict(update="none", lora=pe.LoRA(rank=4, alpha=8, targets=["*.qkv", "blocks.*.fc2"])),
}


def _compile(family, scheme, budget=None):
    model, x, y, loss, output = family()
    kw = dict(SCHEMES[scheme])
    if scheme == "sparse":  # only the keys this family has
        names = [n for n, _ in model.named_parameters()]
        import fnmatch
        kw["update"] = {k: r for k, r in kw["update"].items() if fnmatch.filter(names, k)}
    return pe.compile(model, x, y, loss=loss, output=output, optimizer=pe.AdamW(lr=1e-2), memory_budget_mb=budget,
                      **kw), x, y


def _floor(family, scheme) -> float:
    with pytest.raises(pe.PockError, match="smallest reachable") as e:
        _compile(family, scheme, 1e-6)
    return float(re.search(r"smallest reachable private memory is ([0-9.]+) MiB", str(e.value)).group(1))


def _train(prog, x, y, steps=3):
    t = prog.build()
    losses = [t.step(x, y) for _ in range(steps)]
    return losses, t.state_dict()


@pytest.mark.parametrize("family,scheme", [
    (llama, "lora"), (gpt2, "full"),
    pytest.param(llama, "full-interleaved", marks=pytest.mark.slow), pytest.param(llama, "sparse", marks=pytest.mark.slow),
    pytest.param(gpt2, "sparse", marks=pytest.mark.slow), pytest.param(gpt, "lora-gpt", marks=pytest.mark.slow)],
    ids=["llama-lora", "gpt2-full", "llama-full", "llama-sparse", "gpt2-sparse", "gpt-lora"])
def test_budgeted_step_is_bit_identical_to_the_unbudgeted_one(family, scheme):
    base, x, y = _compile(family, scheme)
    floor = _floor(family, scheme)
    private = base.stats()["private_bytes"] / MIB
    assert floor < private
    budget = floor + 0.25 * (private - floor)  # between the floor and today's plan: some blocks recomputed
    prog, _, _ = _compile(family, scheme, budget)
    st = prog.stats()
    assert st["private_bytes"] <= budget * MIB and st["recompute_flops"] > 0
    assert base.stats()["recompute_flops"] == 0
    assert any(n.attrs.get("recompute") for n in prog.graph.nodes)
    l0, s0 = _train(base, x, y)
    l1, s1 = _train(prog, x, y)
    assert l0 == l1
    assert s0.keys() == s1.keys()
    for k in s0:
        assert np.array_equal(s0[k], s1[k]), k


def test_a_budget_that_cannot_be_met_names_the_smallest_reachable():
    floor = _floor(llama, "lora")
    prog, _, _ = _compile(llama, "lora", floor)  # the floor itself is reachable
    assert prog.stats()["private_bytes"] <= floor * MIB and prog.stats()["recompute_flops"] > 0
    with pytest.raises(pe.PockError, match="memory_budget_mb must be a positive"):
        _compile(llama, "lora", -1)


def test_a_budget_the_plan_already_meets_changes_nothing():
    base, _, _ = _compile(llama, "lora")
    prog, _, _ = _compile(llama, "lora", 1024)
    assert prog.stats()["recompute_flops"] == 0 and prog.hash == base.hash


def test_stats_split_private_and_mapped():
    prog, _, _ = _compile(llama, "lora")
    st = prog.stats()
    frozen = sum(v.nbytes for n, v in prog.state.items() if v.kind == "param" and "lora_" not in n)
    consts = sum(v.nbytes for v in prog.state.values() if v.kind == "const")
    assert st["mapped_bytes"] == frozen + consts
    assert st["private_bytes"] + st["mapped_bytes"] == st["arena_bytes"] + st["state_bytes"]
    assert st["recompute_flops"] == 0


def test_a_block_output_the_next_block_keeps_is_not_recomputed():
    """At the floor every block is recomputed from its input, which the next block's copies read
    (the original, kept until then): no block recomputes its down projection and residual add
    for that next block's norm backward, only the last block (whose output the final norm reads)."""
    prog, _, _ = _compile(llama, "lora", _floor(llama, "lora"))
    copied = {n.source.split(".mlp.")[0] for n in prog.graph.nodes
              if n.attrs.get("recompute") and n.op == "linear" and ".mlp.down_proj" in (n.source or "")}
    assert copied <= {"model.layers.2"}, copied
    assert any(n.attrs.get("recompute") and ".mlp.up_proj" in (n.source or "") for n in prog.graph.nodes)
