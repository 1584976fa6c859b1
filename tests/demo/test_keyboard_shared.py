"""JVM checks of the keyboard's shared Kotlin (demo-apps/keyboard/shared, kotlinc'd once and
cached by content hash under .cache/demo-kotlin): the in-process selftest of
kotlin/DemoTests.kt, tokenizer parity with model/tokenizer.py on the shared vectors, the
training policy against sim's Policy, and the training buffer across process restarts."""
from __future__ import annotations

import fcntl
import hashlib
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
KOTLINC = ROOT / ".tools" / "node_modules" / "kotlin-compiler" / "bin" / "kotlinc"
STDLIB = KOTLINC.parents[1] / "lib" / "kotlin-stdlib.jar"
MAIN = "org.pockengine.keyboard.tests.DemoTestsKt"
sys.path.insert(0, str(ROOT / "demo-apps"))
from keyboard.model.tokenizer import Tokenizer, tokens  # noqa: E402
from keyboard.shared.testdata import make_vectors  # noqa: E402


def java_home() -> Path | None:
    for home in (os.environ.get("JAVA_HOME"), "/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/default-java"):
        if home and (Path(home) / "bin" / "java").exists():
            return Path(home)
    return None


pytestmark = pytest.mark.skipif(not KOTLINC.exists() or java_home() is None,
                                reason=f"needs kotlinc ({KOTLINC.relative_to(ROOT)}) and a JDK 17: run `make setup`")


@pytest.fixture(scope="session")
def demo_jar() -> Path:
    """The shared Kotlin and DemoTests.kt in one jar; compiled once per content hash
    (a file lock keeps two pytest workers from compiling it at the same time)."""
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.relative_to(ROOT).as_posix().encode() + b"\0" + src.read_bytes())
    cache = ROOT / ".cache" / "demo-kotlin"
    cache.mkdir(parents=True, exist_ok=True)
    jar = cache / f"keyboard-shared-{h.hexdigest()[:16]}.jar"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not jar.exists():
            tmp = jar.with_suffix(".tmp.jar")
            env = dict(os.environ, JAVA_HOME=str(java_home()))
            r = subprocess.run([str(KOTLINC), *map(str, SOURCES), "-d", str(tmp), "-nowarn"],
                               capture_output=True, text=True, env=env, timeout=600)
            assert r.returncode == 0, f"kotlinc failed:\n{r.stdout}\n{r.stderr}"
            tmp.replace(jar)
            for old in cache.glob("keyboard-shared-*.jar"):   # earlier sources' jars
                if old != jar:
                    old.unlink()
    return jar


def kotlin(jar: Path, *args: str) -> str:
    r = subprocess.run([str(java_home() / "bin" / "java"), "-cp", f"{jar}{os.pathsep}{STDLIB}", MAIN, *args],
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
