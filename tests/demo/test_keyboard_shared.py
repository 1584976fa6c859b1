"""JVM checks of the keyboard's shared Kotlin (demo-apps/keyboard/shared, kotlinc'd once and
cached by content hash, as the Android SDK's Kotlin is): the in-process selftest of
kotlin/DemoTests.kt, tokenizer parity with model/tokenizer.py on the shared vectors, the
training policy against sim's Policy, and the training buffer across process restarts."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "demo-apps" / "keyboard" / "shared"
SOURCES = sorted((SHARED / "src" / "commonMain").rglob("*.kt")) + sorted((SHARED / "src" / "jvmMain").rglob("*.kt")) \
    + [Path(__file__).with_name("kotlin") / "DemoTests.kt"]
MAIN = "org.pockengine.keyboard.tests.DemoTestsKt"
sys.path.insert(0, str(ROOT / "demo-apps"))
sys.path.insert(0, str(ROOT / "tests" / "sdk_android"))
from pockengine.platforms import android  # noqa: E402
from shared_build import jvm_toolchain_missing  # noqa: E402
from keyboard.model.tokenizer import Tokenizer, tokens  # noqa: E402
from keyboard.shared.testdata import make_vectors  # noqa: E402


pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


@pytest.fixture(scope="session")
def demo_jar() -> Path:
    """The shared Kotlin and DemoTests.kt in one jar (compiled once per content hash)."""
    return android.compile_kotlin(SOURCES, "keyboard-shared-test")


def kotlin(jar: Path, *args: str) -> str:
    r = subprocess.run([str(android.java_home() / "bin" / "java"), "-cp", f"{jar}{os.pathsep}{android.kotlin_stdlib()}",
                        MAIN, *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"DemoTests {args[0]} failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_selftest(demo_jar):
    out = kotlin(demo_jar, "selftest")
    assert out.strip().endswith("passed, 0 failed") and int(out.split()[-4]) >= 30, out


def test_vectors_match_python_tokenizer():
    """The committed vectors are what model/tokenizer.py gives today."""
    committed = (SHARED / "testdata" / "tokenizer_vectors.tsv").read_text(encoding="utf-8").splitlines()
    assert committed == make_vectors.rows(Tokenizer.load())
    assert tokens("Don\u2019t STOP at 42!") == ["don't", "stop", "at", "<num>", "!"]


def test_tokenizer_parity(demo_jar):
    vectors = SHARED / "testdata" / "tokenizer_vectors.tsv"
    out = kotlin(demo_jar, "tokenize", str(SHARED.parent / "model" / "vocab.txt"), str(vectors))
    n = len(vectors.read_text(encoding="utf-8").splitlines())
    assert out.strip().endswith(f"{2 * n} passed, 0 failed"), out


def test_policy_matches_simulation(demo_jar):
    from keyboard.model import lm
    from keyboard.sim.simulate import Policy
    cases = [(0, 0), (199, 5000), (200, 200), (200, 1000), (450, 3333), (5000, 9000), (300, 100000)]
    out = kotlin(demo_jar, "policy", *(str(v) for c in cases for v in c)).split()
    assert [int(v) for v in out] == [Policy().steps(n, b, lm.BATCH, lm.SEQ) for n, b in cases]


def test_buffer_survives_restart_and_is_wiped(demo_jar, tmp_path):
    f = tmp_path / "keyboard" / "buffer.txt"
    kotlin(demo_jar, "buffer-add", str(f), "See you at   the office.", "Thanks\nfor the notes!")
    kotlin(demo_jar, "buffer-add", str(f), "Meeting moved to 3pm.")
    assert kotlin(demo_jar, "buffer-dump", str(f)).splitlines() == [
        "untrained=3", "See you at the office.", "Thanks for the notes!", "Meeting moved to 3pm."]
    assert "office" in f.read_text()
    kotlin(demo_jar, "buffer-clear", str(f))
    assert not f.exists() and not any(p.name.startswith("buffer") for p in f.parent.iterdir())
    assert kotlin(demo_jar, "buffer-dump", str(f)).splitlines() == ["untrained=0"]
    shutil.rmtree(tmp_path / "keyboard")
