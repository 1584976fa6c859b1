"""Hugging Face families from tiny configs (tests/frontends/hf_zoo.py): compile time, build
time and ms/step of the compiled step against PyTorch eager (fp32, same thread count).

    PYTHONPATH=toolchain .venv/bin/python bench/hf_families.py llama gpt2 bert t5 falcon

Families: hf_zoo.FAMILIES and hf_zoo_extra.EXTRA; those taking keyword inputs (T5, Whisper,
BERT with masks, the encoder-decoders) are compiled from the dict and stepped with its values.
"""
from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "frontends"))
import pockengine as pe  # noqa: E402
from hf_zoo import FAMILIES  # noqa: E402
from hf_zoo_extra import EXTRA  # noqa: E402
from pockengine.frontends.torch_export import resolve_loss  # noqa: E402

STEPS = 20
THREADS = 1  # both sides: on a shared machine PyTorch's spinning thread pool otherwise dominates


def _call(model, x, output):
    """The model called as the user calls it: keyword inputs for a dict, `output` picked."""
    out = model(**x) if isinstance(x, dict) else model(*x)
    return out[output] if output else out


def main(names):
    """Compile and build time, then PyTorch eager and the compiled step interleaved step by
    step in one loop (the two share whatever load the machine has)."""
    torch.set_num_threads(THREADS)
    print(f"{THREADS} thread each, median of {STEPS} steps after 3 warm-up, interleaved step by step")
    print("| family | compile s | build s | PockEngine ms/step | PyTorch ms/step |")
    print("|---|---|---|---|---|")
    for name in names:
        torch.manual_seed(0)
        model, x, y, loss, output = {**FAMILIES, **EXTRA}[name]()
        ref = copy.deepcopy(model)  # before export touches the model
        opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.01)
        fn = resolve_loss(loss)
        t0 = time.perf_counter()
        prog = pe.compile(model, x, y, loss=loss, optimizer=pe.SGD(lr=0.01), output=output)
        t1 = time.perf_counter()
        trainer = prog.build()
        t2 = time.perf_counter()
        trainer.set_num_threads(THREADS)
        xs = tuple(x.values()) if isinstance(x, dict) else x  # the step takes them in the dict's order
        ours, theirs = [], []
        for i in range(STEPS + 3):
            ta = time.perf_counter()
            opt.zero_grad()
            fn(_call(ref, x, output), *y).backward()
            opt.step()
            tb = time.perf_counter()
            trainer.step(xs, y)
            tc = time.perf_counter()
            if i >= 3:
                theirs.append(tb - ta)
                ours.append(tc - tb)
        print(f"| {name} | {t1 - t0:.1f} | {t2 - t1:.1f} | {statistics.median(ours) * 1e3:.2f} | "
              f"{statistics.median(theirs) * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(FAMILIES))
