"""Survey: which Hugging Face families (tests/frontends/hf_zoo*.py) compile, build and take
a step whose loss equals PyTorch's. One line per family: ok / the first error.

    PYTHONPATH=toolchain .venv/bin/python bench/hf_survey.py [--build] [family ...]
"""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "frontends"))
import pockengine as pe  # noqa: E402
from hf_zoo import FAMILIES  # noqa: E402
from hf_zoo_extra import EXTRA  # noqa: E402
from pockengine.frontends.torch_export import resolve_loss  # noqa: E402


def _call(model, x, output):
    out = model(**x) if isinstance(x, dict) else model(*x)
    return out[output] if output else out


def survey(name, build):
    torch.manual_seed(0)
    try:
        model, x, y, loss, output = {**FAMILIES, **EXTRA}[name]()
        ref = resolve_loss(loss)(_call(model, x, output), *y).item()
    except Exception as e:  # noqa: BLE001
        return f"model: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
    t0 = time.perf_counter()
    try:
        prog = pe.compile(model, x, y, loss=loss, optimizer=pe.SGD(lr=0.0), output=output)
    except Exception as e:  # noqa: BLE001
        return f"compile: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    tc = time.perf_counter() - t0
    if not build:
        return f"compiles ({tc:.1f}s, {len(prog.graph.nodes)} nodes)"
    try:
        trainer = prog.build()
        xs = tuple(x.values()) if isinstance(x, dict) else x
        got = trainer.step(xs, y)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"build/step: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    ok = abs(got - ref) <= 1e-4 * max(1.0, abs(ref))
    return f"{'OK' if ok else 'LOSS MISMATCH'} loss {got:.6f} vs torch {ref:.6f} (compile {tc:.1f}s)"


def main(argv):
    build = "--build" in argv
    names = [a for a in argv if not a.startswith("--")] or list(EXTRA)
    for name in names:
        print(f"{name}: {survey(name, build)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
