"""Searched update scheme vs the hand baselines vs full update, on four transfer tasks.

    .venv/bin/python bench/search/run.py                      # lm, image, keyboard: ~5-10 minutes on 2 cores
    .venv/bin/python bench/search/run.py --tasks smollm2 --out /tmp/smol   # the real SmolLM2-135M: ~40 min
    .venv/bin/python bench/search/run.py --tasks "" --merge-from /tmp/smol/results.json  # one report
    .venv/bin/python bench/search/run.py --quick              # fewer steps, a smoke test

1. keyboard personalization: a word-level 2-layer LSTM LM (demo.py's tokenizer) is pretrained
   (PyTorch, briefly) on the GPL-3 and Apache-2.0 texts of demo-apps/keyboard/data/corpus.txt,
   then adapted to a "user" who writes the GFDL-1.3 text: its first 70% is the user's
   typing history (training), the last 30% is held out.
2. image transfer: a small MobileNetV2-style CNN is pretrained (PyTorch) on sklearn's 8x8
   handwritten digits 0-4, then transferred to the new classes 5-9 with a fresh 5-way
   classifier (60% of those images train, 40% held out).
3. transformer LM (issue 18's task): a GPT-style LM (2 blocks, d=48, tied embedding) learns a
   deterministic next-token rule from a random init, SGD(lr=0.5, momentum=0.9); budget: its
   frozen weights + 35% of the full update's training overhead.
4. SmolLM2 personalization (opt-in, smollm2_task.py): the pretrained SmolLM2-135M adapted to the
   GFDL-1.3 text; a short search (max_seconds) and 8 training steps per scheme.

For the keyboard and image tasks the budget is the full update's frozen weights and buffers plus
1/3 of its training memory (arena + optimizer state), and half its FLOPs; for SmolLM2 the same
without the FLOPs bound. pe.search's scheme is chosen from the sample batches of the task's
training data, measuring the hand baselines of search_baselines.py (LoRA at the same memory
among them) with the same compiled trainer. Where the task's budget is not simply 1/3 of full's
training memory, a second search at that memory-only budget gives the scheme for the ">= 90% of
full's loss drop at <= 1/3 of its training memory" criterion. Then full, the searched schemes and
every hand baseline are each trained for the same number of steps by PockEngine's compiled C++
step on the same batch stream, and evaluated on the held-out data. Writes bench/search/results.md,
results.png, results.json, sensitivity.png and one search report per task (<task>_report.md + PNGs).
"""
from __future__ import annotations

import argparse
import re
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("POCK_CACHE_DIR", str(ROOT / ".cache" / "pockengine"))

import pockengine as pe  # noqa: E402
from pockengine.search import Budget, SchemeCompiler, cost_of, search  # noqa: E402
from pockengine.search.baselines import fits  # noqa: E402
from pockengine.search.report import write_report  # noqa: E402
from models import InvertedResidual, KeyboardTransformer  # noqa: E402  (bench/models.py: the MobileNetV2 block, args inp, out, stride, expand)

MIB = 2 ** 20
CORPUS = ROOT / "demo-apps" / "keyboard" / "data" / "corpus.txt"


def tokenize(text: str) -> list[str]:
    """Lower-case words and punctuation (the keyboard demo's tokenizer)."""
    return re.findall(r"[a-z]+(?:'[a-z]+)?|[.,;:!?]", text.lower())


def build_vocab(words: list[str], size: int) -> dict[str, int]:
    vocab = {"<unk>": 0}
    for w, _ in Counter(words).most_common(size - 1):
        vocab[w] = len(vocab)
    return vocab


def topk_eval(logits: np.ndarray, t: np.ndarray) -> tuple[float, int, int]:
    """(summed cross-entropy, top-1 hits, top-3 hits) of logits [n, C] against targets [n]."""
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    best = np.argsort(-logits, axis=1)[:, :3]
    return (float(-logp[np.arange(len(t)), t].sum()), int((best[:, 0] == t).sum()),
            int((best == t[:, None]).any(1).sum()))


# -- keyboard ------------------------------------------------------------------------------------
class KeyboardLSTM(nn.Module):
    """Embedding -> 2-layer LSTM -> projection to the embedding size (tanh) -> output layer."""

    def __init__(self, vocab, emb=64, hidden=192, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, batch_first=True)
        self.proj = nn.Linear(hidden, emb)
        self.out = nn.Linear(emb, vocab)

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.out(torch.tanh(self.proj(h)))


def keyboard_task(quick: bool):
    lines = CORPUS.read_text().splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip() == "GNU Free Documentation License")
    base_words = tokenize("\n".join(lines[:start]))
    user_words = tokenize("\n".join(lines[start:]))
    vocab = build_vocab(base_words + user_words, 800)  # the keyboard's fixed vocabulary
    ids = lambda ws: np.array([vocab.get(w, 0) for w in ws], dtype=np.int64)  # noqa: E731
    base, user = ids(base_words), ids(user_words)
    split = int(0.7 * len(user))
    batch, seq = 8, 24

    def stream(arr, seed):
        rng = np.random.default_rng(seed)
        while True:
            s = rng.integers(0, len(arr) - seq - 1, batch)
            x = np.stack([arr[i:i + seq] for i in s])
            y = np.stack([arr[i + 1:i + seq + 1] for i in s])
            yield (torch.from_numpy(x),), (torch.from_numpy(y),)

    torch.manual_seed(0)
    model = KeyboardLSTM(len(vocab))
    pretrain(model, stream(base, 1), 150 if quick else 600, lr=3e-3)

    held = user[split:]

    def evaluate(trainer):
        """Next-word loss, top-1 and top-3 over consecutive held-out windows."""
        loss, top1, top3, n = 0.0, 0, 0, 0
        for i in range((len(held) - 1) // (batch * seq)):
            chunk = held[i * batch * seq:(i + 1) * batch * seq + 1]
            logits = trainer.forward((torch.from_numpy(chunk[:-1].reshape(batch, seq)),))
            lsum, h1, h3 = topk_eval(logits.reshape(-1, logits.shape[-1]), chunk[1:])
            loss, top1, top3, n = loss + lsum, top1 + h1, top3 + h3, n + len(chunk) - 1
        return loss / n, top1 / n, top3 / n

    desc = (f"2-layer LSTM LM (vocab {len(vocab)}, emb 64, hidden 192, projection 64), pretrained on "
            f"GPL-3 + Apache-2.0 "
            f"({len(base)} words), adapted to GFDL-1.3: {split} words of history, {len(held)} held out; "
            f"batch {batch} x seq {seq}")
    def sample_stream():
        """The search's sample: 12 batches of the history's first 85%, then (the search's held-out
        quarter) batches of its last 15%: windows that training never saw, so that a scheme that
        memorizes the history does not look good."""
        cut = int(0.85 * split)
        train_part, val_part = stream(user[:cut], 3), stream(user[cut:split], 4)
        for _ in range(12):
            yield next(train_part)
        while True:
            yield next(val_part)

    return dict(name="keyboard", model=model, train=stream(user[:split], 2), sample=sample_stream(),
                evaluate=evaluate, optimizer=pe.AdamW(lr=3e-4, weight_decay=0.0), desc=desc)


# -- image ---------------------------------------------------------------------------------------
class TinyMobileNetV2(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(InvertedResidual(16, 16, 1, 3), InvertedResidual(16, 24, 2, 3),
                                    InvertedResidual(24, 24, 1, 3), InvertedResidual(24, 32, 2, 3))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.blocks(F.relu6(self.bn0(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def image_task(quick: bool):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x_all = torch.from_numpy((digits.images / 16.0 - 0.5).astype(np.float32)).unsqueeze(1)
    y_all = torch.from_numpy(digits.target.astype(np.int64))
    rng = np.random.default_rng(0)
    old = rng.permutation(np.where(digits.target < 5)[0])
    new = rng.permutation(np.where(digits.target >= 5)[0])
    split = int(0.6 * len(new))
    new_train, new_held = new[:split], new[split:]
    batch = 32

    def stream(idx, offset, seed):
        r = np.random.default_rng(seed)
        while True:
            pick = r.choice(idx, batch, replace=False)
            yield (x_all[pick],), (y_all[pick] - offset,)

    torch.manual_seed(0)
    model = TinyMobileNetV2()
    pretrain(model, stream(old, 0, 1), 100 if quick else 400, lr=3e-3)
    torch.manual_seed(1)
    model.fc = nn.Linear(32, 5)  # a fresh classifier for the new classes

    def evaluate(trainer):
        loss, top1, top3, n = 0.0, 0, 0, 0
        for i in range(0, len(new_held), batch):
            idx = new_held[i:i + batch]
            pad = np.concatenate([idx, np.repeat(new_held[:1], batch - len(idx))])
            logits = trainer.forward((x_all[pad],))[:len(idx)]
            lsum, h1, h3 = topk_eval(logits, (y_all[idx] - 5).numpy())
            loss, top1, top3, n = loss + lsum, top1 + h1, top3 + h3, n + len(idx)
        return loss / n, top1 / n, top3 / n

    desc = (f"MobileNetV2-style CNN (stem + 4 inverted-residual blocks, BatchNorm, ReLU6), pretrained on "
            f"sklearn digits 0-4 ({len(old)} images), transferred to digits 5-9 with a fresh classifier: "
            f"{len(new_train)} training / {len(new_held)} held-out images; 8x8, batch {batch}")
    return dict(name="image", model=model, train=stream(new_train, 5, 2), sample=stream(new_train, 5, 3),
                evaluate=evaluate, optimizer=pe.AdamW(lr=2e-3, weight_decay=0.0), desc=desc)


def pretrain(model, data, steps, lr):
    """The base model (PyTorch, eager): what the device ships with."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        (x,), (y,) = next(data)
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


# -- transformer LM (issue 18's task) -------------------------------------------------------------
def lm_task(quick: bool):
    vocab, seq, batch = 64, 16, 16

    def stream(seed):
        g = torch.Generator().manual_seed(seed)
        while True:
            s = [torch.randint(0, vocab, (batch, 1), generator=g)]
            for _ in range(seq):
                s.append((3 * s[-1] + 1) % vocab)  # the rule: next = 3 * token + 1 (mod vocab)
            s = torch.cat(s, 1)
            yield (s[:, :-1].contiguous(),), (s[:, 1:].contiguous(),)

    held = [next(stream(99)) for _ in range(4)]

    def evaluate(trainer):
        loss, top1, top3, n = 0.0, 0, 0, 0
        for (x,), (y,) in held:
            logits = trainer.forward((x,))
            lsum, h1, h3 = topk_eval(logits.reshape(-1, vocab), y.reshape(-1).numpy())
            loss, top1, top3, n = loss + lsum, top1 + h1, top3 + h3, n + y.numel()
        return loss / n, top1 / n, top3 / n

    torch.manual_seed(0)
    model = KeyboardTransformer(vocab, d=48, layers=2, heads=2, ffn=192, seq=seq)
    model.head.weight = model.tok.weight  # the tied embedding
    desc = (f"GPT-style LM (2 blocks, d=48, 2 heads, tied {vocab}-token embedding), random init, learning "
            f"next = (3 * token + 1) mod {vocab}; batch {batch} x seq {seq}; SGD(lr=0.5, momentum=0.9)")
    return dict(name="lm", model=model, train=stream(2), sample=stream(3), evaluate=evaluate,
                optimizer=pe.SGD(lr=0.5, momentum=0.9), desc=desc, overhead_fraction=0.35, flops_fraction=None)


# -- the comparison --------------------------------------------------------------------------------
def train_rows(task, compiler, schemes, batches, steps: int) -> dict:
    """Train every scheme for `steps` steps on the same batches; held-out results and costs.
    A scheme is (label, update, lora, fits).  With task["restore_training"] (a large model) the
    sparse schemes share one build of the full-update step, every element outside the scheme put
    back after each step: exactly the scheme's own sparse step (search.Evaluator; SGD and AdamW
    update each element independently), one C++ build instead of one per scheme."""
    from tqdm import tqdm

    from pockengine.search import _restore_outside

    model, opt, name = task["model"], task["optimizer"], task["name"]
    shared = None
    if task.get("restore_training"):
        shared = compiler.program("full").build()
        original = {n: shared.get_tensor(n).copy() for n in compiler.shapes}
        ckpt = str(ROOT / ".cache" / f"search_{name}_start.pockckpt")
        shared.save(ckpt)
    rows = {}
    for label, update, lora, fitting in schemes:
        # a scheme's own build, unless the shared full-update step (elements outside the scheme put
        # back) is exactly it: not for LoRA, nor for a tied weight trained through one use
        own = shared is None or lora is not None or bool(compiler.tied_uses(update))
        if lora is not None:
            prog = compiler.lora_program(lora, update)
        else:
            prog = compiler.program(update) if own else None
        stats = compiler.program_stats(prog) if prog is not None else compiler.stats(update)
        if own:
            trainer = prog.build()
        else:
            trainer = shared
            trainer.load(ckpt)
        keep = None if (own or update == "full") else compiler.trained(update)
        before = task["evaluate"](trainer)
        losses = []
        t1 = time.time()
        for x, y in tqdm(batches[:steps], desc=f"{name}: {label}", unit="step", leave=False):
            losses.append(trainer.step(x, y))
            if keep is not None:
                _restore_outside(trainer, original, keep)
        train_s = time.time() - t1
        after = task["evaluate"](trainer)
        c = cost_of(stats)
        rows[label] = dict(update=update if isinstance(update, str) else dict(update),
                           lora=None if lora is None else dict(rank=lora.rank, alpha=lora.alpha,
                                                               targets=list(lora.targets)),
                           before=before, after=after, improvement=before[0] - after[0],
                           train_loss=float(np.mean(losses[-20:])), training_bytes=c["training_bytes"],
                           memory_bytes=c["memory_bytes"], arena_bytes=c["arena_bytes"],
                           optimizer_state_bytes=c["optimizer_state_bytes"], flops=c["flops_per_step"],
                           trainable=c["trainable_elements"], ms_per_step=train_s * 1e3 / steps if own else None,
                           fits=fitting)
        if own:
            trainer.close()
        print(f"  {label:48s} held-out loss {before[0]:.3f} -> {after[0]:.3f}, top-1 {after[1]:.1%}, "
              f"top-3 {after[2]:.1%}, {c['training_bytes'] / MIB:.3f} MiB, {c['flops_per_step'] / 1e6:.1f} MFLOP",
              flush=True)
    if shared is not None:
        shared.close()
    return rows


def run_task(task, steps: int, search_steps: int, seed: int, out: Path) -> dict:
    print(f"\n== {task['name']}: {task['desc']}", flush=True)
    model, opt = task["model"], task["optimizer"]
    steps = task.get("steps", steps)
    kw = dict(task.get("search", {}))
    search_steps = kw.pop("steps", search_steps)
    kw.setdefault("lora", True)
    kw.setdefault("verify_steps", steps)  # the finalists are re-trained for as many steps as the user will train
    sample = [next(task["sample"]) for _ in range(task.get("sample_batches", 16))]
    t0 = time.time()
    compiler = SchemeCompiler(model, *sample[0], optimizer=opt, name=task["name"])
    full = compiler.stats("full")
    frozen_bytes = full["state_bytes"] - full["optimizer_state_bytes"]
    full_training = full["arena_bytes"] + full["optimizer_state_bytes"]
    frac, ffrac = task.get("overhead_fraction", 1 / 3), task.get("flops_fraction", 0.5)
    budget = Budget(memory_mb=(frozen_bytes + full_training * frac) / MIB,
                    flops=None if ffrac is None else full["flops_per_step"] * ffrac)
    result = search(model, sample, optimizer=opt, budget=budget, seed=seed, steps=search_steps,
                    compiler=compiler, **kw)
    search_s = time.time() - t0
    print(result.describe(), flush=True)
    write_report(result, out / f"{task['name']}_report.md")
    # the ">= 90% of full's drop at <= 1/3 of its training memory" criterion: a memory-only budget
    # at 1/3 of full's training memory (the same search), unless the task's budget is that already
    third = Budget(memory_mb=(frozen_bytes + full_training / 3) / MIB)
    third_result, third_s = None, 0.0
    if budget != third:
        t1 = time.time()
        third_result = search(model, sample, optimizer=opt, budget=third, seed=seed, steps=search_steps,
                              compiler=compiler, **kw)
        third_s = time.time() - t1
        print("1/3-memory budget: " + third_result.describe().split("\n")[1], flush=True)

    batches = [next(task["train"]) for _ in range(steps)]  # one batch stream for every scheme
    schemes = [("full update", "full", None, False), ("searched", result.update, result.lora, True)]
    if third_result is not None:
        schemes.append(("searched, 1/3-memory budget", third_result.update, third_result.lora,
                        fits(third_result.cost, budget.limits())))
    schemes += [(f"hand: {b.name}", b.update, b.lora, b.fits) for b in result.baselines
                if b.fits or b.lora is not None or not task.get("train_fitting_only")]
    rows = train_rows(task, compiler, schemes, batches, steps)
    f = rows["full update"]
    fitting = [r for k, r in rows.items() if k.startswith("hand: ") and r["fits"]]
    best_hand = min((r["after"][0] for r in fitting), default=float("inf"))
    s = rows["searched"]
    inside = [r for k, r in rows.items() if k.startswith("searched") and r["training_bytes"] <= f["training_bytes"] / 3]
    crit = max(inside, key=lambda r: r["improvement"], default=None)
    checks = {
        "never worse than the best hand baseline in the budget (held-out loss, 1% tolerance)":
            s["after"][0] <= best_hand * 1.01,
        ">= 90% of full's loss drop at <= 1/3 of its training memory (searched)":
            crit is not None and crit["improvement"] >= 0.9 * f["improvement"],
    }
    return dict(name=task["name"], desc=task["desc"], steps=steps, search_steps=search_steps, seed=seed,
                decided_at_training_length=True,
                sample_batches=len(sample),
                search_seconds=search_s, third_search_seconds=third_s,
                budget=dict(memory_mb=budget.memory_mb, flops=budget.flops, describe=budget.describe()),
                third_budget=third.describe(), rows=rows, checks=checks,
                criterion_drop=None if crit is None else crit["improvement"] / f["improvement"],
                criterion_memory=None if crit is None else crit["training_bytes"] / f["training_bytes"],
                contributions_full_delta=result.contributions.full_delta,
                sensitivity={g.name: [(r_, result.contributions.delta[(gi, o + 1)]) for o, r_ in enumerate(g.ratios)]
                             for gi, g in enumerate(result.groups) if g.kind == "weight"},
                predicted_delta=result.predicted_delta)


def markdown(results: list[dict], wall_s: float) -> str:
    out = ["# Update-scheme search: searched vs the hand baselines vs full update", "",
           "Generated by `.venv/bin/python bench/search/run.py` (lm, image, keyboard) and, for smollm2, "
           "`bench/search/run.py --tasks smollm2 --out /tmp/smol` merged by `bench/search/run.py --tasks \"\" "
           "--merge --merge-from /tmp/smol/results.json` "
           + (f"(this run {wall_s / 60:.1f} min; load average {os.getloadavg()[0]:.1f} on 2 cores shared with other "
              "jobs, so times are slow). " if wall_s > 60 else "(search times were taken on 2 cores shared with other "
              "jobs at load 10-19, so they are slow). ") + "Every scheme is "
           "trained by PockEngine's compiled C++ step, the same steps on the same batches; loss and accuracy "
           "are on held-out data. Training memory = arena + optimizer state (weights and buffers are the same "
           "for every scheme and not counted); MFLOP = `prog.stats()['flops_per_step']`. Hand baselines include "
           "LoRA at the same memory (the largest rank that fits, alone or with biases/norms or the tail), "
           "compiled by `pe.compile(..., lora=...)` and measured by the same trainer. The search decides at the "
           "training length (`verify_steps` = the task's training steps): every hand baseline that fits, the "
           "short-horizon winner and the best measured schemes are re-trained that long on the search's sample "
           "batches, and measured add/widen/swap moves refine the winner there, so on the search's own held-out "
           "sample the result is never worse than any fitting baseline (by construction); the table below is an "
           "independent check on the task's held-out data. `probe_lm.md` and `probe_keyboard.md` "
           "(`bench/search/probe.py`) train fixed schemes near 1/3 of full's training memory: whether any scheme "
           "at 1/3 reaches 90% of full's drop, independently of the search.", "",
           "## Summary", "",
           "| task | searched (task budget) held-out loss | best hand baseline in budget | full update | "
           "searched: % of full's drop | memory vs full | MFLOP vs full | search s | best scheme <= 1/3 of full's "
           "memory: % of full's drop (memory vs full) | >= 90% at <= 1/3 | never worse than the best hand baseline "
           "in budget | best of every scheme <= 1/3 of full's memory |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f, s = r["rows"]["full update"], r["rows"]["searched"]
        fit = {k: v for k, v in r["rows"].items() if k.startswith("hand: ") and v["fits"]}
        bk = min(fit, key=lambda k: fit[k]["after"][0]) if fit else None
        hand = f"{fit[bk]['after'][0]:.3f} ({bk[6:]})" if bk else "none fits"
        crit = ("-" if r["criterion_drop"] is None else
                f"{r['criterion_drop']:.0%} ({r['criterion_memory']:.2f})")
        never, ok = list(r["checks"].values())[:2]
        third = {k: v for k, v in r["rows"].items() if k != "full update"
                 and v["training_bytes"] <= f["training_bytes"] / 3}
        ak = max(third, key=lambda k: third[k]["improvement"]) if third else None
        anyb = (f"{ak.removeprefix('hand: ')}: {third[ak]['improvement'] / f['improvement']:.0%} "
                f"({third[ak]['training_bytes'] / f['training_bytes']:.2f})") if ak else "-"
        out.append(f"| {r['name']} | {s['after'][0]:.3f} | {hand} | {f['after'][0]:.3f} | "
                   f"{s['improvement'] / f['improvement']:.0%} | {s['training_bytes'] / f['training_bytes']:.2f} | "
                   f"{s['flops'] / f['flops']:.2f} | {r['search_seconds']:.0f} | {crit} | "
                   f"{'met' if ok else 'not met'} | {'yes' if never else 'NO'} | {anyb} |")
    out.append("")
    for r in results:
        out += [f"## {r['name']}", "", r["desc"] + ".", ""]
        if not r.get("decided_at_training_length"):
            out += ["**From an earlier run**, before the search took its decision at the training length with "
                    "every fitting baseline re-trained that long; not re-run since (its search is the slowest).", ""]
        out += [
                f"Budget: {r['budget']['describe']}; search on {r.get('sample_batches', 16)} sample batches, {r['search_steps']} steps "
                f"per candidate, seed {r['seed']}, {r['search_seconds']:.0f} s (search time). Then {r['steps']} "
                "training steps each.",
                "", "| scheme | fits budget | held-out loss | loss drop | vs full | top-1 | top-3 | training MiB | "
                "vs full | MFLOP/step | vs full | trainable |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        f = r["rows"]["full update"]
        base = f["before"]
        out.append(f"| pretrained (no update) | - | {base[0]:.3f} | - | - | {base[1]:.1%} | {base[2]:.1%} | - | - | - "
                   "| - | - |")
        for label, row in r["rows"].items():
            out.append(f"| {label} | {'yes' if row['fits'] else 'no'} | {row['after'][0]:.3f} | {row['improvement']:.3f} | "
                       f"{row['improvement'] / f['improvement']:.0%} | {row['after'][1]:.1%} | {row['after'][2]:.1%} | "
                       f"{row['training_bytes'] / MIB:.3f} | {row['training_bytes'] / f['training_bytes']:.2f} | "
                       f"{row['flops'] / 1e6:.1f} | {row['flops'] / f['flops']:.2f} | {row['trainable']} |")
        out += [""]
        for label in ("searched", "searched, 1/3-memory budget"):
            if label in r["rows"]:
                row = r["rows"][label]
                lora = row.get("lora")
                text = ", ".join(f"{k}: {v:g}" for k, v in row["update"].items())
                if lora:
                    text += f" + LoRA(rank={lora['rank']}, alpha={lora['alpha']:g}, targets={lora['targets']})"
                out += [f"Scheme `{label}`: `{text}`", ""]
        if r.get("third_search_seconds"):
            out += [f"The 1/3-memory search (budget {r['third_budget']}) took {r['third_search_seconds']:.0f} s "
                    "(contributions reused from the cache).", ""]
        out += [
                "Targets: " + "; ".join(f"{k}: **{'met' if ok else 'MISSED'}**" for k, ok in r["checks"].items()),
                "", f"Search report: [{r['name']}_report.md]({r['name']}_report.md)", ""]
    out += ["![results](results.png)", "", "## Which layers matter", "",
            "Each weight layer updated alone (first k input channels), held-out loss drop after the "
            "search's steps: the paper's sensitivity curves, from our own measurements.", "",
            "![sensitivity](sensitivity.png)", ""]
    return "\n".join(out)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    labels = ["full update", "best hand baseline in budget", "searched"]
    colors = ["#9e9e9e", "#fd8d3c", "#2171b5"]
    width = 0.25

    def row(r, label):
        if label != "best hand baseline in budget":
            return r["rows"][label]
        fit = [v for k, v in r["rows"].items() if k.startswith("hand: ") and v["fits"]]
        return max(fit, key=lambda v: v["improvement"]) if fit else r["rows"]["full update"]

    for k, (key, title) in enumerate((("improvement", "held-out loss drop (higher is better)"),
                                      ("training_bytes", "training memory vs full"), ("flops", "FLOPs vs full"))):
        ax = axes[k]
        for j, label in enumerate(labels):
            vals = []
            for r in results:
                v = row(r, label)[key]
                vals.append(v if key == "improvement" else v / r["rows"]["full update"][key])
            ax.bar(np.arange(len(results)) + (j - 1) * width, vals, width, label=label, color=colors[j])
        ax.set_xticks(range(len(results)))
        ax.set_xticklabels([r["name"] for r in results])
        ax.set_title(title, fontsize=9)
        if key == "training_bytes":
            ax.axhline(1 / 3, color="#d62728", linestyle="--", linewidth=1)
        if key == "flops":
            ax.axhline(1 / 2, color="#d62728", linestyle="--", linewidth=1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sensitivity_plot(results: list[dict], path: Path, tasks=("lm", "image")) -> None:
    """The paper's "which layers matter" finding from our own measurements (the transformer and
    the CNN): left, the held-out loss drop of updating one weight layer alone against the ratio
    of its input channels updated, coloured by the layer's role in its block, lighter for
    earlier blocks; right, the drop at ratio 1 per block and role (numbers in the cells), and of
    the layers outside the blocks."""
    import re as _re

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.get("sensitivity") and r["name"] in tasks]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 2, figsize=(12, 4.2 * len(shown)), squeeze=False,
                             gridspec_kw=dict(width_ratios=[1.15, 1]))
    palette = plt.get_cmap("tab10")
    for row, r in zip(axes, shown):
        inblock, outside = {}, {}
        for name, pts in r["sensitivity"].items():
            m = _re.match(r"(?:.*\.)?blocks\.(\d+)\.(.+)\.weight$", name)
            if m:
                inblock[(int(m.group(1)), m.group(2))] = pts
            else:
                outside[name.removesuffix(".weight")] = pts
        roles = list(dict.fromkeys(role for _, role in sorted(inblock, key=lambda k: k[0])))
        nblocks = 1 + max((b for b, _ in inblock), default=0)
        ax = row[0]
        for (b, role), pts in sorted(inblock.items(), key=lambda kv: (kv[0][0], roles.index(kv[0][1]))):
            xs, ys = zip(*([(0.0, 0.0)] + [tuple(p) for p in pts]))
            ax.plot(xs, ys, marker="o", markersize=3, color=palette(roles.index(role)),
                    alpha=0.35 + 0.65 * (b + 1) / nblocks, linewidth=0.8 + 1.6 * (b + 1) / nblocks,
                    label=role if b == nblocks - 1 else None)
        ax.set_title(f"{r['name']}: held-out loss drop vs ratio updated, one layer at a time "
                     "(colour: role in the block; darker/thicker: later block)", fontsize=8)
        ax.set_xlabel("ratio of input channels updated")
        ax.set_ylabel("held-out loss drop")
        ax.legend(fontsize=7, title="layer in block", title_fontsize=7)
        full = {k: pts[-1][1] for k, pts in inblock.items()}
        grid = np.full((len(roles), nblocks), np.nan)
        for (b, role), v in full.items():
            grid[roles.index(role), b] = v
        ax = row[1]
        extra = list(outside.items())
        im = ax.imshow(grid, cmap="Blues", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=8,
                        color="white" if v > np.nanmax(grid) * 0.6 else "black")
        ax.set_xticks(range(nblocks))
        ax.set_xticklabels([f"block {b}" for b in range(nblocks)], fontsize=8)
        ax.set_yticks(range(len(roles)))
        ax.set_yticklabels(roles, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.04)
        outs = ", ".join(f"{k} {pts[-1][1]:.3f}" for k, pts in extra)
        ax.set_title(f"{r['name']}: loss drop at ratio 1, per block and layer\noutside the blocks: {outs}",
                     fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pretraining and training steps")
    ap.add_argument("--steps", type=int, default=None, help="training steps per scheme (default 150)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", default="lm,image,keyboard",
                    help="comma-separated from lm, image, keyboard, smollm2 (smollm2: opt-in, the real SmolLM2-135M)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other tasks' results of an earlier run (results.json) and replace these")
    ap.add_argument("--merge-from", default=None,
                    help="a results.json of another run whose tasks are added (e.g. a separate --tasks smollm2 run)")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    steps = args.steps or (60 if args.quick else 150)
    t0 = time.time()
    def smollm2(quick):
        from smollm2_task import smollm2_task  # opt-in: loads the 135M model (~10-20 min with its search)
        return smollm2_task(quick)

    makers = {"keyboard": keyboard_task, "image": image_task, "lm": lm_task, "smollm2": smollm2}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [run_task(makers[t](args.quick), steps, 5 if args.quick else 10, args.seed, out)
               for t in args.tasks.split(",") if t]
    if args.merge_from:
        extra = json.loads(Path(args.merge_from).read_text())
        results = [r for r in results if r["name"] not in {x["name"] for x in extra}] + extra
    wall = time.time() - t0
    if args.merge and (out / "results.json").is_file():
        old = [r for r in json.loads((out / "results.json").read_text())
               if r["name"] not in {x["name"] for x in results}]
        results = old + results
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    (out / "results.md").write_text(markdown(results, wall))
    plot(results, out / "results.png")
    sensitivity_plot(results, out / "sensitivity.png")
    print(f"\n{out / 'results.md'} ({wall / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
