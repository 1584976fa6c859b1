"""The cost model of the scheme search: pe.compile for many update schemes of one model
(`SchemeCompiler`: the model exported once, each scheme's Program from pe.compile's own path)
and the quantities a Budget bounds (`cost_of`)."""
from __future__ import annotations

import math
import re
import weakref

import torch.nn as nn

from ..ops import FULL
from ..errors import PockError
from ..frontends.torch_export import check_example, resolve_loss, tied_aliases
from ..optim.optimizers import SGD, Optimizer
from ..passes.tied import split_tied_uses
from ..compiler.program import Program, _c_name, compile_spec, make_spec, resolve_update

MIB = 2 ** 20


class SchemeCompiler:
    """pe.compile for many update schemes of one model: pe.compile's own path
    (program.compile_spec) for the spec with each scheme's `update`, the model exported once
    (per LoRA configuration) and each scheme lowered from a copy, so a scheme's Program (and
    stats) is the one pe.compile builds with the same keywords.  compile_kw: every other
    pe.compile keyword (frozen_dtype, lora, output, exact_skip, name, ...)."""

    def __init__(self, model: nn.Module, example_inputs, example_targets, loss="cross_entropy",
                 optimizer: Optimizer | None = None, name: str | None = None, **compile_kw):
        from ..frontends import as_torch_module
        model = as_torch_module(model)
        if not isinstance(model, nn.Module):
            raise PockError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
        if not isinstance(self.optimizer, Optimizer):
            raise PockError(f"optimizer must be pe.SGD(...) or pe.AdamW(...), got {type(self.optimizer).__name__}")
        self.inputs = check_example(example_inputs, "example_inputs")
        self.targets = check_example(example_targets, "example_targets")
        resolve_loss(loss)
        self.loss = loss
        self.name = name or _c_name(type(model).__name__)
        self.spec = make_spec(model, example_inputs, example_targets, loss, optimizer=self.optimizer,
                              name=self.name, **compile_kw)
        self.model = model  # LoRA schemes are compiled from it (pe.compile(..., lora=...))
        self._lora: dict[tuple, Program] = {}
        self._exports: dict = {}  # program.compile_spec's export cache
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        # frozen by the user (requires_grad=False) stays frozen, as in pe.compile
        self.frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        self.aliases = tied_aliases(model)
        self._stats: dict[tuple, dict] = {}
        self._floors = weakref.WeakKeyDictionary()  # program -> the private bytes its budget would need
        self.compiles = 0

    @property
    def train_graph(self):
        """The exported training graph (before lowering) of the spec."""
        return self._exported()[2]

    @property
    def forward_graph(self):
        return self._exported()[3]

    def _exported(self):
        if not self._exports:
            self.program("full")
        return next(iter(self._exports.values()))

    @staticmethod
    def key(trained: dict, tied_uses: dict | None = None) -> tuple:
        key = tuple(sorted((n, -1 if k is FULL else int(k)) for n, k in trained.items()))
        return key + (("tied uses", tuple(sorted(tied_uses.items()))),) if tied_uses else key

    def scheme_key(self, update) -> tuple:
        """What identifies a scheme's step: what it trains, and a tied weight trained through
        one use only (passes/tied.py)."""
        return self.key(*self.resolve(update))

    def program(self, update) -> Program:
        """The scheme's Program: pe.compile(**the spec's keywords, update=update), exported once.
        A scheme whose step cannot meet the keywords' memory_budget_mb gets its unbudgeted
        program (recomputation changes no bits, so its training is the same); its
        program_stats() count the smallest private memory the compiler names."""
        prog = self._compile(self.spec.replace(update=update))
        self.compiles += 1
        return prog

    def _compile(self, spec) -> Program:
        try:
            return compile_spec(spec, self._exports)
        except PockError as e:
            m = _UNREACHABLE.search(str(e)) if spec.memory_budget_mb is not None else None
            if m is None:
                raise
        prog = compile_spec(spec.replace(memory_budget_mb=None), self._exports)
        self._floors[prog] = math.ceil(float(m.group(1)) * MIB)
        return prog

    def program_stats(self, prog: Program) -> dict:
        """prog.stats() of a program this compiler made (program(), lora_program()); one whose
        memory_budget_mb was out of reach counts, as its private_bytes, the smallest private
        memory the compiler names: what the budget would need."""
        floor = self._floors.get(prog)
        return prog.stats() if floor is None else dict(prog.stats(), private_bytes=floor)

    @property
    def counts_private(self) -> bool:
        """Whether Budget(memory_mb) counts prog.stats()["private_bytes"] (the compile keywords
        have memory_budget_mb: the recompute plan, frozen weights mapped), as pe.compile's
        memory_budget_mb does; else arena + state, as before issue 36."""
        return self.spec.memory_budget_mb is not None

    def resolve(self, update) -> tuple[dict, dict]:
        """(what the scheme trains, {tied parameter: the module whose use alone trains it}, from
        an alias key in `update`), as pe.compile resolves them."""
        update, uses = split_tied_uses(update, self.aliases)
        trained = {n: k for n, k in resolve_update(self.shapes, update).items() if n not in self.frozen}
        return trained, {p: m for p, m in uses.items() if p in trained}

    def trained(self, update) -> dict:
        return self.resolve(update)[0]

    def tied_uses(self, update) -> dict:
        return self.resolve(update)[1]

    def stats(self, update) -> dict:
        """prog.stats() of the scheme's compiled program (cached by what it trains)."""
        key = self.scheme_key(update)
        if key not in self._stats:
            self._stats[key] = self.program_stats(self.program(update))
        return self._stats[key]


    @staticmethod
    def lora_key(lora, update: dict) -> tuple:
        return (lora.rank, float(lora.alpha), tuple(lora.targets), lora.seed, tuple(sorted(update.items())))

    def lora_program(self, lora, update: dict) -> Program:
        """pe.compile(model, ..., update=update or "none", lora=lora): a LoRA scheme (adapters
        beside a sparse update dict), cached."""
        key = self.lora_key(lora, update)
        if key not in self._lora:
            self._lora[key] = self._compile(self.spec.replace(update=dict(update) or "none", lora=lora,
                                                              name=f"{self.name}_lora"))
            self.compiles += 1
        return self._lora[key]


_UNREACHABLE = re.compile(r"cannot be met: the smallest reachable private memory is ([0-9.]+) MiB")


def cost_of(stats: dict, ms_per_flop: float | None = None, private: bool = False) -> dict:
    """The quantities a Budget bounds, from prog.stats(); memory_bytes is the private memory
    (stats' private_bytes) with `private` (SchemeCompiler.counts_private), else arena + state."""
    cost = {"memory_bytes": stats["private_bytes"] if private else stats["arena_bytes"] + stats["state_bytes"],
            "private_bytes": stats["private_bytes"],
            "training_bytes": stats["arena_bytes"] + stats["optimizer_state_bytes"],
            "arena_bytes": stats["arena_bytes"], "state_bytes": stats["state_bytes"],
            "optimizer_state_bytes": stats["optimizer_state_bytes"],
            "flops_per_step": stats["flops_per_step"], "trainable_elements": stats["trainable_elements"]}
    if ms_per_flop is not None:
        cost["step_ms"] = stats["flops_per_step"] * ms_per_flop
    return cost
