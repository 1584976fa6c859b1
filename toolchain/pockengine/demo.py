"""`make demo`: compile the bundled keyboard next-word model and fine-tune it
on the host, in the generated C++, on bundled English text."""
from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import pockengine as pe
from .codegen import ROOT

CORPUS = ROOT / "demo-apps" / "keyboard" / "data" / "corpus.txt"


class KeyboardLM(nn.Module):
    """Word-level next-word model: embedding -> LSTM -> output projection."""

    def __init__(self, vocab: int, emb: int = 64, hidden: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.out(h)


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z]+(?:'[a-z]+)?|[.,;:!?]", text.lower())


def build_vocab(words: list[str], size: int) -> dict[str, int]:
    vocab = {"<unk>": 0}
    for w, _ in Counter(words).most_common(size - 1):
        vocab[w] = len(vocab)
    return vocab


def batches(ids: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(ids) - seq - 1, batch)
        x = np.stack([ids[s:s + seq] for s in starts])
        y = np.stack([ids[s + 1:s + seq + 1] for s in starts])
        yield torch.from_numpy(x), torch.from_numpy(y)


def evaluate(trainer, ids: np.ndarray, batch: int, seq: int) -> tuple[float, float, float]:
    """Held-out loss, top-1 and top-3 next-word accuracy over consecutive windows."""
    n = (len(ids) - 1) // (batch * seq)
    losses, top1, top3, count = [], 0, 0, 0
    for i in range(n):
        chunk = ids[i * batch * seq:(i + 1) * batch * seq + 1]
        x = chunk[:-1].reshape(batch, seq)
        y = chunk[1:].reshape(batch, seq)
        logits = trainer.forward((torch.from_numpy(x),)).reshape(-1, logits_dim(trainer))
        t = y.reshape(-1)
        logp = logits - logits.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        losses.append(-logp[np.arange(len(t)), t].mean())
        best = np.argsort(-logits, axis=1)[:, :3]
        top1 += int((best[:, 0] == t).sum())
        top3 += int((best == t[:, None]).any(1).sum())
        count += len(t)
    return float(np.mean(losses)), top1 / count, top3 / count


def logits_dim(trainer) -> int:
    return trainer.outputs[0].shape[-1]


def main(steps: int = 500, batch: int = 8, seq: int = 16, vocab_size: int = 1500) -> None:
    from tqdm import tqdm

    torch.manual_seed(0)
    words = tokenize(CORPUS.read_text())
    vocab = build_vocab(words, vocab_size)
    ids = np.array([vocab.get(w, 0) for w in words], dtype=np.int64)
    split = int(0.85 * len(ids))
    train_ids, held_ids = ids[:split], ids[split:]
    print(f"corpus: {len(words)} words ({CORPUS.relative_to(ROOT)}), vocabulary {len(vocab)}, "
          f"train {len(train_ids)} / held-out {len(held_ids)} tokens")

    model = KeyboardLM(len(vocab))
    rng = np.random.default_rng(0)
    data = batches(train_ids, batch, seq, rng)
    x, y = next(data)
    t0 = time.time()
    prog = pe.compile(model, (x,), (y,), loss="cross_entropy", update="full", optimizer=pe.AdamW(lr=3e-3))
    s = prog.stats()
    print(f"compiled: {s['num_nodes']} nodes, {s['flops_per_step'] / 1e6:.1f} MFLOP/step, arena "
          f"{s['arena_bytes'] / 2**20:.2f} MiB (without reordering {s['arena_bytes_no_reorder'] / 2**20:.2f} MiB), "
          f"state {s['state_bytes'] / 2**20:.2f} MiB ({time.time() - t0:.1f}s)")
    t0 = time.time()
    trainer = prog.build()
    print(f"built the C++ step for this host in {time.time() - t0:.1f}s")

    before = evaluate(trainer, held_ids, batch, seq)
    losses = []
    t0 = time.time()
    with tqdm(total=steps, desc="fine-tuning", unit="step") as bar:
        for i in range(steps):
            x, y = next(data)
            losses.append(trainer.step((x,), (y,)))
            bar.update(1)
            if i % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}")
    elapsed = time.time() - t0
    after = evaluate(trainer, held_ids, batch, seq)

    k = max(1, steps // 10)
    print("\nloss curve (mean of each tenth of the run):")
    print("  " + "  ".join(f"{np.mean(losses[i:i + k]):.2f}" for i in range(0, steps, k)))
    print(f"\n{steps} steps in {elapsed:.1f}s: {steps / elapsed:.1f} steps/s, "
          f"{s['flops_per_step'] * steps / elapsed / 1e9:.2f} GFLOP/s")
    print("\n| held-out text | loss | top-1 | top-3 |\n|---|---|---|---|")
    print(f"| before | {before[0]:.3f} | {before[1]:.1%} | {before[2]:.1%} |")
    print(f"| after  | {after[0]:.3f} | {after[1]:.1%} | {after[2]:.1%} |")
    plot = save_plot(losses, ROOT / "out" / "demo_loss.png")
    print(f"\nloss curve plot: {plot.relative_to(ROOT)}")


def save_plot(losses: list[float], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    k = 20
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, alpha=0.3, label="step loss")
    ax.plot(np.arange(k - 1, len(losses)), smooth, label=f"mean of {k} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("Keyboard LM fine-tuned by the compiled C++ step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
