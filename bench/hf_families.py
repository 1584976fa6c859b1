"""Hugging Face families from tiny configs (tests/frontends/hf_zoo.py): compile time, build
time and ms/step of the compiled step against PyTorch eager (fp32, same thread count).

    PYTHONPATH=toolchain .venv/bin/python bench/hf_families.py llama gpt2 bert
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "frontends"))
import pockengine as pe  # noqa: E402
from hf_zoo import FAMILIES  # noqa: E402
from pockengine.frontends.torch_export import resolve_loss  # noqa: E402

STEPS = 20


def torch_ms(model, x, y, loss):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fn = resolve_loss(loss)
    for i in range(STEPS + 3):
        if i == 3:
            t = time.perf_counter()
        opt.zero_grad()
        fn(model(*x), *y).backward()
        opt.step()
    return (time.perf_counter() - t) * 1e3 / STEPS


def main(names):
    print("| family | compile s | build s | PockEngine ms/step | PyTorch ms/step |")
    print("|---|---|---|---|---|")
    for name in names:
        torch.manual_seed(0)
        model, x, y, loss, output = FAMILIES[name]()
        ref_ms = torch_ms(copy.deepcopy(model), x, y, loss)  # before export touches the model
        t0 = time.perf_counter()
        prog = pe.compile(model, x, y, loss=loss, optimizer=pe.SGD(lr=0.01), output=output)
        t1 = time.perf_counter()
        trainer = prog.build()
        t2 = time.perf_counter()
        for i in range(STEPS + 3):
            if i == 3:
                t3 = time.perf_counter()
            trainer.step(x, y)
        ms = (time.perf_counter() - t3) * 1e3 / STEPS
        print(f"| {name} | {t1 - t0:.1f} | {t2 - t1:.1f} | {ms:.2f} | {ref_ms:.2f} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(FAMILIES))
