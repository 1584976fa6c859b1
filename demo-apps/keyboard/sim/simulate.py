"""Host simulation of one keyboard user (what `make demo` runs).

The base model (pretrained on Debian's `fortunes`, model/pretrain.py) meets a user who
types legal prose (data/corpus.txt). The user's sentences arrive in rounds; each round
goes into the on-device training buffer, the training policy (the same rule as
shared/.../TrainingPolicy.kt) decides how many small steps to run, and PockEngine's
compiled training step fine-tunes the model, once with a full update and once with the
sparse scheme the app ships. After every round, top-1/top-3 next-word accuracy is
measured on the user's held-out sentences with the compiled forward.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import pockengine as pe
from ..model import corpora, lm
from ..model.tokenizer import Tokenizer


@dataclass
class Policy:
    """shared/src/.../TrainingPolicy.kt with the same defaults: train once at least
    min_new_tokens new tokens are buffered, `passes` passes over the buffer in steps of
    BATCH x SEQ windows, at most max_steps steps a session."""
    min_new_tokens: int = 200
    passes: float = 2.0
    max_steps: int = 150

    def steps(self, new_tokens: int, buffered_tokens: int, batch: int, seq: int) -> int:
        if new_tokens < self.min_new_tokens:
            return 0
        return min(self.max_steps, math.ceil(self.passes * buffered_tokens / (batch * seq)))


@dataclass
class Run:
    name: str
    update: object
    stats: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)   # (sentences typed, top-1, top-3)
    losses: list = field(default_factory=list)
    step_seconds: float = 0.0
    steps: int = 0


def windows(ids: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    starts = rng.integers(0, max(1, len(ids) - seq - 1), batch)
    x = np.stack([ids[s:s + seq] for s in starts])
    y = np.stack([ids[s + 1:s + seq + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def sample_batches(n: int = 8, batch: int = lm.BATCH, seq: int = lm.SEQ, seed: int = 0) -> list:
    """n batches of text like the user's (the first typed sentences of data/corpus.txt) for
    pe.search_update / `pock-build --search`. A product would use proxy data of its users' domain."""
    tok = Tokenizer.load()
    typed, _ = corpora.split_user(corpora.user_sentences())
    ids = np.array([i for s in typed[:len(typed) // 3] for i in tok.encode_message(s)], dtype=np.int64)
    rng = np.random.default_rng(seed)
    return [tuple((t,) for t in windows(ids, batch, seq, rng)) for _ in range(n)]


def evaluate(trainer, tok: Tokenizer, ids: np.ndarray, batch: int, seq: int) -> tuple[float, float]:
    """Top-1 and top-3 next-word accuracy over consecutive BATCH x SEQ windows, counted
    where the next token is a word the strip can show, ranking only such words (as
    shared/.../SuggestionRanker.kt does)."""
    allowed = np.full(len(tok), -np.inf, dtype=np.float32)
    allowed[tok.suggestable] = 0.0
    per = batch * seq
    n = max(1, math.ceil((len(ids) - 1) / per))
    padded = np.concatenate([ids, np.zeros(n * per + 1 - len(ids), dtype=ids.dtype)])
    valid = np.zeros(n * per, dtype=bool)
    valid[:len(ids) - 1] = True
    top1 = top3 = count = 0
    for i in range(n):
        chunk = padded[i * per:(i + 1) * per + 1]
        x = torch.from_numpy(chunk[:-1].reshape(batch, seq).copy())
        logits = np.asarray(trainer.forward((x,))).reshape(per, -1) + allowed
        t = chunk[1:]
        keep = valid[i * per:(i + 1) * per] & np.isfinite(allowed[t])
        best = np.argpartition(-logits, 3, axis=1)[:, :3]
        order = np.take_along_axis(logits, best, 1).argsort(1)[:, ::-1]
        best = np.take_along_axis(best, order, 1)
        top1 += int((best[:, 0] == t)[keep].sum())
        top3 += int((best == t[:, None]).any(1)[keep].sum())
        count += int(keep.sum())
    return top1 / count, top3 / count


def simulate(rounds: int = 6, batch: int = lm.BATCH, seq: int = lm.SEQ, policy: Policy | None = None,
             lr: float = 3e-3, schemes: dict | None = None, model_fn=lm.load_base,
             tok: Tokenizer | None = None, sentences: list[str] | None = None, log=print) -> dict:
    policy = policy or Policy()
    tok = tok or Tokenizer.load()
    sentences = sentences if sentences is not None else corpora.user_sentences()
    typed, held = corpora.split_user(sentences)
    held_ids = np.array([i for s in held for i in tok.encode_message(s)], dtype=np.int64)
    arrivals = np.array_split(np.arange(len(typed)), rounds)
    log(f"user: {len(typed)} typed sentences in {rounds} rounds, {len(held)} held out "
        f"({len(held_ids)} tokens)")
    schemes = schemes or {"full": "full", "sparse": lm.SPARSE_UPDATE}
    runs = [Run(name, update) for name, update in schemes.items()]
    base = None
    for run in runs:
        model = model_fn()
        x, y = windows(held_ids, batch, seq, np.random.default_rng(0))
        t0 = time.time()
        prog = pe.compile(model, (x,), (y,), loss="cross_entropy", update=run.update,
                          optimizer=pe.AdamW(lr=lr, weight_decay=0.0))
        run.stats = prog.stats()
        trainer = prog.build()
        log(f"[{run.name}] compiled and built in {time.time() - t0:.1f}s: trains "
            f"{run.stats['trainable_elements'] / 1e6:.2f}M of "
            f"{run.stats['total_parameter_elements'] / 1e6:.2f}M parameters, training memory "
            f"{(run.stats['arena_bytes'] + run.stats['state_bytes']) / 2**20:.1f} MiB")
        if base is None:
            base = evaluate(trainer, tok, held_ids, batch, seq)
            log(f"base model on the user's held-out text: top-1 {base[0]:.1%}, top-3 {base[1]:.1%}")
        run.curve.append((0, *base))
        rng = np.random.default_rng(1)
        buffer: list[int] = []
        new_tokens = typed_count = 0
        for r, idx in enumerate(arrivals):
            for i in idx:   # the user types; each sentence lands in the buffer
                ids = tok.encode_message(typed[i])
                buffer += ids
                new_tokens += len(ids)
            typed_count += len(idx)
            steps = policy.steps(new_tokens, len(buffer), batch, seq)
            if steps:
                stream = np.array(buffer, dtype=np.int64)
                t0 = time.time()
                for _ in range(steps):
                    run.losses.append(trainer.step(*((t,) for t in windows(stream, batch, seq, rng))))
                run.step_seconds += time.time() - t0
                run.steps += steps
                new_tokens = 0
            acc = evaluate(trainer, tok, held_ids, batch, seq)
            run.curve.append((typed_count, *acc))
            log(f"[{run.name}] round {r + 1}/{rounds}: {typed_count} sentences typed, {steps} steps "
                f"(loss {np.mean(run.losses[-max(steps, 1):]):.2f}) -> top-1 {acc[0]:.1%}, top-3 {acc[1]:.1%}")
        trainer.close()
    return {"base": base, "runs": runs, "typed": len(typed), "held": len(held), "held_tokens": len(held_ids)}


def table(result: dict) -> str:
    b1, b3 = result["base"]
    rows = ["| model | trains | training memory | ms/step | top-1 | top-3 | top-3 lift |",
            "|---|---|---|---|---|---|---|",
            f"| base (fortunes) | - | - | - | {b1:.1%} | {b3:.1%} | - |"]
    for run in result["runs"]:
        s, (_, t1, t3) = run.stats, run.curve[-1]
        ms = 1000 * run.step_seconds / max(run.steps, 1)
        rows.append(f"| personalized, {run.name} update | {s['trainable_elements'] / 1e6:.2f}M params | "
                    f"{(s['arena_bytes'] + s['state_bytes']) / 2**20:.1f} MiB "
                    f"(arena {s['arena_bytes'] / 2**20:.1f} + state {s['state_bytes'] / 2**20:.1f}) | "
                    f"{ms:.1f} | {t1:.1%} | {t3:.1%} | {100 * (t3 - b3):+.1f} pts |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, run in enumerate(result["runs"]):
        n, t1, t3 = zip(*run.curve)
        ax.plot(n, [100 * v for v in t3], marker="o", color=f"C{i}", label=f"top-3, {run.name} update")
        ax.plot(n, [100 * v for v in t1], marker=".", ls="--", color=f"C{i}", label=f"top-1, {run.name} update")
        if run.losses:
            k = 10
            sm = np.convolve(run.losses, np.ones(k) / k, mode="valid") if len(run.losses) >= k else run.losses
            ax2.plot(sm, color=f"C{i}", label=f"{run.name} update")
    ax.axhline(100 * result["base"][1], color="gray", lw=0.8, ls=":", label="base model, top-3")
    ax.set_xlabel("user sentences typed")
    ax.set_ylabel("held-out next-word accuracy (%)")
    ax.set_title("Personalization on the user's held-out text")
    ax.legend(fontsize=7)
    ax2.set_xlabel("on-device training step")
    ax2.set_ylabel("training loss (mean of 10 steps)")
    ax2.set_title("Compiled C++ training step")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
