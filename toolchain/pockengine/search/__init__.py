"""Scheme search: which parameters to update, and how much of each, for a budget.

    update = pe.search_update(model, batches, loss="cross_entropy", optimizer=pe.SGD(lr=0.05),
                              budget=pe.Budget(memory_mb=8.0), seed=0)

Three steps (PockEngine, MICRO 2023, section 4.2):

1. Candidates (`candidate_groups`): one group per weight matrix/kernel (options: its
   first 1/8, 1/4, 1/2 or all input channels), one per bias, one per normalisation
   layer (its weight and bias together). A scheme picks one option or nothing per group.
2. Contribution analysis (`measure_contributions`): every option is fine-tuned alone for
   a few steps on the sample batches, by PockEngine's own compiled step, and its
   contribution is the drop in the mean loss on the evaluation batches. All options run
   on one build of the full-update step: after every step the parameters (and slices)
   outside the option are put back, which is exactly the option's own sparse step
   because SGD and AdamW update every element independently (tests/search/test_search.py
   checks this against the option's own compiled program). Contributions are assumed
   to add up.
3. Cost and search (`SchemeCompiler`, `search`): each scheme's cost is read from
   `Program.stats()` of its real compiled program (the model is exported once; each
   scheme re-runs autodiff, the passes and the memory plan, ~0.1 s, cached). A greedy
   pass adds the option with the best contribution per estimated cost (costs estimated
   additively from single-option compiles, then checked exactly), then a small seeded
   evolutionary search refines it. Every scheme accepted is checked against its exact
   compiled cost, so the returned one fits the budget.

The cost model is search/compiler.py, the contribution analysis search/contributions.py, the
hand baselines and measured refinement search/baselines.py, the report search/report.py.

A scheme fits `Budget(memory_mb=M)` when `arena_bytes + state_bytes` <= M MiB, or, with
memory_budget_mb among the compile keywords, when its private memory (`private_bytes` of the
program pe.compile builds with them: the recompute plan, frozen weights mapped) is;
`Budget(flops=F)` bounds `flops_per_step`; `Budget(step_ms=T)` bounds the step time
estimated from the FLOPs and the host speed measured on the full-update step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch.nn as nn

from ..errors import PockError
from ..optim.optimizers import Optimizer
from .baselines import NORMS, fits, last_layer_update, refine as refine_measured, scheme_update
from .compiler import MIB, SchemeCompiler, cost_of
from .contributions import (Contributions, Evaluator, _check_batches, _load_cached, _restore_outside,  # noqa: F401
                            _store_cached, measure_contributions, split_batches)

RATIOS = (0.125, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Budget:
    """Limits for a scheme; give at least one. memory_mb bounds arena_bytes + state_bytes
    (MiB), flops bounds flops_per_step, step_ms bounds the estimated step time."""

    memory_mb: float | None = None
    step_ms: float | None = None
    flops: float | None = None

    def __post_init__(self):
        given = {k: v for k, v in (("memory_mb", self.memory_mb), ("step_ms", self.step_ms),
                                   ("flops", self.flops)) if v is not None}
        if not given:
            raise PockError("Budget needs at least one of memory_mb, step_ms, flops")
        for k, v in given.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
                raise PockError(f"Budget {k} must be a positive number, got {v!r}")

    def limits(self) -> dict[str, float]:
        """metric name (as in a cost dict) -> limit."""
        out = {}
        if self.memory_mb is not None:
            out["memory_bytes"] = self.memory_mb * MIB
        if self.flops is not None:
            out["flops_per_step"] = float(self.flops)
        if self.step_ms is not None:
            out["step_ms"] = float(self.step_ms)
        return out

    def describe(self) -> str:
        parts = []
        if self.memory_mb is not None:
            parts.append(f"memory {self.memory_mb:g} MiB")
        if self.flops is not None:
            parts.append(f"{self.flops / 1e6:g} MFLOP/step")
        if self.step_ms is not None:
            parts.append(f"{self.step_ms:g} ms/step (estimated)")
        return ", ".join(parts)


# -- candidates -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """One unit of choice: the parameters it updates and its ratios (increasing, last 1.0)."""

    name: str
    kind: str  # "weight" | "bias" | "norm"
    params: tuple[str, ...]
    ratios: tuple[float, ...]

    def update(self, option: int) -> dict[str, float]:
        """The update dict of option (1-based; 0 = frozen)."""
        if option == 0:
            return {}
        return {p: self.ratios[option - 1] for p in self.params}


def candidate_groups(model: nn.Module, ratios: tuple = RATIOS, candidates=None) -> list[Group]:
    """Weights (ratios 1/8..1 of dim 1, distinct slice counts only), biases and norms, in
    model.named_parameters() order (tied weights once).  candidates: fnmatch globs; only the
    parameters they match become groups (a large model's search can be kept to its last layers)."""
    import fnmatch

    ratios = _check_ratios(ratios)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if candidates is not None:
        globs = [candidates] if isinstance(candidates, str) else list(candidates)
        if not globs or not all(isinstance(g, str) for g in globs):
            raise PockError(f"candidates must be a list of parameter-name globs, got {candidates!r}")
        shapes = {n: s for n, s in shapes.items() if any(fnmatch.fnmatchcase(n, g) for g in globs)}
        if not shapes:
            raise PockError(f"candidates {globs} match no parameter of the model")
    norm_of = {}
    for mname, mod in model.named_modules():
        if isinstance(mod, NORMS):
            for pname, _ in mod.named_parameters(recurse=False):
                full = f"{mname}.{pname}" if mname else pname
                if full in shapes:
                    norm_of[full] = mname
    groups, seen_norms = [], set()
    for name, shape in shapes.items():
        if name in norm_of:
            mname = norm_of[name]
            if mname not in seen_norms:
                seen_norms.add(mname)
                params = tuple(n for n in shapes if norm_of.get(n) == mname)
                groups.append(Group(mname or name, "norm", params, (1.0,)))
            continue
        if len(shape) >= 2 and shape[1] > 1:
            rs, ks = [], set()
            for r in ratios:
                k = min(math.ceil(r * shape[1]), shape[1])
                if k not in ks:
                    ks.add(k)
                    rs.append(1.0 if k == shape[1] else r)
            groups.append(Group(name, "weight", (name,), tuple(rs)))
        else:
            groups.append(Group(name, "weight" if len(shape) >= 2 else "bias", (name,), (1.0,)))
    # a tied weight through one of its other modules' use only (passes/tied.py): e.g. a language
    # model's output head, which needs no backward pass through the blocks
    from ..frontends.torch_export import tied_aliases
    for alias, canonical in tied_aliases(model).items():
        if canonical in shapes and alias.endswith(".weight") and len(shapes[canonical]) >= 2 \
                and (candidates is None or any(fnmatch.fnmatchcase(alias, g) for g in globs)):
            base = next(g for g in groups if g.params == (canonical,))
            groups.append(Group(alias, "weight", (alias,), base.ratios))
    return groups


def _check_ratios(ratios) -> tuple:
    try:
        rs = tuple(float(r) for r in ratios)
    except TypeError:
        raise PockError(f"ratios must be increasing numbers in (0, 1] ending in 1.0, got {ratios!r}") from None
    if not rs or rs[-1] != 1.0 or any(not 0 < r <= 1 for r in rs) or list(rs) != sorted(set(rs)):
        raise PockError(f"ratios must be increasing numbers in (0, 1] ending in 1.0, got {ratios!r}")
    return rs


# -- search ---------------------------------------------------------------------------------------
@dataclass
class SearchResult:
    update: dict[str, float]
    scheme: tuple[int, ...]
    groups: list[Group]
    contributions: Contributions
    budget: Budget
    cost: dict
    predicted_delta: float
    full: dict                     # cost of update="full"
    last: dict                     # cost of the last-layer update
    last_update: dict[str, float]
    seed: int
    compiles: int
    history: list = field(default_factory=list)  # best predicted contribution per refinement generation
    measured_delta: float | None = None  # held-out loss drop of the chosen scheme, measured (after measured_steps)
    baselines: list = field(default_factory=list)  # search_baselines.Measured, the hand baselines
    seconds: float = 0.0                 # wall time of the search
    cached: bool = False                 # contributions came from the cache
    lora: object = None                  # pe.LoRA when a LoRA scheme won (update: its sparse part)
    measured_steps: int | None = None    # the fine-tuning steps of measured_delta (the verification's)

    def table(self) -> str:
        """Markdown: chosen vs full vs last layer vs the hand baselines (measured loss drops, after
        the verification's steps where one ran)."""
        short = self.contributions.steps
        rows = [("searched", self.cost, self.measured_delta, True, self.measured_steps or short),
                ("full update", self.full, self.contributions.full_delta, False, short),
                ("last layer", self.last, None, fits(self.last, self.budget.limits()), None)]
        rows += [(f"baseline: {b.name}", b.cost, b.delta, b.fits, b.steps or short) for b in self.baselines]
        # one column per step count: a drop after 10 steps never sits beside one after 100
        counts = sorted({steps for *_, d, _, steps in rows if d is not None})
        lines = ["| scheme | arena + state MiB | arena + optimizer state MiB | MFLOP/step | trainable | fits budget | "
                 + "".join(f"loss drop after {n} steps | " for n in counts),
                 "|---|---|---|---|---|---|" + "---|" * len(counts)]
        for label, c, d, ok, steps in rows:
            drops = "".join(f"{d:.4f} | " if d is not None and steps == n else " | " for n in counts)
            lines.append(f"| {label} | {c['memory_bytes'] / MIB:.3f} | {c['training_bytes'] / MIB:.3f} | "
                         f"{c['flops_per_step'] / 1e6:.2f} | {c['trainable_elements']} | "
                         f"{'yes' if ok else 'no'} | " + drops)
        return "\n".join(line.rstrip() for line in lines)

    def describe(self) -> str:
        chosen = ", ".join(f"{n}: {r:g}" for n, r in self.update.items())
        if self.lora is not None:
            chosen = f"{chosen}}} + LoRA(rank={self.lora.rank}, targets={list(self.lora.targets)}"
        return (f"searched scheme for budget {self.budget.describe()} (seed {self.seed}):\n  {{{chosen}}}\n"
                + (f"  measured loss drop {self.measured_delta:.4f} after {self.measured_steps} steps; "
                   if self.measured_delta is not None else "  ")
                + f"search {self.seconds:.1f} s\n"
                f"  predicted loss drop {self.predicted_delta:.4f} (full update: "
                f"{self.contributions.full_delta:.4f}, {self.contributions.steps} steps on the sample batches)\n"
                + self.table())


class _Searcher:
    def __init__(self, compiler, groups, contrib: Contributions, budget: Budget):
        self.compiler, self.groups, self.contrib = compiler, groups, contrib
        self.limits = budget.limits()
        self.ms_per_flop = contrib.ms_per_flop
        self.empty = self.cost(tuple(0 for _ in groups))
        self.single = {}  # (group, option) -> cost of that option alone, minus the empty scheme
        for gi, g in enumerate(groups):
            for o in range(1, len(g.ratios) + 1):
                c = self.cost(self._one(gi, o))
                self.single[(gi, o)] = {k: c[k] - self.empty[k] for k in self.limits}

    def _one(self, gi, o):
        return tuple(o if i == gi else 0 for i in range(len(self.groups)))

    def cost(self, scheme) -> dict:
        return cost_of(self.compiler.stats(scheme_update(self.groups, scheme)), self.ms_per_flop,
                       self.compiler.counts_private)

    def cost_of_stats(self, stats: dict) -> dict:
        return cost_of(stats, self.ms_per_flop, self.compiler.counts_private)

    def value(self, scheme) -> float:
        return sum(self.contrib.delta[(gi, o)] for gi, o in enumerate(scheme) if o)

    def estimate(self, scheme) -> dict:
        return {k: self.empty[k] + sum(self.single[(gi, o)][k] for gi, o in enumerate(scheme) if o)
                for k in self.limits}

    def weight(self, est: dict) -> float:
        """Scalar cost: the budget fractions summed."""
        return sum(est[k] / v for k, v in self.limits.items())

    def feasible(self, scheme, slack: float = 1.25) -> bool:
        """Exact check, skipping the compile when the additive estimate is far over budget."""
        if not any(scheme):
            return False
        est = self.estimate(scheme)
        if any(est[k] > slack * v for k, v in self.limits.items()):
            return False
        return fits(self.cost(scheme), self.limits)

    def greedy(self) -> tuple:
        cur = tuple(0 for _ in self.groups)
        while True:
            base_w = self.weight(self.estimate(cur))
            moves = []
            for gi, g in enumerate(self.groups):
                for o in range(cur[gi] + 1, len(g.ratios) + 1):
                    gain = self.contrib.delta[(gi, o)] - (self.contrib.delta[(gi, cur[gi])] if cur[gi] else 0.0)
                    if gain <= 0:
                        continue
                    nxt = cur[:gi] + (o,) + cur[gi + 1:]
                    dw = max(self.weight(self.estimate(nxt)) - base_w, 1e-9)
                    moves.append((-gain / dw, gi, o, nxt))
            moves.sort(key=lambda m: (m[0], m[1], m[2]))
            for *_, nxt in moves[:8]:
                if self.feasible(nxt):
                    cur = nxt
                    break
            else:
                return cur

    def evolve(self, start: tuple, rng: np.random.Generator, generations: int, population: int,
               progress: bool, history: list) -> tuple:
        from tqdm import tqdm

        n = len(self.groups)
        sizes = [len(g.ratios) for g in self.groups]

        def mutate(s):
            s = list(s)
            for _ in range(1 + int(rng.integers(0, 2))):
                gi = int(rng.integers(0, n))
                s[gi] = int(rng.integers(0, sizes[gi] + 1))
            return tuple(s)

        def crossover(a, b):
            mask = rng.random(n) < 0.5
            return tuple(x if m else y for x, y, m in zip(a, b, mask))

        pop = [start]
        best = start
        for _ in tqdm(range(generations), desc="evolutionary refinement", unit="gen", disable=not progress):
            children = []
            while len(children) < population:
                if len(pop) >= 2 and rng.random() < 0.5:
                    i, j = rng.choice(len(pop), 2, replace=False)
                    child = mutate(crossover(pop[i], pop[j])) if rng.random() < 0.5 else crossover(pop[i], pop[j])
                else:
                    child = mutate(pop[int(rng.integers(0, len(pop)))])
                children.append(child)
            scored = {s: self.value(s) for s in set(pop) | set(children) if self.feasible(s)}
            ranked = sorted(scored, key=lambda s: (-scored[s], s))
            pop = ranked[:max(2, population // 3)] or pop
            if ranked and scored[ranked[0]] > self.value(best) + 1e-12:
                best = ranked[0]
            history.append(self.value(best))
        return best


def search(model: nn.Module, batches, loss="cross_entropy", optimizer: Optimizer | None = None,
           budget: Budget | None = None, seed: int = 0, steps: int = 10, generations: int = 8,
           population: int = 12, progress: bool = True, compiler: SchemeCompiler | None = None,
           contributions: Contributions | None = None, refine: bool = True, max_seconds: float | None = None,
           max_evaluations: int = 24, cache: bool = True, verify_steps: int | None = None, lora=False,
           candidates=None, ratios: tuple = RATIOS, baseline_blocks=None, baselines=None,
           **compile_kw) -> SearchResult:
    """search_update's work, returning everything the report shows (see the module docstring).
    refine: measure the hand baselines and the additive pick with real steps and refine by
    measured moves (search_baselines); max_seconds bounds the search (the contribution
    analysis gets at most 60% of it) except the hand baselines, which are always measured; cache: reuse contribution results of the same model,
    data, optimizer and steps (pock cache dir, search/); verify_steps (default 3 x steps; pass the
    user's training length): every hand baseline that fits, the short-horizon winner and the best
    few other measured schemes are trained again for this many steps (always, past max_seconds
    too), then measured local moves refine the winner at that horizon (until max_seconds); the
    returned scheme's held-out loss drop after verify_steps steps is >= every fitting baseline's,
    measured by the same trainer on the same batches (its `measured_delta`; each baseline's
    `delta`).  lora: also LoRA schemes at the same memory as hand baselines (True:
    search_baselines.lora_baselines; or a list of (label, pe.LoRA, sparse update dict)); the
    result's `lora` is then the adapters to compile with (pe.compile(..., update=result.update or
    "none", lora=result.lora)).  candidates (globs) and ratios: the groups of the contribution
    analysis (a large model's search kept small); baseline_blocks: the k of the last-k-blocks
    baselines (default every k); baselines: name prefixes of the hand baselines to measure.
    compile_kw: every other pe.compile keyword (frozen_dtype, output, exact_skip, name, ...; a
    pe.LoRA as `lora` is pe.compile's: adapters trained beside every scheme): each scheme is
    costed as the program pe.compile builds with them."""
    t0 = time.monotonic()
    from ..schemes.lora import LoRA
    if isinstance(lora, LoRA):  # pe.compile's lora=: the adapters every scheme trains
        compile_kw["lora"], lora = lora, False
    only = baselines  # (the name is reused below for the measured baselines)
    if not isinstance(budget, Budget):
        raise PockError(f"budget must be a pe.Budget(memory_mb=..., step_ms=..., flops=...), got {budget!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PockError(f"steps must be a positive integer, got {steps!r}")
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float))
                                    or not max_seconds > 0 or not math.isfinite(max_seconds)):
        raise PockError(f"max_seconds must be a positive number of seconds, got {max_seconds!r}")
    deadline = None if max_seconds is None else t0 + max_seconds
    if compiler is None:
        if not isinstance(batches, (list, tuple)) or not batches or not isinstance(batches[0], (list, tuple)) \
                or len(batches[0]) != 2:
            raise PockError("batches must be a non-empty list of (inputs, targets) tuples")
        compiler = SchemeCompiler(model, batches[0][0], batches[0][1], loss, optimizer, **compile_kw)
    model = compiler.model  # a torch module (ONNX, Keras, TFLite, JAX models converted)
    batches = _check_batches(batches, compiler)
    groups = [g for g in candidate_groups(model, ratios, candidates) if not all(p in compiler.frozen for p in g.params)]
    if not groups:
        raise PockError("the model has no parameters to update")
    limits = budget.limits()
    if "step_ms" not in limits and contributions is None:
        # the budget is checkable before any C++ build: fail fast if no option fits
        _check_cheapest(compiler, groups, budget, None)
    evaluator, cached = None, False
    try:
        if contributions is None and cache:
            contributions = _load_cached(compiler, batches, steps, groups)
            cached = contributions is not None
        if contributions is None or refine:
            evaluator = Evaluator(compiler, batches, contributions.steps if contributions else steps)
        if contributions is None:
            contributions = measure_contributions(compiler, groups, batches, steps, progress, evaluator,
                                                  None if deadline is None else t0 + 0.6 * max_seconds)
            if cache and contributions.complete:
                _store_cached(compiler, batches, steps, groups, contributions)
        _check_cheapest(compiler, groups, budget, contributions.ms_per_flop)
        s = _Searcher(compiler, groups, contributions, budget)
        best = s.greedy()
        history: list = []
        if any(best):
            best = s.evolve(best, np.random.default_rng(seed), generations, population, progress, history)
        measured, measured_steps, baselines, chosen = None, None, [], None
        if refine:
            chosen, baselines = refine_measured(s, evaluator, model, best, deadline, max_evaluations, progress,
                                                verify_steps or 3 * evaluator.steps, lora, baseline_blocks, only)
            if chosen.fits:
                best, measured = chosen.scheme, chosen.delta
                measured_steps = chosen.steps or evaluator.steps
            else:
                chosen = None
    finally:
        if evaluator is not None:
            evaluator.close()
    if chosen is None and not any(best):
        raise PockError(f"no option with a positive contribution fits the budget {budget.describe()} "
                        "(every option tried made the sample loss worse); try more sample batches or steps")
    if chosen is not None:
        update, cost, chosen_lora = dict(chosen.update), chosen.cost, chosen.lora
    else:
        update, cost, chosen_lora = scheme_update(groups, best), s.cost(best), None
    assert fits(cost, limits)
    full = cost_of(compiler.stats("full"), contributions.ms_per_flop, compiler.counts_private)
    last_update = last_layer_update(compiler)
    last = cost_of(compiler.stats(last_update), contributions.ms_per_flop, compiler.counts_private)
    return SearchResult(update, best, groups, contributions, budget, cost, s.value(best), full, last,
                        last_update, seed, compiler.compiles, history, measured, baselines,
                        time.monotonic() - t0, cached, chosen_lora, measured_steps)


def _check_cheapest(compiler, groups, budget: Budget, ms_per_flop) -> None:
    limits = {k: v for k, v in budget.limits().items() if ms_per_flop is not None or k != "step_ms"}
    best = None
    for g in groups:
        c = cost_of(compiler.stats(g.update(1)), ms_per_flop, compiler.counts_private)
        if fits(c, limits):
            return
        over = max(c[k] / v for k, v in limits.items())
        if best is None or over < best[0]:
            best = (over, g, c)
    _, g, c = best
    got = ", ".join(f"{k} {c[k] / MIB:.3f} MiB" if k == "memory_bytes" else
                    f"{k} {c[k] / 1e6:.3f} M" if k == "flops_per_step" else f"{k} {c[k]:.3f}" for k in limits)
    raise PockError(f"budget {budget.describe()} is below the cheapest update scheme: updating only "
                    f"{g.name} at ratio {g.ratios[0]:g} needs {got}")


def search_update(model: nn.Module, batches, loss="cross_entropy", optimizer: Optimizer | None = None,
                  budget: Budget | None = None, seed: int = 0, steps: int = 10, report: str | None = None,
                  verbose: bool = True, **kwargs) -> dict[str, float]:
    """The update dict {param: ratio} with the largest summed contribution that fits budget.

    batches: list of (inputs, targets) tuples of one shape (the sample data). With 4 or more,
    the last quarter measures the loss and the rest are trained on. steps: fine-tuning steps per
    candidate. report: also write the report (.html, or .md with PNGs beside it). Raises PockError
    when no scheme fits the budget."""
    result = search(model, batches, loss=loss, optimizer=optimizer, budget=budget, seed=seed, steps=steps,
                    progress=verbose, **kwargs)
    if verbose:
        print(result.describe())
    if report:
        from .report import write_report
        write_report(result, report)
        if verbose:
            print(f"search report: {report}")
    return result.update


def search_for_cli(kwargs: dict, budget_mb: float, report: str | None = None, seed: int = 0) -> dict:
    """`pock-build --search`: search on the spec's `sample_batches` (popped from kwargs, a list of
    (inputs, targets)), or on its one example batch; every other pe.compile keyword of the spec
    (frozen_dtype, lora, output, ...) is the search's too, so the scheme fits in what is built."""
    batches = kwargs.pop("sample_batches", None)
    if batches is None:
        batches = [(kwargs["example_inputs"], kwargs.get("example_targets"))]
    compile_kw = {k: v for k, v in kwargs.items() if k not in ("model", "example_inputs", "example_targets", "update")}
    return search_update(kwargs["model"], batches, budget=Budget(memory_mb=budget_mb), seed=seed, report=report,
                         **compile_kw)
