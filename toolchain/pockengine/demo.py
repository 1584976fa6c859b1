"""`python -m pockengine.demo` (`make demo`): runs the keyboard personalization demo of this
checkout, demo-apps/keyboard/sim/demo.py (its docstring says what it shows).

The library imports nothing from demo-apps/: this runner only finds the directory at run time
(POCK_DEMO_APPS, else the checkout's demo-apps/ beside toolchain/) and hands it the arguments.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from .errors import PockError


def demo_apps() -> Path:
    """The demo-apps/ directory: $POCK_DEMO_APPS, else the checkout's."""
    path = Path(os.environ.get("POCK_DEMO_APPS") or Path(__file__).resolve().parents[2] / "demo-apps")
    if not (path / "keyboard" / "sim" / "demo.py").is_file():
        raise PockError(f"the demo lives in a PockEngine checkout's demo-apps/ (not found at {path}); "
                        f"run it from a checkout or set POCK_DEMO_APPS")
    return path


def keyboard():
    """The keyboard demo app's Python package (demo-apps/keyboard: model, tokenizer, sim),
    imported at run time from demo_apps() (for runners such as pockengine.federated)."""
    apps = str(demo_apps())
    if apps not in sys.path:
        sys.path.insert(0, apps)
    for module in ("keyboard.model.lm", "keyboard.model.spec", "keyboard.model.tokenizer", "keyboard.sim.simulate"):
        importlib.import_module(module)
    return sys.modules["keyboard"]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--model" in argv or any(a.startswith("--model=") for a in argv):
        from .demo_llm import main as llm_main  # python -m pockengine.demo --model smollm2
        return llm_main(argv, corpus=demo_apps() / "keyboard" / "data" / "corpus.txt")
    apps = str(demo_apps())
    if apps not in sys.path:
        sys.path.insert(0, apps)
    importlib.import_module("keyboard.sim.demo").main(argv)


if __name__ == "__main__":
    try:
        main()
    except PockError as e:
        sys.exit(f"pockengine.demo: error: {e}")
