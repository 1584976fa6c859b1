"""pe.search_update with memory_budget_mb among the compile keywords counts Budget(memory_mb) as
prog.stats()["private_bytes"] of the program pe.compile builds with them (the recompute plan,
frozen weights mapped: memory/budget.py), the way pe.compile's budget does; a scheme whose step
cannot meet that budget costs the smallest private memory the compiler names."""
import re

import pytest
import torch

import pockengine as pe
from pockengine.search import SchemeCompiler, cost_of, search

MIB = 2 ** 20
V, T = 32, 32


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return LlamaForCausalLM(cfg).train()


def data(n=2):
    g = torch.Generator().manual_seed(0)
    return [((torch.randint(0, V, (1, T), generator=g),), (torch.randint(0, V, (1, T), generator=g),))
            for _ in range(n)]


KW = dict(loss="cross_entropy", output="logits", exact_skip=False)
UPDATE = {"model.layers.2.mlp.*": 1.0, "model.layers.1.self_attn.o_proj.weight": 1.0}


def _floor(model, batch, update) -> float:
    with pytest.raises(pe.PockError, match="smallest reachable") as e:
        pe.compile(model, *batch, update=update, optimizer=pe.SGD(lr=0.05), memory_budget_mb=1e-6, **KW)
    return float(re.search(r"smallest reachable private memory is ([0-9.]+) MiB", str(e.value)).group(1))


def test_scheme_costs_count_the_private_memory_of_the_budgeted_program():
    model, batches = llama(), data()
    plain = pe.compile(model, *batches[0], update=UPDATE, optimizer=pe.SGD(lr=0.05), **KW).stats()
    floor = _floor(model, batches[0], UPDATE)
    budget = (floor + plain["private_bytes"] / MIB) / 2  # some recomputation needed
    compiler = SchemeCompiler(model, *batches[0], optimizer=pe.SGD(lr=0.05), memory_budget_mb=budget, **KW)
    assert compiler.counts_private
    want = pe.compile(model, *batches[0], update=UPDATE, optimizer=pe.SGD(lr=0.05), memory_budget_mb=budget,
                      **KW).stats()
    got = compiler.stats(UPDATE)
    assert got == want and want["recompute_flops"] > 0
    assert cost_of(got, private=True)["memory_bytes"] == want["private_bytes"] <= budget * MIB
    assert cost_of(got)["memory_bytes"] == want["arena_bytes"] + want["state_bytes"]  # without: as before
    # the full update cannot meet this budget: it costs the floor the compiler names
    full_floor = _floor(model, batches[0], "full")
    assert full_floor > budget
    assert compiler.stats("full")["private_bytes"] == pytest.approx(full_floor * MIB, abs=1)
    prog = compiler.program("full")  # the unbudgeted program, nothing set on it: the compiler counts the floor
    assert compiler.program_stats(prog)["private_bytes"] == compiler.stats("full")["private_bytes"]
    assert prog.stats()["private_bytes"] >= compiler.stats("full")["private_bytes"]


@pytest.mark.slow  # a whole search (contributions, greedy): about a minute
def test_search_update_fits_the_private_budget_in_pe_compiles_program():
    model, batches = llama(), data()
    full = pe.compile(model, *batches[0], optimizer=pe.SGD(lr=0.05), **KW).stats()
    mb = 0.9 * full["private_bytes"] / MIB
    result = search(model, batches, optimizer=pe.SGD(lr=0.05), budget=pe.Budget(memory_mb=mb), steps=2,
                    progress=False, refine=False, cache=False, memory_budget_mb=mb,
                    candidates=["model.layers.2.*", "model.norm.*"], **KW)
    prog = pe.compile(model, *batches[0], update=result.update, optimizer=pe.SGD(lr=0.05), memory_budget_mb=mb, **KW)
    st = prog.stats()
    assert result.update and result.cost["memory_bytes"] == st["private_bytes"] <= mb * MIB
