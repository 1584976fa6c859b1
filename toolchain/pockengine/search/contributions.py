"""Contribution analysis of the scheme search (PockEngine, MICRO 2023, section 4.2): every
option fine-tuned alone for a few steps by the compiled full-update step (`Evaluator`,
`measure_contributions`), and the per-model cache of its results."""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from ..ops import FULL
from ..errors import PockError
from ..frontends.torch_export import check_example
from .compiler import SchemeCompiler


def _check_batches(batches, compiler: SchemeCompiler) -> list[tuple[tuple, tuple]]:
    if not isinstance(batches, (list, tuple)) or not batches:
        raise PockError("batches must be a non-empty list of (inputs, targets) tuples")
    out = []
    for i, b in enumerate(batches):
        if not isinstance(b, (list, tuple)) or len(b) != 2:
            raise PockError(f"batches[{i}] must be an (inputs, targets) tuple")
        inputs = check_example(b[0], f"batches[{i}] inputs")
        targets = check_example(b[1], f"batches[{i}] targets")
        for what, got, want in (("inputs", inputs, compiler.inputs), ("targets", targets, compiler.targets)):
            if len(got) != len(want) or any(tuple(a.shape) != tuple(w.shape) or a.dtype != w.dtype
                                            for a, w in zip(got, want)):
                raise PockError(f"batches[{i}] {what} have shapes {[tuple(a.shape) for a in got]}, but "
                                f"batches[0] has {[tuple(w.shape) for w in want]}; all batches need one shape")
        out.append((inputs, targets))
    return out


def split_batches(batches: list) -> tuple[list, list]:
    """(train, eval): with 4 or more batches the last quarter is held out for measuring the
    loss; with fewer, the same batches serve both."""
    if len(batches) >= 4:
        n_eval = max(1, len(batches) // 4)
        return batches[:-n_eval], batches[-n_eval:]
    return batches, batches


@dataclass
class Contributions:
    base_loss: float                      # mean evaluation loss before fine-tuning
    delta: dict[tuple[int, int], float]   # (group index, option) -> loss drop
    steps: int
    ms_per_flop: float                    # measured on the full-update step
    full_delta: float                     # loss drop of the full update, same steps
    complete: bool = True                 # False: max_seconds ran out, unmeasured options count 0


def _eval_loss(trainer, batches) -> float:
    """Mean training-mode loss of the batches with the weights unchanged (learning rate 0)."""
    lr = trainer.learning_rate
    trainer.learning_rate = 0.0
    try:
        return float(np.mean([trainer.step(x, y) for x, y in batches]))
    finally:
        trainer.learning_rate = lr


class Evaluator:
    """Measured held-out loss drops of update schemes: each scheme is fine-tuned for `steps`
    steps (cycling the training batches) from the same start by the compiled full-update step,
    putting back every element outside the scheme after each step, which is exactly the
    scheme's own sparse step (SGD and AdamW update every element independently); its value is
    the drop of the mean loss on the held-out batches.  Results are cached per scheme."""

    def __init__(self, compiler: SchemeCompiler, batches, steps: int):
        self.compiler, self.steps = compiler, steps
        self.train, self.evalb = split_batches(batches)
        prog = compiler.program("full")
        self.flops_full = prog.stats()["flops_per_step"]
        self.trainer = prog.build()
        self.original = {n: self.trainer.get_tensor(n).copy() for n in compiler.shapes}
        self._tmp = tempfile.TemporaryDirectory()
        self.ckpt = os.path.join(self._tmp.name, "start.pockckpt")
        self.trainer.save(self.ckpt)
        self.base = _eval_loss(self.trainer, self.evalb)
        self.step_s, self.nsteps, self.evaluations = 0.0, 0, 0
        self._cache: dict[tuple, float] = {}
        self._own_trainers: dict[tuple, tuple] = {}

    def delta(self, update: dict | None, steps: int | None = None) -> float:
        """Held-out loss drop after fine-tuning `update` (None: the full update) for `steps`
        steps (default: the evaluator's)."""
        steps = self.steps if steps is None else steps
        trained, uses = (None, {}) if update is None else self.compiler.resolve(update)
        key = (steps, None if trained is None else self.compiler.key(trained, uses))
        if uses:  # the shared full-update step computes the summed gradient of a tied weight
            return self._own_delta(key, key[1], lambda: self.compiler.program(update), steps)
        if key not in self._cache:
            self.trainer.load(self.ckpt)
            for i in range(steps):
                x, y = self.train[i % len(self.train)]
                t0 = time.perf_counter()
                self.trainer.step(x, y)
                self.step_s, self.nsteps = self.step_s + time.perf_counter() - t0, self.nsteps + 1
                if trained is not None:
                    _restore_outside(self.trainer, self.original, trained)
            self._cache[key] = self.base - _eval_loss(self.trainer, self.evalb)
            self.evaluations += 1
        return self._cache[key]

    def _own_delta(self, key: tuple, tkey: tuple, program, steps: int) -> float:
        """Held-out loss drop after `steps` steps of a scheme's own compiled program (`program()`,
        built once per `tkey`), from the evaluator's start, on the same batches: LoRA schemes, and
        schemes whose gradient the shared full-update step does not compute (a tied weight
        trained through one use)."""
        if key not in self._cache:
            if tkey not in self._own_trainers:
                trainer = program().build()
                path = os.path.join(self._tmp.name, f"own{len(self._own_trainers)}.pockckpt")
                trainer.save(path)
                self._own_trainers[tkey] = (trainer, path)
            trainer, path = self._own_trainers[tkey]
            trainer.load(path)
            for i in range(steps):
                trainer.step(*self.train[i % len(self.train)])
            self._cache[key] = self.base - _eval_loss(trainer, self.evalb)
            self.evaluations += 1
        return self._cache[key]

    def lora_delta(self, lora, update: dict, steps: int | None = None) -> float:
        """Held-out loss drop of a LoRA scheme (adapters `lora` beside the sparse `update`)
        after `steps` steps of its own compiled program, from the same start, on the same
        batches.  The adapters start at B = 0, so the start loss is the evaluator's."""
        steps = self.steps if steps is None else steps
        tkey = self.compiler.lora_key(lora, update)
        return self._own_delta((steps, "lora", tkey), ("lora", tkey), lambda: self.compiler.lora_program(lora, update),
                               steps)

    @property
    def ms_per_flop(self) -> float:
        return self.step_s * 1e3 / max(self.nsteps, 1) / max(self.flops_full, 1)

    def close(self) -> None:
        self.trainer.close()
        for trainer, _ in self._own_trainers.values():
            trainer.close()
        self._own_trainers.clear()
        self._tmp.cleanup()


def measure_contributions(compiler: SchemeCompiler, groups: list, batches, steps: int = 10,
                          progress: bool = True, evaluator: Evaluator | None = None,
                          deadline: float | None = None) -> Contributions:
    """Fine-tune every option alone for `steps` steps with the compiled full-update step
    (Evaluator); groups: the search's candidate groups (search.Group).  Past `deadline`
    (time.monotonic()) the options not yet measured count 0."""
    from tqdm import tqdm

    own = evaluator is None
    ev = evaluator if evaluator is not None else Evaluator(compiler, batches, steps)
    options = [(gi, o) for gi, g in enumerate(groups) for o in range(1, len(g.ratios) + 1)]
    delta, complete = {}, True
    try:
        full_delta = ev.delta(None)
        bar = tqdm(options, desc="contribution analysis", unit="option", disable=not progress)
        for gi, o in bar:
            if deadline is not None and time.monotonic() > deadline:
                delta[(gi, o)], complete = 0.0, False
                continue
            bar.set_postfix_str(f"{groups[gi].name} x{groups[gi].ratios[o - 1]:g}", refresh=False)
            delta[(gi, o)] = ev.delta(groups[gi].update(o))
    finally:
        if own:
            ev.close()
    return Contributions(ev.base, delta, steps, ev.ms_per_flop, full_delta, complete)


def _restore_outside(trainer, original: dict, keep: dict) -> None:
    """Put back every parameter element outside `keep` ({name: FULL or k})."""
    for name, orig in original.items():
        k = keep.get(name)
        if k is FULL:
            continue
        if k is None:
            trainer.set_tensor(name, orig)
        else:
            cur = trainer.get_tensor(name)
            cur[:, k:] = orig[:, k:]
            trainer.set_tensor(name, cur)


# -- contribution cache (per model, data, optimizer and steps) ------------------------------------
def _cache_key(compiler: SchemeCompiler, batches, steps: int, groups) -> str:
    import hashlib

    h = hashlib.sha256()
    h.update(repr((compiler.name, compiler.loss, repr(compiler.optimizer), steps,
                   [(g.name, g.params, g.ratios) for g in groups], sorted(compiler.frozen))).encode())
    h.update(repr([(f, repr(getattr(compiler.spec, f))) for f in ("output", "lora", "frozen_dtype", "exact_skip")]).encode())
    for name, v in sorted(compiler.train_graph.state.items()):
        if v.data is not None:
            h.update(name.encode())
            h.update(np.ascontiguousarray(v.data).tobytes())
    h.update(str([n.op for n in compiler.train_graph.nodes]).encode())
    for x, y in batches:
        for t in (*x, *y):
            h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:32]


def _cache_path(key: str):
    from ..build.host import cache_dir
    return cache_dir() / "search" / f"{key}.json"


def _load_cached(compiler, batches, steps, groups) -> Contributions | None:
    import json
    try:
        d = json.loads(_cache_path(_cache_key(compiler, batches, steps, groups)).read_text())
        delta = {(int(k.split(":")[0]), int(k.split(":")[1])): float(v) for k, v in d["delta"].items()}
        return Contributions(d["base_loss"], delta, d["steps"], d["ms_per_flop"], d["full_delta"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store_cached(compiler, batches, steps, groups, c: Contributions) -> None:
    import json
    try:
        path = _cache_path(_cache_key(compiler, batches, steps, groups))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{id(c)}")
        tmp.write_text(json.dumps({"base_loss": c.base_loss, "steps": c.steps, "ms_per_flop": c.ms_per_flop,
                                   "full_delta": c.full_delta,
                                   "delta": {f"{g}:{o}": v for (g, o), v in c.delta.items()}}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the next search its contribution analysis
