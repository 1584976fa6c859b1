"""End-to-end: compiled training steps match PyTorch for four model families,
under full and sparse updates, SGD-momentum and AdamW. Judged against a PyTorch
fp64 run as PyTorch fp32 is (tests/numerics.py); SGD, whose maths is well
conditioned on these small models, is also held to rtol 1e-4 elementwise."""
import copy

import numpy as np
import pytest
import torch

import pockengine as pe
from helpers import assert_state_close, compiled_train
from models import MODELS, SPARSE, batches
from numerics import assert_losses_close, assert_outputs_close, assert_state_close_fp64, fp64_reference
from pockengine.compiler.program import resolve_update

OPTIMIZERS = {
    "sgd": lambda: pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
    # eps 1e-6, not the default 1e-8: an element whose gradient is ~1e-8 (a near-total cancellation)
    # gets an AdamW step g / (|g| + eps) that amplifies fp32 rounding noise in g (~1e-10 absolute) to
    # ~1e-3 of lr per step, so which fp32 implementation lands nearer fp64 there is luck (on an AVX2
    # machine PyTorch fp32 was 1.7e-11 off one such gradient and x86-64-v3 code 2.7e-10: 4.8e-6 vs a
    # budget of 2.5e-6 after 5 steps). At eps 1e-6 the step is well conditioned and the fp64 judgement fair.
    "adamw": lambda: pe.AdamW(lr=1e-3, weight_decay=0.01, eps=1e-6),
}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheme", ["full", "sparse"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_steps_match_pytorch(name, scheme, opt):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    original = copy.deepcopy(model).state_dict()
    data = batches(name)
    update = "full" if scheme == "full" else SPARSE[name]
    steps = 5
    ref = fp64_reference(model, data, "cross_entropy", update, OPTIMIZERS[opt](), steps)
    losses, trainer, prog = compiled_train(model, data, "cross_entropy", update, OPTIMIZERS[opt](), steps)
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)
    if opt == "sgd":
        np.testing.assert_allclose(losses, ref.losses32, rtol=1e-4, atol=1e-6)
        assert_state_close(trainer, ref.model32, original, trained)
    # inference with the trained weights matches the reference model in eval mode
    ref.model32.eval()
    ref.model64.eval()
    assert_outputs_close(trainer.forward(data[0][0]), ref.model32, ref.model64, data[0][0], "forward")

def test_sparse_scheme_saves_memory_and_reordering_saves_more():
    torch.manual_seed(0)
    data = batches("gpt")
    # operator reordering needs exact_skip=False (the exact non-finite guard runs updates last)
    full = pe.compile(MODELS["gpt"](), *data[0], update="full", optimizer=pe.SGD(lr=0.1), exact_skip=False).stats()
    sparse = pe.compile(MODELS["gpt"](), *data[0], update=SPARSE["gpt"], optimizer=pe.SGD(lr=0.1),
                        exact_skip=False).stats()
    assert sparse["arena_bytes"] < 0.8 * full["arena_bytes"]
    assert full["arena_bytes"] < full["arena_bytes_no_reorder"]
    assert sparse["arena_bytes"] <= sparse["arena_bytes_no_reorder"]
    assert sparse["trainable_elements"] < full["trainable_elements"]
    assert sparse["flops_per_step"] < full["flops_per_step"]


def test_frozen_parameters_stay_bit_identical_over_many_steps():
    torch.manual_seed(0)
    model = MODELS["cnn"]()
    data = batches("cnn")
    trainer = pe.compile(model, *data[0], update={"fc.weight": 0.5},
                         optimizer=pe.AdamW(lr=0.1, weight_decay=0.5)).build()
    before = trainer.state_dict()
    for i in range(20):
        trainer.step(*data[i % 3])
    after = trainer.state_dict()
    for name in before:
        if name == "fc.weight":
            assert np.array_equal(after[name][:, 4:], before[name][:, 4:])
            assert not np.array_equal(after[name][:, :4], before[name][:, :4])
        elif name.startswith("bn") and "running" in name or name.endswith("num_batches_tracked"):
            continue  # train-mode BatchNorm statistics do move, as in PyTorch
        else:
            assert np.array_equal(after[name], before[name]), name


def test_compile_leaves_each_module_in_its_own_mode():
    """Frozen BatchNorm layers kept in eval() stay in eval() after compiling."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2))
    model.train()
    model[1].eval()
    pe.compile(model, (torch.randn(2, 3, 8, 8),), (torch.tensor([0, 1]),), update={"3.*": 1.0})
    assert [m.training for m in model] == [True, False, True, True]


def test_the_unreordered_plan_is_made_only_when_asked_for(monkeypatch):
    """stats()' arena_bytes_no_reorder needs the step scheduled and planned in graph order: that
    schedule and plan are made when it is read, not by pe.compile or emit; with exact_skip (the
    step already runs in graph order) they are the step's own."""
    import pockengine.compiler.program as program
    calls = []
    real_schedule, real_plan = program.schedule, program.plan_memory
    monkeypatch.setattr(program, "schedule", lambda g, reorder=True: calls.append(("schedule", reorder))
                        or real_schedule(g, reorder=reorder))
    monkeypatch.setattr(program, "plan_memory", lambda *a, **k: calls.append(("plan",)) or real_plan(*a, **k))
    torch.manual_seed(0)
    x, y = batches("mlp")[0]
    prog = pe.compile(MODELS["mlp"](), x, y, exact_skip=False)
    assert ("schedule", False) not in calls
    made = len(calls)
    prog.source()
    assert len(calls) == made  # emitting the step does not ask for it
    stats = prog.stats()
    assert calls[made:] == [("schedule", False), ("plan",)]
    assert stats["arena_bytes"] <= stats["arena_bytes_no_reorder"]
    prog.stats()
    assert len(calls) == made + 2  # made once
    calls.clear()
    prog = pe.compile(MODELS["mlp"](), x, y)  # exact_skip=True: the step is scheduled in graph order once
    made = len(calls)
    prog.stats()
    assert len(calls) == made and prog.plan_no_reorder is prog.plan


def test_compile_spec_times_its_stages():
    """compile_spec(spec, timings=d) stores each stage's (wall s, CPU s) in d as the stage ends
    (what bench/compile_profile.py prints) and compiles the program pe.compile does."""
    from pockengine.compiler.program import CompileSpec, compile_spec
    torch.manual_seed(0)
    x, y = batches("mlp")[0]
    model = MODELS["mlp"]()
    spec = CompileSpec(model, x, y, name="timed", frozen_dtype="bf16", update=SPARSE["mlp"], memory_budget_mb=64)
    timings = {}
    prog = compile_spec(spec, timings=timings)
    assert list(timings) == ["check", "export", "lower", "lowp", "budget", "schedule", "plan", "Program"]
    assert all(len(t) == 2 and t[0] >= 0 and t[1] >= 0 for t in timings.values())
    assert prog.source() == pe.compile(model, x, y, name="timed", frozen_dtype="bf16", update=SPARSE["mlp"],
                                       memory_budget_mb=64).source()
    untimed = {}
    compile_spec(spec.replace(memory_budget_mb=None), timings=untimed)
    assert list(untimed) == ["check", "export", "lower", "lowp", "schedule", "plan", "Program"]  # no budget stage


def test_compile_spec_takes_the_lowering_passes():
    """compile_spec(spec, passes=...) lowers with that list of lowering_passes() (a bench
    leaving a fusion out, bench/rms_norm_fusion.py) instead of setting a module global."""
    from pockengine.compiler.program import CompileSpec, compile_spec, lowering_passes
    torch.manual_seed(0)
    x, y = batches("mlp")[0]
    spec = CompileSpec(MODELS["mlp"](), x, y, name="passes")
    fused = compile_spec(spec)
    unfused = compile_spec(spec, passes=[p for p in lowering_passes() if p[0] != "activation fusion"])
    ops = lambda prog: sorted(n.op for n in prog.forward_graph.nodes)  # noqa: E731
    assert ops(unfused) != ops(fused) and len(unfused.forward_graph.nodes) > len(fused.forward_graph.nodes)
    assert compile_spec(spec, passes=lowering_passes()).source() == fused.source() == pe.compile(
        spec.model, x, y, name="passes").source()
