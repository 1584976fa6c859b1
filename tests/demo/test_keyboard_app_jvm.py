"""The keyboard app end to end on the JVM: the shared Kotlin logic (Tokenizer, SuggestionRanker,
TrainingBuffer, TrainingPolicy, Personalizer) over the real compiled base model (spec.py:make_base,
10k words, the app's sparse update) through the Kotlin SDK's PockTrainer and JNI, with the
Android app's adapter (android/app/.../PockKeyboardModel.kt). kotlin/KeyboardAppJvmTest.kt types
the user's sentences (data/corpus.txt) in rounds, lets the policy train, scores held-out next-word
suggestions before and after, restores the saved checkpoint and wipes the buffer; it prints facts
that the tests below assert on. Built and run once per session (shared with xdist workers)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pockengine as pe
from pockengine.platforms import android

ROOT = Path(__file__).resolve().parents[2]
KEYBOARD = ROOT / "demo-apps" / "keyboard"
sys.path.insert(0, str(ROOT / "tests" / "sdk_android"))
sys.path.insert(0, str(ROOT / "demo-apps"))
from shared_build import build_jvm_model, jvm_toolchain_missing, load_keyboard_spec, run_kotlin_main, run_once  # noqa: E402
from keyboard.model import corpora  # noqa: E402

SOURCES = sorted((KEYBOARD / "shared" / "src" / "commonMain").rglob("*.kt")) \
    + sorted((KEYBOARD / "shared" / "src" / "jvmMain").rglob("*.kt")) \
    + [KEYBOARD / "android" / "app" / "src" / "main" / "kotlin" / "org" / "pockengine" / "keyboard" / "app" / "PockKeyboardModel.kt",
       Path(__file__).with_name("kotlin") / "KeyboardAppJvmTest.kt"]
MAIN = "org.pockengine.keyboard.tests.KeyboardAppJvmTestKt"


pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> dict:
    _, result = run_once(tmp_path_factory, "keyboard-app-jvm", _build_and_run)
    return result


def _build_and_run(out: Path) -> dict:
    t0 = time.time()
    spec = load_keyboard_spec()
    prog = pe.compile(**spec.make_base())   # the app's model with the app's sparse scheme (lm.SPARSE_UPDATE)
    bundle, library = build_jvm_model(prog, out)
    sdk = android.kotlin_core_jar()
    jar = android.compile_kotlin(SOURCES, "keyboard-app-jvm-test", classpath=[sdk, android.kotlin_stdlib()])
    typed, held = corpora.split_user(corpora.user_sentences())
    (out / "typed.txt").write_text("\n".join(typed) + "\n", encoding="utf-8")
    (out / "held.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    work = out / "work"
    work.mkdir()
    build_s = time.time() - t0
    facts = run_kotlin_main([sdk, jar], MAIN, [bundle, library, KEYBOARD / "model" / "vocab.txt", out / "typed.txt",
                                               out / "held.txt", work], "KeyboardAppJvmTest")
    facts.update(_build_s=f"{build_s:.1f}", _run_s=f"{time.time() - t0 - build_s:.1f}",
                 _typed=str(len(typed)))
    return facts


def _scores(facts: dict, key: str) -> tuple[int, int, int, float]:
    top1, top3, count, rank = facts[key].split()
    return int(top1), int(top3), int(count), float(rank)


def test_runs_the_apps_model(facts):
    assert facts["done"] == "true", facts
    assert facts["model"].startswith("keyboard_base input0: i64[8, 16]") and facts["model"].endswith(": f32[8, 16, 10000]")
    assert facts["vocab"] == "10000"
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]


def test_policy_trains_and_loss_falls(facts):
    sessions = [facts[f"session.{i}"].split() for i in range(1, 6)]
    steps = [int(s[0]) for s in sessions]
    assert steps[0] == 0 and "charging=true" in sessions[0]     # 3 sentences: too few new tokens
    assert steps[1] == 0 and "charging=false" in sessions[1]    # not charging: waits
    assert all(s > 0 for s in steps[2:]), sessions
    total = sum(steps)
    assert facts["steps_total"] == facts["steps_expected"] == facts["step_count"] == str(total)
    assert f"steps={total}" in facts["stats"] and f"sentencesLearned={facts['_typed']}" in facts["stats"]
    assert facts["buffer"] == f"{facts['_typed']} untrained=0"
    losses = np.array(facts["losses"].split(), dtype=np.float32)
    assert len(losses) == total and np.isfinite(losses).all()
    assert losses[-10:].mean() < losses[:10].mean() - 0.5, (losses[:10], losses[-10:])


def test_suggestions_improve_on_held_out_text(facts):
    b1, b3, n, brank = _scores(facts, "base")
    t1, t3, n2, trank = _scores(facts, "trained")
    assert n == n2 > 200
    # measured: top-3 62 -> 92 of 322, top-1 34 -> 55, mean rank 905 -> 396 (299 steps)
    assert t3 >= b3 + 0.05 * n and t1 > b1 and trank < 0.75 * brank, (facts["base"], facts["trained"])
    changed, count = map(int, facts["changed_suggestions"].split())
    assert changed > count // 2
    # measured: "under the terms of the " world,same,other -> work,document,program
    assert facts["base_suggest.under_the_terms_of_the"] != facts["trained_suggest.under_the_terms_of_the"]
    assert set(facts["trained_suggest.under_the_terms_of_the"].split(",")) & {"work", "document", "program", "license", "gnu"}


def test_checkpoint_restores_identical_suggestions(facts):
    assert facts["fresh_equals_base"] == "true"
    assert facts["restored_step_count"] == facts["step_count"]
    assert facts["restored_suggestions_equal"] == "true" and facts["restored_logits_equal"] == "true"


def test_forget_with_the_trainer_open(facts):
    assert facts["forget_buffer"] == "0 untrained=0 file=false reloaded=0"
    assert facts["forget_stats"] == "steps=0 file=false"
    assert facts["forget_trainer_open"] == "true true"    # weights untouched until the app reopens
    assert facts["forget_train_again"] == "0"
    assert facts["forget_reopened"] == "0 true false"      # back to the base model
