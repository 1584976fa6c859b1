"""Hand baselines and the measured refinement of the scheme search.

A searched scheme is only worth having if it trains at least as well as the schemes a user
would pick by hand at the same budget.  `hand_baselines` names those schemes for any model:

- **last layer**: the parameters the forward pass reads last (the classifier);
- **last k blocks**: every parameter of the last k repeated blocks (a ModuleList/Sequential
  of same-typed children; else the top-level children with parameters) and of what follows them;
- **paper rule** (PockEngine, MICRO 2023, 4.2): in the later half of the blocks, every
  linear layer but the block's last one (transformers: attention and the first FFN linear,
  not the second) or only the first pointwise convolution (CNNs: not the depthwise or the
  second pointwise), plus every norm and bias there and what follows the blocks;
- **one layer of the last block**: one of its weight layers plus what follows the blocks;
- **biases + norms**: every bias and normalisation parameter.

`refine` measures them (and the additive search's pick) with the same compiled trainer
(search.Evaluator: real steps at the user's optimizer, held-out loss), keeps the best that fits
the budget as the incumbent and improves it by measured joint evaluations of local moves
(add, widen, swap), accepting a move only when its measured loss drop is larger.  The decision
is then taken at the user's training length (`verify_steps`): every baseline that fits and the
best measured schemes are trained that long, and measured moves refine the winner there.  The
result is therefore never worse, on the measurement, than the best baseline that fits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch.nn as nn

from ..errors import PockError

# (search.py imports this module: it holds the helpers both use, so the imports stay a DAG)
NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding)


def scheme_update(groups: list, scheme) -> dict[str, float]:
    update = {}
    for g, o in zip(groups, scheme):
        update.update(g.update(o))
    return update


def fits(cost: dict, limits: dict) -> bool:
    return all(cost[k] <= v for k, v in limits.items())


def last_layer_update(compiler) -> dict[str, float]:
    """The parameters of the module whose parameters the forward pass reads last (the classifier)."""
    params = {id(v): n for n, v in compiler.train_graph.state.items() if v.kind == "param" and n in compiler.shapes}
    last = None
    for n in compiler.train_graph.nodes:
        if n.phase == "forward":
            hit = [params[id(v)] for v in n.inputs if v is not None and id(v) in params]
            if hit:
                last = hit
    if last is None:
        raise PockError("the model has no parameter that reaches the loss")
    prefixes = {p.rsplit(".", 1)[0] + "." if "." in p else p for p in last}
    names = [n for n in compiler.shapes if n in last or any(n.startswith(pre) for pre in prefixes if pre.endswith("."))]
    return {n: 1.0 for n in names}



@dataclass
class Measured:
    """One scheme measured by the Evaluator."""
    name: str
    scheme: tuple[int, ...]
    update: dict
    cost: dict
    fits: bool
    delta: float | None  # held-out loss drop after `steps` steps; None when over budget (not trained)
    lora: object = None  # pe.LoRA of a LoRA scheme (update: the sparse part trained beside it)
    steps: int | None = None  # the steps `delta` was measured after (None: the evaluator's)
    short_delta: float | None = None  # the drop after the evaluator's steps, once `delta` is a verification


def _blocks(model: nn.Module) -> list[str]:
    """Module names of the repeated blocks: the ModuleList/Sequential with the most parameters
    whose children (>= 2) share one type; else the top-level children that hold parameters."""
    best, best_n = None, 0
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            kids = list(mod.named_children())
            if len(kids) >= 2 and len({type(k) for _, k in kids}) == 1:
                n = sum(p.numel() for p in mod.parameters())
                if n > best_n and any(True for _ in kids[0][1].parameters()):
                    best, best_n = [f"{name}.{k}" if name else k for k, _ in kids], n
    if best:
        return best
    return [n for n, m in model.named_children() if any(True for _ in m.parameters())]


def _under(param: str, module: str) -> bool:
    return param.startswith(module + ".")


def _tail(names: list[str], blocks: list[str]) -> list[str]:
    """Parameters after the last block in named_parameters order, outside every block."""
    last = max((i for i, n in enumerate(names) if any(_under(n, b) for b in blocks)), default=-1)
    return [n for n in names[last + 1:] if not any(_under(n, b) for b in blocks)]


def hand_baselines(model: nn.Module, compiler, blocks_k=None) -> dict[str, dict[str, float]]:
    """{baseline name: update dict} (see the module docstring); duplicates dropped.
    blocks_k: the k of the "last k blocks" baselines (default every k)."""
    names = list(compiler.shapes)
    modules = dict(model.named_modules())
    blocks = _blocks(model)
    tail = _tail(names, blocks)
    out: dict[str, dict[str, float]] = {"last layer": last_layer_update(compiler)}
    for k in (range(1, len(blocks) + 1) if blocks_k is None else [k for k in blocks_k if 1 <= k <= len(blocks)]):
        chosen = blocks[-k:]
        out[f"last {k} block{'s' if k > 1 else ''}"] = {
            n: 1.0 for n in names if any(_under(n, b) for b in chosen) or n in tail}

    def owner(p):
        return modules.get(p.rsplit(".", 1)[0]) if "." in p else None

    later = blocks[len(blocks) // 2:] if len(blocks) > 1 else blocks
    for label, chosen in (("paper rule, later half", later), ("paper rule, last block", blocks[-1:])):
        upd = {n: 1.0 for n in tail}
        for b in chosen:
            params = [n for n in names if _under(n, b)]
            layers = []
            for n in params:
                m = owner(n)
                if isinstance(m, WEIGHTED) and n.endswith(".weight") and m not in [x for _, x in layers]:
                    layers.append((n.rsplit(".", 1)[0], m))
            convs = [(mn, m) for mn, m in layers if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d))]
            if convs:  # CNN block: only the first pointwise (1x1, ungrouped) convolution
                pw = [(mn, m) for mn, m in convs if all(s == 1 for s in m.kernel_size) and m.groups == 1]
                keep = pw[:1]
            else:      # transformer block: every linear but the last (the second FFN linear)
                keep = layers[:-1] if len(layers) >= 3 else layers
            for mn, _ in keep:
                upd[f"{mn}.weight"] = 1.0
            for n in params:  # norms and biases of the block
                if n.endswith(".bias") or isinstance(owner(n), NORMS):
                    upd[n] = 1.0
        out[label] = upd
    last_layers = []
    for n in names:
        m = owner(n)
        if blocks and _under(n, blocks[-1]) and isinstance(m, WEIGHTED) and n.endswith(".weight"):
            last_layers.append(n)
    for n in last_layers:
        layer = n.rsplit(".", 1)[0][len(blocks[-1]) + 1:]
        if layer:  # (a block that is one layer is already "last 1 block")
            out[f"last block {layer} + tail"] = {n: 1.0, **{t: 1.0 for t in tail}}
    out["biases + norms"] = {n: 1.0 for n in names
                             if len(compiler.shapes[n]) == 1 and (n.endswith("bias") or isinstance(owner(n), NORMS))}
    unique, seen = {}, set()
    for label, upd in out.items():
        key = tuple(sorted(upd))
        if upd and key not in seen:
            seen.add(key)
            unique[label] = upd
    return unique


def to_scheme(groups: list, update: dict[str, float]) -> tuple[int, ...]:
    """The scheme (one option per group) that trains at least `update`'s parameters."""
    scheme = []
    for g in groups:
        rs = [update[p] for p in g.params if p in update]
        if not rs:
            scheme.append(0)
            continue
        r = max(rs)
        scheme.append(next((i + 1 for i, gr in enumerate(g.ratios) if gr >= r - 1e-12), len(g.ratios)))
    return tuple(scheme)


LORA_RANKS = (1, 2, 4, 8, 16, 32, 64)


def _biases_norms(model: nn.Module, compiler) -> dict[str, float]:
    modules = dict(model.named_modules())
    return {n: 1.0 for n, shape in compiler.shapes.items()
            if len(shape) == 1 and (n.endswith("bias") or isinstance(modules.get(n.rsplit(".", 1)[0]), NORMS))}


def lora_baselines(model: nn.Module, compiler, cost, limits: dict, ranks=LORA_RANKS) -> list[Measured]:
    """LoRA at the same memory: adapters on every nn.Linear of the blocks (else every Linear),
    alone, with the biases and norms, or with what follows the blocks; and on the last block's
    Linears with what follows the blocks.  Each at the largest rank of `ranks` (at most half the
    smallest layer dimension) that fits `limits` (alpha = 2 x rank), or at the smallest rank, marked as not fitting.  cost: the
    cost dict of a Program's stats()."""
    from ..schemes.lora import LoRA

    names = list(compiler.shapes)
    blocks = _blocks(model)
    tail = {n: 1.0 for n in _tail(names, blocks)}
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    inside = [(n, m) for n, m in linears if any(n == b or _under(n, b) for b in blocks)]
    targets = inside or linears
    if not targets:
        return []
    last = [(n, m) for n, m in targets if blocks and (n == blocks[-1] or _under(n, blocks[-1]))]
    combos = [("", targets, {}), (" + biases/norms", targets, _biases_norms(model, compiler)),
              (" + tail", targets, tail)]
    if last and len(last) < len(targets):
        combos.append((", last block + tail", last, tail))
    out, seen = [], set()
    for suffix, tgt, upd in combos:
        key = (tuple(n for n, _ in tgt), tuple(sorted(upd)))
        if key in seen or (suffix and not upd):
            continue
        seen.add(key)
        cap = max(1, min(min(m.in_features, m.out_features) for _, m in tgt) // 2)  # low rank, not a full update
        rs = [r for r in ranks if r <= cap] or [1]

        def at(r):
            lora = LoRA(rank=r, alpha=2.0 * r, targets=tuple(n for n, _ in tgt))
            return lora, cost(compiler.program_stats(compiler.lora_program(lora, upd)))

        where = (" all block linears" if inside else " all linears") if tgt is targets else ""
        lora, c = at(rs[0])
        if not fits(c, limits):
            out.append(Measured(f"LoRA r={rs[0]}{where}{suffix}", (), dict(upd), c, False, None, lora))
            continue
        lo, hi, best = 1, len(rs) - 1, (lora, c)  # the largest fitting rank (cost grows with rank)
        while lo <= hi:
            mid = (lo + hi) // 2
            lm, cm = at(rs[mid])
            if fits(cm, limits):
                best, lo = (lm, cm), mid + 1
            else:
                hi = mid - 1
        out.append(Measured(f"LoRA r={best[0].rank}{where}{suffix}", (), dict(upd), best[1], True, None, best[0]))
    return out


def explicit_lora(compiler, cost, limits: dict, given) -> list[Measured]:
    """[(label, pe.LoRA, sparse update dict)] -> Measured LoRA schemes (fits checked)."""
    out = []
    for label, lora, upd in given:
        c = cost(compiler.program_stats(compiler.lora_program(lora, dict(upd))))
        out.append(Measured(label, (), dict(upd), c, fits(c, limits), None, lora))
    return out


def refine(searcher, evaluator, model: nn.Module, start: tuple, deadline: float | None,
           max_evaluations: int = 24, progress: bool = True, verify_steps: int | None = None,
           lora=False, blocks_k=None, only=None, finalists_n: int = 4) -> tuple[Measured, list[Measured]]:
    """(the best scheme as measured, the baselines as measured): the incumbent is the best of the
    additive search's `start` and the hand baselines that fit (lora: also LoRA schemes at the same
    memory: True for lora_baselines, or a list of (label, pe.LoRA, update dict)); then measured
    local moves (from a sparse incumbent); then, when verify_steps > the evaluator's steps, the
    decision at that horizon (_verify): every baseline that fits, the incumbent and the
    `finalists_n - 1` best other measured schemes trained again for `verify_steps` steps, the best
    of them refined by measured moves at that horizon.  The returned scheme's delta is >= every
    fitting baseline's delta, both at the same steps (by construction).
    only: name prefixes of the hand baselines to use (default all)."""
    from tqdm import tqdm

    groups, limits, compiler = searcher.groups, searcher.limits, searcher.compiler
    in_groups = {p for g in groups for p in g.params}
    cost = searcher.cost_of_stats

    baselines = []
    for label, upd in hand_baselines(model, compiler, blocks_k).items():
        if only is not None and not label.startswith(tuple(only)):
            continue
        scheme = to_scheme(groups, upd)
        if set(upd) <= in_groups:  # measured as the search's own scheme (whole norm groups)
            upd = scheme_update(groups, scheme)
        c = cost(compiler.stats(upd))
        baselines.append(Measured(label, scheme, dict(upd), c, fits(c, limits), None))
    if lora is True:
        baselines += lora_baselines(model, compiler, cost, limits)
    elif lora:
        baselines += explicit_lora(compiler, cost, limits, lora)
    for b in baselines:
        if b.lora is not None:  # the sparse part, for the report's chosen-candidate marks
            b.scheme = to_scheme(groups, {n: 1.0 for n in compiler.trained(b.update)})
    todo = [b for b in baselines if b.fits]
    bar = tqdm(total=len(todo) + 1 + max_evaluations, desc="measured refinement", unit="eval",
               disable=not progress)

    def measure(m: Measured, steps=None) -> float:
        if steps is None:
            bar.update(1)
        if m.lora is not None:
            return evaluator.lora_delta(m.lora, m.update, steps)
        return evaluator.delta(m.update, steps)

    def sparse(name, scheme):
        upd = scheme_update(groups, scheme)
        return Measured(name, scheme, upd, searcher.cost(scheme), True, None)

    best = sparse("searched", start) if any(start) else None
    tried = list(todo)  # everything measured: the finalists are the best few of these
    if best is not None:
        best.delta = measure(best)
        tried.append(best)
    for b in todo:  # always measured, past the deadline too: they are what the result is never worse than
        b.delta = measure(b)
        if best is None or b.delta > best.delta:
            best = b
    if best is None:
        bar.close()
        return Measured("none", start, {}, searcher.cost(start), False, float("-inf")), baselines
    evals = 0
    while best.lora is None and best.update == scheme_update(groups, best.scheme) and evals < max_evaluations \
            and (deadline is None or time.monotonic() < deadline):
        improved = False
        for nxt in _moves(searcher, best.scheme):
            if evals >= max_evaluations or (deadline is not None and time.monotonic() > deadline):
                break
            evals += 1
            m = sparse("searched", nxt)
            m.delta = measure(m)
            tried.append(m)
            if m.delta > best.delta + 1e-9:
                best, improved = m, True
                break
        if not improved:
            break
    bar.close()
    if verify_steps and verify_steps > evaluator.steps:
        best = _verify(searcher, evaluator, best, todo, tried, verify_steps, deadline, max_evaluations,
                       finalists_n, measure, sparse, progress)
    return best, baselines


def _verify(searcher, evaluator, best: Measured, fitting: list[Measured], tried: list[Measured],
            verify_steps: int, deadline, max_evaluations: int, finalists_n: int, measure, sparse,
            progress: bool) -> Measured:
    """The decision at the user's horizon: every hand baseline that fits, the short-horizon winner
    and the best few other measured schemes are trained again for `verify_steps` steps (always,
    past the deadline too: they are what the result is never worse than), each one's `delta`
    becoming that longer measurement; then measured local moves from the winner at that horizon
    (until the deadline or `max_evaluations`).  The winner's delta is therefore >= every fitting
    baseline's, both measured by the same trainer, steps and held-out batches."""
    from tqdm import tqdm

    groups = searcher.groups
    ident = lambda m: (repr(m.lora), tuple(sorted(m.update.items())))  # noqa: E731
    finalists, seen = [], set()
    ranked = sorted((b for b in tried if b.delta is not None), key=lambda b: -b.delta)
    for b in [best, *fitting, *ranked[:finalists_n - 1]]:
        if ident(b) not in seen:
            seen.add(ident(b))
            finalists.append(b)
    bar = tqdm(total=len(finalists) + max_evaluations, desc=f"verification at {verify_steps} steps", unit="eval",
               disable=not progress)
    for f in finalists:
        f.short_delta, f.delta, f.steps = f.delta, measure(f, verify_steps), verify_steps
        bar.update(1)
    k = max(range(len(finalists)), key=lambda i: (finalists[i].delta, finalists[i] is best))
    best = finalists[k]
    evals, seen_schemes = 0, {f.scheme for f in finalists if f.lora is None}
    improved = True
    while improved and best.lora is None and best.update == scheme_update(groups, best.scheme) \
            and evals < max_evaluations and (deadline is None or time.monotonic() < deadline):
        improved = False
        for nxt in _moves(searcher, best.scheme, limit=8):
            if evals >= max_evaluations or (deadline is not None and time.monotonic() > deadline):
                break
            if nxt in seen_schemes:
                continue
            seen_schemes.add(nxt)
            evals += 1
            m = sparse("searched", nxt)
            m.delta, m.steps = measure(m, verify_steps), verify_steps
            bar.update(1)
            if m.delta > best.delta + 1e-9:
                best, improved = m, True
                break
    bar.close()
    return best


def _moves(searcher, cur: tuple, limit: int = 6) -> list[tuple]:
    """Feasible neighbours of `cur`, most promising first by the single-option contributions:
    add or widen a group; swap the least contributing group for a better one."""
    delta = searcher.contrib.delta
    groups = searcher.groups
    cands = []
    for gi, g in enumerate(groups):
        for o in range(cur[gi] + 1, len(g.ratios) + 1):
            gain = delta[(gi, o)] - (delta[(gi, cur[gi])] if cur[gi] else 0.0)
            if gain > 0:
                cands.append((gain, cur[:gi] + (o,) + cur[gi + 1:]))
    chosen = [gi for gi, o in enumerate(cur) if o]
    if chosen:
        worst = min(chosen, key=lambda gi: delta[(gi, cur[gi])])
        dropped = cur[:worst] + (0,) + cur[worst + 1:]
        for gi, g in enumerate(groups):
            if dropped[gi] == 0 and gi != worst:
                for o in range(1, len(g.ratios) + 1):
                    gain = delta[(gi, o)] - delta[(worst, cur[worst])]
                    if gain > 0:
                        cands.append((gain, dropped[:gi] + (o,) + dropped[gi + 1:]))
    cands.sort(key=lambda c: -c[0])
    out = []
    for _, s in cands:
        if s not in out and searcher.feasible(s):
            out.append(s)
            if len(out) >= limit:
                break
    return out
