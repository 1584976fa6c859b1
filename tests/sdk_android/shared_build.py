"""Helpers of the Android SDK tests: the keyboard spec of
demo-apps/keyboard/model/spec.py, and run_once, a build shared by the
pytest-xdist workers of one test session."""
from __future__ import annotations

import fcntl
import json
import os
import importlib.util
from pathlib import Path

KEYBOARD_SPEC = Path(__file__).resolve().parents[2] / "demo-apps" / "keyboard" / "model" / "spec.py"


def load_keyboard_spec():
    spec = importlib.util.spec_from_file_location("keyboard_spec", KEYBOARD_SPEC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_once(tmp_path_factory, name: str, produce) -> tuple[Path, dict]:
    """produce(dir) -> JSON-able dict, run once per test session even with
    pytest-xdist (workers share the base temp's parent; a file lock orders
    them), so a module's expensive build is not repeated on every worker."""
    root = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") \
        else tmp_path_factory.getbasetemp()
    work, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                work.mkdir(exist_ok=True)
                result = produce(work)
                done.write_text(json.dumps(result))
            return work, json.loads(done.read_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
