"""Pretrain the keyboard's base model on generic English (Debian's `fortunes`) in PyTorch
and write model/vocab.txt, model/base_weights.npz (fp16) and model/base_weights.json.

    .venv/bin/python demo-apps/keyboard/model/pretrain.py [--steps 2500]

About 6 minutes on 2 idle CPU cores (1500 steps of 32 x 32 words). The base model ships with the app; only on-device
fine-tuning runs in PockEngine's compiled step (sim/ and the apps).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from keyboard.model import corpora, lm  # noqa: E402
from keyboard.model.tokenizer import SPECIALS, Tokenizer, tokens  # noqa: E402


def build_vocab(messages: list[str], size: int) -> Tokenizer:
    counts = Counter(t for m in messages for t in tokens(m))
    words = [w for w, _ in counts.most_common() if w not in SPECIALS][:size - len(SPECIALS)]
    return Tokenizer(list(SPECIALS) + words)


def stream(tok: Tokenizer, messages: list[str]) -> np.ndarray:
    return np.array([i for m in messages for i in tok.encode_message(m)], dtype=np.int64)


def windows(ids: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    starts = rng.integers(0, len(ids) - seq - 1, batch)
    x = np.stack([ids[s:s + seq] for s in starts])
    y = np.stack([ids[s + 1:s + seq + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def val_loss(model, ids: np.ndarray, seq: int = 64) -> float:
    n = (len(ids) - 1) // seq
    x = torch.from_numpy(ids[:n * seq].reshape(n, seq))
    y = torch.from_numpy(ids[1:n * seq + 1].reshape(n, seq))
    return float(F.cross_entropy(model(x).reshape(-1, lm.VOCAB), y.reshape(-1)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    messages = corpora.fortunes()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(messages))
    messages = [messages[i] for i in order]
    n_val = len(messages) // 50
    tok = build_vocab(messages[n_val:], lm.VOCAB)
    tok.save(Path(lm.HERE / "vocab.txt"))
    train, val = stream(tok, messages[n_val:]), stream(tok, messages[:n_val])
    print(f"fortunes: {len(messages)} cookies, {len(train)} train / {len(val)} val tokens, "
          f"vocabulary {len(tok)} ({np.mean(train == 1):.1%} <unk>)")

    model = lm.new_model()
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        x, y = windows(train, args.batch, args.seq, rng)
        loss = F.cross_entropy(model(x).reshape(-1, lm.VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps:
            print(f"step {step}/{args.steps}  train loss {loss.item():.3f}  "
                  f"val loss {val_loss(model.eval(), val):.3f}  ({time.time() - t0:.0f}s)", flush=True)
            model.train()
            if step % 500 == 0 and step < args.steps:   # a usable checkpoint if stopped early
                lm.save_base(model, meta(args, messages, train, step, val_loss(model.eval(), val), t0))
                model.train()
    lm.save_base(model, meta(args, messages, train, args.steps, val_loss(model.eval(), val), t0))
    print(f"wrote {lm.WEIGHTS} ({lm.WEIGHTS.stat().st_size / 2**20:.1f} MiB) and vocab.txt: {lm.base_meta()}")


def meta(args, messages, train, step, loss, t0) -> dict:
    return {"corpus": "Debian package fortunes (/usr/share/games/fortunes, English cookie files "
                      "except art/ascii-art)", "cookies": len(messages), "train_tokens": int(len(train)),
            "steps": step, "batch": args.batch, "seq": args.seq, "lr": args.lr,
            "val_loss": round(loss, 4), "seconds": round(time.time() - t0)}


if __name__ == "__main__":
    main()
