"""Helpers of the Android SDK tests (and the keyboard app's JVM test): the
keyboard spec of demo-apps/keyboard/model/spec.py; run_once, a build shared
by the pytest-xdist workers of one test session; and the JVM side: whether
kotlinc and a JDK are there, a compiled program as a bundle + host JNI
library, and running a Kotlin test main that prints "key value" facts."""
from __future__ import annotations

import fcntl
import json
import os
import importlib.util
import subprocess
from pathlib import Path

from pockengine.errors import PockError
from pockengine.platforms import android

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


def jvm_toolchain_missing() -> str | None:
    """Why the JVM tests cannot run here (no kotlinc or JDK), or None."""
    try:
        android.java_home(), android.kotlinc(), android.kotlin_stdlib()
    except PockError as e:
        return str(e)
    return None


def build_jvm_model(prog, out: Path) -> tuple[Path, Path]:
    """(bundle dir, host JNI library) of a compiled program, as PockTrainer.open takes them."""
    bundle = android.write_initial_bundle(prog, out)
    cpp = out / f"{prog.name}.cpp"
    cpp.write_text(prog.source())
    return bundle, android.build_host_jni_library(cpp, out / "lib")


def run_kotlin_main(jars, main: str, args, what: str) -> dict:
    """Run `main` with -Xcheck:jni on jars + the Kotlin stdlib; its stdout's "key value"
    lines as a dict, plus its stderr under "_stderr"."""
    cp = os.pathsep.join(map(str, [*jars, android.kotlin_stdlib(), android.kotlin_coroutines()]))
    r = subprocess.run([str(android.java_home() / "bin" / "java"), "-Xcheck:jni", "-cp", cp, main, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{what} failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    facts = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    facts["_stderr"] = r.stderr
    return facts
