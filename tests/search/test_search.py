"""pe.search_update: exact costs, exact contributions, budgets, seeds, errors, CLI and report."""
import os
import sys

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.ops import FULL
from pockengine.search import (Budget, SchemeCompiler, candidate_groups, last_layer_update,
                               measure_contributions, search, split_batches)
from models import MODELS, SPARSE, batches

MIB = 2 ** 20


def _model(name, seed=0):
    torch.manual_seed(seed)
    return MODELS[name]()


@pytest.fixture(scope="module")
def mlp_search():
    """One contribution analysis of the MLP, shared by the budget tests."""
    model = _model("mlp")
    data = batches("mlp", n=4)
    opt = pe.AdamW(lr=0.01)
    compiler = SchemeCompiler(model, *data[0], optimizer=opt)
    groups = candidate_groups(model)
    contrib = measure_contributions(compiler, groups, data, steps=6, progress=False)
    return model, data, opt, compiler, contrib


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_scheme_costs_equal_pe_compile(name):
    model = _model(name)
    x, y = batches(name)[0]
    opt = pe.SGD(lr=0.1, momentum=0.9)
    compiler = SchemeCompiler(model, x, y, optimizer=opt)
    for update in ("full", SPARSE[name], last_layer_update(compiler)):
        assert compiler.stats(update) == pe.compile(model, x, y, update=update, optimizer=opt).stats()


def test_candidates_and_last_layer():
    groups = {g.name: g for g in candidate_groups(_model("cnn"))}
    assert groups["stem.weight"].ratios == (0.125, 0.5, 1.0)  # 3 input channels: 1, 2 or 3 of them
    assert groups["project.weight"].ratios == (0.125, 0.25, 0.5, 1.0)
    assert groups["dw.weight"].ratios == (1.0,)  # depthwise: one input channel per group
    assert groups["bn3"].kind == "norm" and groups["bn3"].params == ("bn3.weight", "bn3.bias")
    assert groups["fc.bias"].kind == "bias"
    gpt = _model("gpt")
    names = [g.name for g in candidate_groups(gpt)]
    assert names.count("tok.weight") == 1  # tied: once as itself (the summed gradient) ...
    assert names.count("head.weight") == 1 and names[-1] == "head.weight"  # ... and as the head's use alone
    x, y = batches("gpt")[0]
    assert last_layer_update(SchemeCompiler(gpt, x, y)) == {"tok.weight": 1.0}


def test_contribution_is_the_options_own_sparse_step(mlp_search):
    """Masking the full-update step reproduces each option's own compiled step."""
    model, data, opt, compiler, contrib = mlp_search
    train, evalb = split_batches(data)
    assert len(train) == 3 and len(evalb) == 1
    groups = candidate_groups(model)
    for gname, option in (("net.2.weight", 3), ("net.4.bias", 1), ("net.0.weight", 1)):
        gi = [g.name for g in groups].index(gname)
        trainer = pe.compile(model, *data[0], update=groups[gi].update(option), optimizer=opt).build()
        for i in range(contrib.steps):
            trainer.step(*train[i % len(train)])
        trainer.learning_rate = 0.0
        after = np.mean([trainer.step(*b) for b in evalb])
        assert contrib.delta[(gi, option)] == pytest.approx(contrib.base_loss - after, rel=1e-4, abs=1e-6)
    assert contrib.full_delta > 0 and contrib.ms_per_flop > 0


@pytest.mark.parametrize("fraction", [0.95, 0.75, 0.55])
def test_search_respects_memory_budget(mlp_search, fraction):
    model, data, opt, compiler, contrib = mlp_search
    full = compiler.stats("full")
    budget = Budget(memory_mb=fraction * (full["arena_bytes"] + full["state_bytes"]) / MIB)
    result = search(model, data, optimizer=opt, budget=budget, seed=1, progress=False, compiler=compiler,
                    contributions=contrib)
    s = pe.compile(model, *data[0], update=result.update, optimizer=opt).stats()  # a real, independent compile
    assert s["arena_bytes"] + s["state_bytes"] <= budget.memory_mb * MIB
    assert s["arena_bytes"] + s["state_bytes"] == result.cost["memory_bytes"]
    assert result.update and result.predicted_delta > 0
    assert result.predicted_delta == pytest.approx(sum(contrib.delta[(gi, o)] for gi, o in enumerate(result.scheme)
                                                        if o))


def test_search_respects_flops_budget_and_finds_more_with_more_budget(mlp_search):
    model, data, opt, compiler, contrib = mlp_search
    full_flops = compiler.stats("full")["flops_per_step"]
    values = []
    for frac in (0.45, 0.7, 1.0):
        r = search(model, data, optimizer=opt, budget=Budget(flops=frac * full_flops), progress=False, refine=False,
                   compiler=compiler, contributions=contrib)
        assert pe.compile(model, *data[0], update=r.update, optimizer=opt).stats()["flops_per_step"] \
            <= frac * full_flops
        values.append(r.predicted_delta)  # the additive search alone (refine=False) is monotone
    assert values[0] <= values[1] <= values[2]


def test_search_is_reproducible_with_a_seed():
    model, data = _model("mlp"), batches("mlp", n=4)
    opt = pe.SGD(lr=0.2)
    full = pe.compile(model, *data[0], optimizer=opt).stats()
    budget = Budget(memory_mb=0.7 * (full["arena_bytes"] + full["state_bytes"]) / MIB)
    a = search(model, data, optimizer=opt, budget=budget, seed=3, steps=4, progress=False)
    b = search(model, data, optimizer=opt, budget=budget, seed=3, steps=4, progress=False)
    assert a.update == b.update and a.scheme == b.scheme
    assert a.contributions.delta == b.contributions.delta  # the compiled step is deterministic
    assert a.history == b.history


def test_budget_below_the_cheapest_scheme_is_a_clear_error():
    model, data = _model("mlp"), batches("mlp", n=2)
    with pytest.raises(pe.PockError, match=r"below the cheapest update scheme: updating only .* needs memory_bytes"):
        pe.search_update(model, data, optimizer=pe.SGD(lr=0.05), budget=pe.Budget(memory_mb=0.001), verbose=False)
    with pytest.raises(pe.PockError, match="below the cheapest"):
        pe.search_update(model, data, budget=pe.Budget(flops=1000), verbose=False)


def test_bad_arguments():
    with pytest.raises(pe.PockError, match="at least one"):
        pe.Budget()
    with pytest.raises(pe.PockError, match="positive"):
        pe.Budget(memory_mb=-1)
    model, data = _model("mlp"), batches("mlp", n=2)
    with pytest.raises(pe.PockError, match="budget must be"):
        pe.search_update(model, data, budget=8.0, verbose=False)
    with pytest.raises(pe.PockError, match="list of"):
        pe.search_update(model, [], budget=pe.Budget(memory_mb=8), verbose=False)
    other = ((torch.randn(4, 16),), (torch.randint(0, 5, (4,)),))
    with pytest.raises(pe.PockError, match="one shape"):
        pe.search_update(model, [data[0], other], budget=pe.Budget(memory_mb=8), verbose=False)


def test_search_update_contract_and_report(tmp_path, capsys):
    model, data = _model("cnn"), batches("cnn", n=2)
    update = pe.search_update(model, data, loss="cross_entropy", optimizer=pe.SGD(lr=0.05),
                              budget=pe.Budget(memory_mb=0.11), seed=0, steps=3, report=str(tmp_path / "r.md"))
    out = capsys.readouterr().out
    assert "searched scheme" in out and "full update" in out and "last layer" in out
    s = pe.compile(model, *data[0], update=update, optimizer=pe.SGD(lr=0.05)).stats()
    assert s["arena_bytes"] + s["state_bytes"] <= 0.11 * MIB
    md = (tmp_path / "r.md").read_text()
    assert "## Chosen scheme" in md and "| bn3 | norm |" in md
    for png in ("r_contrib.png", "r_cost.png", "r_sensitivity.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_search(tmp_path, capsys):
    spec = tmp_path / "spec.py"
    spec.write_text(f"""import sys, torch
sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
import pockengine as pe
from models import MLP, batches

def make():
    torch.manual_seed(0)
    data = batches("mlp", n=4)
    return dict(model=MLP(), example_inputs=data[0][0], example_targets=data[0][1],
                optimizer=pe.SGD(lr=0.1), sample_batches=data)
""")
    from pockengine.cli import main
    rc = main([f"{spec}:make", "--out", str(tmp_path / "out"), "--search", "--budget-mb", "0.012",
               "--report", str(tmp_path / "report.html")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "searched scheme for budget memory 0.012 MiB" in out
    page = (tmp_path / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "frozen" in summary or "| [:, :" in summary  # a sparse scheme, not the spec's default full update
    assert main([f"{spec}:make", "--out", str(tmp_path / "o2"), "--search", "--budget-mb", "0.0001"]) == 2
    assert "below the cheapest" in capsys.readouterr().err


def test_search_respects_step_time_budget(mlp_search):
    model, data, opt, compiler, contrib = mlp_search
    full_ms = compiler.stats("full")["flops_per_step"] * contrib.ms_per_flop  # measured speed x FLOPs
    r = search(model, data, optimizer=opt, budget=Budget(step_ms=0.6 * full_ms), progress=False,
               compiler=compiler, contributions=contrib)
    assert r.cost["step_ms"] <= 0.6 * full_ms
    assert r.cost["step_ms"] == pytest.approx(r.cost["flops_per_step"] * contrib.ms_per_flop)


def test_the_table_never_mixes_step_counts_in_one_column(mlp_search):
    """Loss drops measured over different numbers of steps (the contribution analysis' 6, the
    verification's 12) go in separate columns, each headed by its step count."""
    model, data, opt, compiler, contrib = mlp_search
    full = compiler.stats("full")
    budget = Budget(memory_mb=0.6 * (full["arena_bytes"] + full["state_bytes"]) / MIB)
    result = search(model, data, optimizer=opt, budget=budget, seed=1, progress=False, compiler=compiler,
                    contributions=contrib, verify_steps=12)
    header, _, *rows = result.table().splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "loss drop after 6 steps" in cols and "loss drop after 12 steps" in cols, header
    assert not any("(" in c for c in cols[6:]), header
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in rows}
    assert cells["full update"][cols.index("loss drop after 6 steps")] != ""
    assert cells["full update"][cols.index("loss drop after 12 steps")] == ""
    assert cells["searched"][cols.index("loss drop after 12 steps")] != ""
