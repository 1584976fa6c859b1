"""The scheme search takes every pe.compile keyword and costs each scheme as the program
pe.compile builds with them (program.compile_spec: one compile path)."""
import pytest
import torch

import pockengine as pe
from pockengine.compiler.program import CompileSpec, compile_spec
from pockengine.search import SchemeCompiler
from models import GPT, MODELS, SPARSE, batches

MIB = 2 ** 20


def _mib(stats):
    return (stats["arena_bytes"] + stats["state_bytes"]) / MIB


@pytest.mark.parametrize("kw", [dict(frozen_dtype="int8"), dict(frozen_dtype="bf16", exact_skip=False),
                                dict(exact_skip=False, name="mlp_named")], ids=["int8", "bf16-noexact", "noexact-name"])
def test_scheme_costs_equal_pe_compile_with_every_keyword(kw):
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x, y = batches("mlp")[0]
    opt = pe.SGD(lr=0.1, momentum=0.9)
    compiler = SchemeCompiler(model, x, y, optimizer=opt, **kw)
    for update in ("full", SPARSE["mlp"], {"net.4.weight": 0.5}):
        assert compiler.stats(update) == pe.compile(model, x, y, update=update, optimizer=opt, **kw).stats()
    assert len(compiler._exports) == 1  # exported once for every scheme


def test_lora_and_keyword_inputs_in_the_search_compiler():
    torch.manual_seed(0)
    model = GPT(vocab=16, d=8, layers=1, heads=2, seq=4)
    x, y = torch.randint(0, 16, (1, 4)), torch.randint(0, 16, (1, 4))
    kw = dict(lora=pe.LoRA(rank=2, alpha=4, targets=["*.qkv"]), frozen_dtype="int8")
    compiler = SchemeCompiler(model, {"idx": x}, (y,), optimizer=pe.AdamW(lr=1e-3), **kw)
    for update in ("none", {"ln_f.*": 1.0}):
        want = pe.compile(model, {"idx": x}, (y,), update=update, optimizer=pe.AdamW(lr=1e-3), **kw)
        assert compiler.stats(update) == want.stats()
        assert compiler.program(update).source() == want.source()


def test_search_update_with_frozen_int8_fits_the_budget_in_pe_compiles_program():
    torch.manual_seed(0)
    model, data = MODELS["mlp"](), batches("mlp", n=2)
    kw = dict(frozen_dtype="int8", exact_skip=False, name="searched_int8")
    full = pe.compile(model, *data[0], optimizer=pe.SGD(lr=0.05), **kw).stats()
    budget = 0.6 * _mib(full)
    update = pe.search_update(model, data, loss="cross_entropy", optimizer=pe.SGD(lr=0.05),
                              budget=pe.Budget(memory_mb=budget), seed=0, steps=2, verify_steps=2, verbose=False,
                              refine=False, **kw)
    prog = pe.compile(model, *data[0], update=update, optimizer=pe.SGD(lr=0.05), **kw)
    assert 0 < prog.stats()["trainable_elements"] and _mib(prog.stats()) <= budget


def test_compile_spec_is_what_pe_compile_runs():
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x, y = batches("mlp")[0]
    spec = CompileSpec(model, x, y, update=SPARSE["mlp"], optimizer=pe.SGD(lr=0.1), frozen_dtype="bf16")
    assert compile_spec(spec).source() == pe.compile(model, x, y, update=SPARSE["mlp"], optimizer=pe.SGD(lr=0.1),
                                                     frozen_dtype="bf16").source()
    with pytest.raises(AttributeError):
        spec.update = "full"  # frozen
    with pytest.raises(pe.PockError, match="frozen_dtyp"):
        pe.compile(model, x, y, frozen_dtyp="int8")


class TwoOutputs(torch.nn.Module):
    """An MLP returning (logits, features): `output=0` picks the loss's input."""

    def __init__(self):
        super().__init__()
        self.mlp = MODELS["mlp"]()

    def forward(self, x):
        return self.mlp(x), x


def test_every_pe_compile_keyword_reaches_the_scheme_compiler():
    """Every pe.compile keyword (each CompileSpec field) given to the search's compiler at once, with
    a value other than its default: each scheme is the program pe.compile builds with them."""
    import dataclasses
    torch.manual_seed(0)
    model = TwoOutputs()
    x, y = batches("mlp")[0]
    opt = pe.AdamW(lr=1e-3)
    own = {"model", "example_inputs", "example_targets", "update", "loss", "optimizer"}  # the search's own arguments
    kw = dict(name="every_kw", output=0, lora=pe.LoRA(rank=2, alpha=4, targets=["mlp.net.0"]), frozen_dtype="int8",
              exact_skip=False, compute_dtype="bf16", memory_budget_mb=64.0)
    assert set(kw) == {f.name for f in dataclasses.fields(CompileSpec)} - own  # a new keyword needs a value here
    compiler = SchemeCompiler(model, x, y, optimizer=opt, **kw)
    for update in ("none", {"mlp.net.4.*": 1.0}):
        want = pe.compile(model, x, y, update=update, optimizer=opt, **kw)
        assert compiler.stats(update) == want.stats()
        assert compiler.program(update).source() == want.source()
    with pytest.raises(pe.PockError, match="frozen_dtyp"):
        SchemeCompiler(model, x, y, frozen_dtyp="int8")
