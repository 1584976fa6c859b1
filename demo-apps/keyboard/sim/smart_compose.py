"""Smart compose on the keyboard: SmolLM2-135M personalized with LoRA on the user's typed
sentences, then suggesting the next words — through the same C API the apps call.

    python -m keyboard.sim.demo --smart-compose [--steps 40] [--seq 64]

The keyboard demo's user (legal prose, data/corpus.txt) types the same sentences the LSTM
keyboard model trains on (model/corpora.py's typed / held-out split). The host simulation
drives exactly what the Android input method and the iOS keyboard extension call:

    PockTokenizer.encode (the runtime's C++ tokenizer, read from the model's GGUF)
      -> PockTrainer.step (the compiled LoRA training step)
      -> PockTrainer.generate (prefill + KV-cached decode from the trainer's weights in place)

Python's `pe.Tokenizer` and `Trainer` are ctypes over `pock.h`, the same C functions the
Kotlin (JNI) and Swift layers call. Before and after training it measures held-out
perplexity, next-word top-1 / top-3 (a suggestion is the word the model completes greedily
from each of its three most likely word-starting tokens, as the keyboard's suggestion strip
shows them) and a few completions, and writes out/smart_compose.png.
"""
from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the checkout
LORA_TARGETS = ["*.q_proj", "*.v_proj"]


@dataclass
class Scores:
    perplexity: float
    top1: float
    top3: float
    completions: dict = field(default_factory=dict)


class Suggester:
    """Next-word suggestions from a compiled causal LM: tokenizer -> forward -> generate."""

    def __init__(self, trainer, tok, seq: int):
        self.trainer, self.tok, self.seq = trainer, tok, seq
        self._starts: dict[int, bool] = {}

    def starts_word(self, token: int) -> bool:
        """Whether a token begins a new word (its text starts with a space)."""
        if token not in self._starts:
            self._starts[token] = self.tok.decode([token]).startswith(" ")
        return self._starts[token]

    def logits(self, ids: list[int]) -> np.ndarray:
        """[len(ids), vocab] next-token logits from the compiled forward (padded to the compiled shape)."""
        x = np.zeros((1, self.seq), np.int64)
        x[0, :len(ids)] = ids
        out = self.trainer.forward((x,))
        out = out[0] if isinstance(out, (list, tuple)) else out
        return out[0, :len(ids)]

    def complete_word(self, context: list[int], first: int) -> str:
        """The word that starts with token `first`, completed greedily until the next word starts
        (the streaming callback stops generation at the first token that begins a new word)."""
        new = self.trainer.generate(context + [first], max_new_tokens=4, temperature=0.0,
                                    callback=lambda t: self.starts_word(int(t)))
        cut = next((i for i, t in enumerate(new) if self.starts_word(int(t))), len(new))
        return _word(self.tok.decode([first] + [int(t) for t in new[:cut]]))

    def suggest(self, context: list[int], row_logits: np.ndarray, k: int = 3) -> list[str]:
        """Up to k distinct words, from the most likely word-starting tokens among the first 200
        (shared/.../SmartCompose.kt's suggestAfter: the apps' rule)."""
        order = np.argsort(-row_logits, kind="stable")
        out: list[str] = []
        for t in (int(t) for t in order[:200] if self.starts_word(int(t))):
            word = self.complete_word(context, t)
            if word and word not in out:
                out.append(word)
            if len(out) == k:
                break
        return out


def _word(text: str) -> str:
    m = re.match(r"\s*([\w'-]+)", text)
    return m.group(1).lower() if m else text.strip().lower()


def positions(tok, sentences: list[str], seq: int, limit: int) -> list[tuple[list[int], int, str]]:
    """(sentence ids, i, the word starting at token i) for word boundaries after the first words."""
    out = []
    for s in sentences:
        ids = tok.encode(s)[:seq]
        for i in range(3, len(ids)):
            text = tok.decode([ids[i]])
            if text.startswith(" ") and re.match(r" [A-Za-z]", text):
                j = i + 1
                while j < len(ids) and not tok.decode([ids[j]]).startswith(" "):
                    j += 1
                out.append((ids, i, _word(tok.decode(ids[i:j]))))
        if len(out) >= limit:
            break
    return out[:limit]


def perplexity(suggester: Suggester, chunks: list[list[int]]) -> float:
    total, n = 0.0, 0
    for ids in chunks:
        logits = suggester.logits(ids[:-1]).astype(np.float64)
        m = logits.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        total += float((lse - logits[np.arange(len(ids) - 1), ids[1:]]).sum())
        n += len(ids) - 1
    return math.exp(total / max(n, 1))


def evaluate(suggester: Suggester, held: list, chunks: list, prompts: list[str]) -> Scores:
    hits1 = hits3 = 0
    cache = {}
    for ids, i, word in held:
        key = tuple(ids)
        if key not in cache:
            cache[key] = suggester.logits(ids)
        got = suggester.suggest(list(ids[:i]), cache[key][i - 1])
        hits1 += bool(got) and got[0] == word
        hits3 += word in got
    completions = {p: suggester.tok.decode(suggester.trainer.generate(suggester.tok.encode(p), max_new_tokens=10))
                   for p in prompts}
    return Scores(perplexity(suggester, chunks), hits1 / max(len(held), 1), hits3 / max(len(held), 1),
                  completions)


def load_model():
    """SmolLM2-135M-Instruct in fp32, train mode. transformers dequantizes the GGUF (slow) once;
    the weights are kept as safetensors in the build cache ($POCK_CACHE_DIR/smollm2/, keyed by
    the GGUF's name, size and mtime) and later runs build the model from its config and them."""
    import json
    import os

    import torch
    from safetensors.torch import load_file, save_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from pockengine.build.host import cache_dir
    from pockengine.demo_llm import smollm2_dir

    gguf = smollm2_dir()
    st = gguf.stat()
    cached = cache_dir() / "smollm2" / f"{gguf.stem}-{st.st_size}-{int(st.st_mtime)}"
    if (cached / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cached), dtype=torch.float32)
        model.load_state_dict(load_file(cached / "model.safetensors"), strict=False)   # tied lm_head: one copy
        model.tie_weights()
        return model.train()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tmp = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    (tmp / "config.json").write_text(json.dumps(config))
    save_model(model, str(tmp / "model.safetensors"))
    try:
        os.replace(tmp, cached)
    except OSError:   # another process cached it first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return model.train()


def run(steps: int = 40, seq: int = 64, lr: float = 1e-3, held_positions: int = 200, frozen_dtype: str = "fp32",
        out: Path | None = None, log=print) -> dict:
    import torch
    from tqdm import tqdm

    import pockengine as pe
    from pockengine.demo_llm import smollm2_dir
    from ..model import corpora

    t0 = time.time()
    tok = pe.Tokenizer.from_pretrained(str(smollm2_dir()))   # the runtime's C++ tokenizer, from the GGUF
    model = load_model()   # the fp32 weights, cached after the first run
    typed, held = corpora.split_user(corpora.user_sentences())
    stream = tok.encode(" ".join(typed))
    train = [stream[s:s + seq + 1] for s in range(0, len(stream) - seq, seq)]  # SmartCompose.learn's windows
    held_ids = tok.encode(" ".join(held))
    chunks = [held_ids[s:s + seq + 1] for s in range(0, min(len(held_ids) - seq - 1, 8 * seq), seq)]
    test = positions(tok, held, seq, held_positions)
    prompts = [" ".join(s.split()[:4]) for s in held[:3]]
    x0 = torch.from_numpy(np.array([train[0][:-1]], np.int64))
    y0 = torch.from_numpy(np.array([train[0][1:]], np.int64))
    from ..model import spec   # the program pock-build makes for the apps (spec.py:make_smart_compose)
    prog = pe.compile(**spec.make_smart_compose(seq, lr, frozen_dtype, model=model, example=(x0, y0)))
    trainer = prog.build()
    st = prog.stats()
    mem = (st["arena_bytes"] + st["state_bytes"]) / 2**20
    log(f"[smart compose] SmolLM2-135M, LoRA r=8 on q/v ({st['trainable_elements'] / 1e6:.2f}M trained), "
        f"{seq} tokens per step, training memory {mem:.1f} MiB; compiled and built in {time.time() - t0:.0f}s")
    log(f"[smart compose] user: {len(typed)} typed sentences ({len(stream)} tokens), "
        f"{len(test)} held-out next-word positions")
    suggester = Suggester(trainer, tok, seq)
    before = evaluate(suggester, test, chunks, prompts)
    log(f"[smart compose] before: perplexity {before.perplexity:.2f}, next-word top-1 {before.top1:.1%}, "
        f"top-3 {before.top3:.1%}")
    losses, t1 = [], time.time()
    for i in tqdm(range(steps), desc="[smart compose] training", unit="step"):
        ids = train[i % len(train)]
        losses.append(trainer.step((np.array([ids[:-1]], np.int64),), (np.array([ids[1:]], np.int64),)))
    ms = 1000 * (time.time() - t1) / max(steps, 1)
    after = evaluate(suggester, test, chunks, prompts)
    log(f"[smart compose] after {steps} steps ({ms:.0f} ms/step): perplexity {after.perplexity:.2f}, "
        f"next-word top-1 {after.top1:.1%}, top-3 {after.top3:.1%}")
    for p in prompts:
        log(f"  {p!r}\n    before: {before.completions[p]!r}\n    after:  {after.completions[p]!r}")
    trainer.close()
    result = {"before": before, "after": after, "losses": losses, "ms_per_step": ms, "memory_mib": mem,
              "trained": st["trainable_elements"], "positions": len(test), "steps": steps}
    if out is not None:
        plot(result, out)
    return result


def table(result: dict, lstm: dict | None = None) -> str:
    """Both keyboard models on the same user's held-out text."""
    b, a = result["before"], result["after"]
    rows = ["| model | trains | training memory | next-word top-1 | top-3 | held-out perplexity |",
            "|---|---|---|---|---|---|"]
    if lstm is not None:
        b1, b3 = lstm["base"]
        run = lstm["runs"][-1]
        _, t1, t3 = run.curve[-1]
        s = run.stats
        rows.append(f"| LSTM keyboard, base -> {run.name} update | {s['trainable_elements'] / 1e6:.2f}M params | "
                    f"{(s['arena_bytes'] + s['state_bytes']) / 2**20:.1f} MiB | {b1:.1%} -> {t1:.1%} | "
                    f"{b3:.1%} -> {t3:.1%} | - |")
    rows.append(f"| SmolLM2-135M, base -> LoRA r=8 | {result['trained'] / 1e6:.2f}M params | "
                f"{result['memory_mib']:.1f} MiB | {b.top1:.1%} -> {a.top1:.1%} | {b.top3:.1%} -> {a.top3:.1%} | "
                f"{b.perplexity:.2f} -> {a.perplexity:.2f} |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    b, a = result["before"], result["after"]
    xs = np.arange(2)
    ax.bar(xs - 0.2, [100 * b.top1, 100 * b.top3], 0.4, label="before")
    ax.bar(xs + 0.2, [100 * a.top1, 100 * a.top3], 0.4, label="after LoRA")
    ax.set_xticks(xs, ["next-word top-1", "top-3"])
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"SmolLM2 smart compose ({result['positions']} positions)")
    ax.legend(fontsize=8)
    ax2.plot(result["losses"], color="C2")
    ax2.set_xlabel("on-device training step")
    ax2.set_ylabel("training loss")
    ax2.set_title(f"perplexity {b.perplexity:.1f} -> {a.perplexity:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None, lstm: dict | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m keyboard.sim.demo --smart-compose", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--positions", type=int, default=200, help="held-out next-word positions scored (200: one is half a point)")
    ap.add_argument("--frozen-dtype", default="fp32", choices=["fp32", "bf16", "fp16", "int8", "q4"])
    ap.add_argument("--out", default=str(Path("out") / "smart_compose.png"))
    args, _ = ap.parse_known_args(argv)
    result = run(args.steps, args.seq, args.lr, args.positions, args.frozen_dtype, Path(args.out))
    print("\n" + table(result, lstm))
    print(f"plot: {args.out}")
    return result
