"""Smart compose in the keyboard app, end to end on the JVM (issue 37 item 6): the shared Kotlin
SmartCompose (demo-apps/keyboard/shared) over the Android app's adapter (PockLanguageModel.kt:
PockTokenizer + PockTrainer forward / step / generate / exportAdapter) on a host JNI build of the
tiny Llama with LoRA of tests/sdk_android/test_jvm_llm.py (its builder, reused: the same compiled
library). kotlin/SmartComposeJvmTest.kt learns the user's sentences, suggests before and after;
each fact is judged against sim/smart_compose.py's Suggester and training stream on Python's
trainer driven through the same steps from the same bundle."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pockengine.platforms import android

ROOT = Path(__file__).resolve().parents[2]
KEYBOARD = ROOT / "demo-apps" / "keyboard"
sys.path.insert(0, str(ROOT / "tests" / "sdk_android"))
sys.path.insert(0, str(ROOT / "demo-apps"))
from shared_build import build_jvm_model, jvm_toolchain_missing, run_kotlin_main, run_once  # noqa: E402
from test_jvm_llm import SEQ, TEXT, tiny_llm  # noqa: E402  (the tiny Llama + BPE the SDK's JVM test builds)
from keyboard.sim import smart_compose as sc  # noqa: E402

SENTENCES = ["the licensee may copy the program and distribute it under the terms of this license",
             "you may charge a fee for the physical act of transferring a copy of the program",
             "the program is distributed in the hope that it will be useful but without any warranty"]
TYPED = SENTENCES * 3
PROBES = ["the licensee may copy the ", "you may charge a fee for the ", "the program is distributed in the "]
APP = KEYBOARD / "android" / "app" / "src" / "main" / "kotlin" / "org" / "pockengine" / "keyboard" / "app"
SOURCES = sorted((KEYBOARD / "shared" / "src" / "commonMain").rglob("*.kt")) \
    + [APP / "PockKeyboardModel.kt", APP / "PockLanguageModel.kt", Path(__file__).with_name("kotlin") / "SmartComposeJvmTest.kt"]
MAIN = "org.pockengine.keyboard.tests.SmartComposeJvmTestKt"

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def _python_side(prog, bundle, tok, out: Path) -> dict:
    """sim/smart_compose.py's rules on Python's trainer, through the steps SmartCompose takes."""
    tr = prog.build()
    tr.load(bundle / "weights.pockckpt")
    seq = SEQ
    s = sc.Suggester(tr, tok, seq)

    def suggest(text):
        ids = tok.encode(text.rstrip(), add_special_tokens=False)[-seq:]
        return s.suggest(ids, s.logits(ids)[len(ids) - 1])

    ref = {"seq": seq, "before": [suggest(p) for p in PROBES]}
    stream = tok.encode(" ".join(TYPED), add_special_tokens=False)
    windows = [stream[i:i + seq + 1] for i in range(0, len(stream) - seq, seq)]
    ref["losses"] = [float(tr.step((np.array([w[:-1]], np.int64),), (np.array([w[1:]], np.int64),))) for w in windows]
    rest = stream[len(windows) * seq:]
    ref["buffered"] = len(rest)
    ref["after"] = [suggest(p) for p in PROBES]
    x, y = np.zeros((1, seq), np.int64), np.full((1, seq), -100, np.int64)
    x[0, :len(rest) - 1], y[0, :len(rest) - 1] = rest[:-1], rest[1:]
    ref["flush_loss"] = float(tr.step((x,), (y,)))
    ref["one"] = len(tok.encode(" a", add_special_tokens=False))
    ref["flushed"] = [suggest(p) for p in PROBES]
    tr.export_adapter(out / "py_peft", format="peft")
    ref["steps"] = len(windows) + 1
    tr.close()
    return ref


def _build_and_run(out: Path) -> dict:
    tokenizer, tok, prog = tiny_llm(out)
    bundle, library = build_jvm_model(prog, out)
    sdk = android.kotlin_core_jar()
    jar = android.compile_kotlin(SOURCES, "smart-compose-jvm-test", classpath=[sdk, android.kotlin_stdlib()])
    (out / "typed.txt").write_text("\n".join(TYPED) + "\n", encoding="utf-8")
    (out / "probes.txt").write_text("\n".join(PROBES) + "\n", encoding="utf-8")
    work = out / "work"
    work.mkdir()
    facts = run_kotlin_main([sdk, jar], MAIN, [bundle, library, tokenizer, out / "typed.txt", out / "probes.txt", work],
                            "SmartComposeJvmTest")
    return {"facts": facts, "ref": _python_side(prog, bundle, tok, out)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out, result = run_once(tmp_path_factory, "smart-compose-jvm", _build_and_run)
    return out, result["facts"], result["ref"]


def _words(value: str) -> list[str]:
    return value.split(",") if value else []


def test_the_same_tiny_model_as_the_sdk_test():
    assert " ".join(TYPED) == TEXT


def test_learn_steps_the_pythons_stream_windows(run):
    _, facts, ref = run
    assert facts["seq"] == str(ref["seq"])
    steps = [int(v) for v in facts["learn_steps"].split()]
    assert len(steps) == len(TYPED) and sum(steps) == len(ref["losses"]) > 3   # a step per seq ids, once seq + 1 are buffered
    assert int(facts["buffered"]) == ref["buffered"]
    assert [np.float32(v) for v in facts["losses"].split()] == [np.float32(v) for v in ref["losses"]]
    assert ref["losses"][-1] < ref["losses"][0]


def test_suggestions_equal_pythons_and_are_whole_words(run):
    _, facts, ref = run
    for when in ("before", "after", "flushed"):
        for i, want in enumerate(ref[when]):
            got = _words(facts[f"{when}.{i}"])
            assert got == want, (when, PROBES[i], got, want)
            assert len(got) == 3 and len(set(got)) == 3
            assert all(w and " " not in w and w == sc._word(w) for w in got)
    assert ref["after"] != ref["before"]   # learning changed what the strip shows (a random tiny model: not better)
    assert int(facts["empty"]) == 0


def test_a_word_being_typed_is_completed(run):
    _, facts, _ = run
    for i in range(len(PROBES)):
        got = _words(facts[f"partial.{i}"])
        assert got and all(w.startswith("th") and " " not in w for w in got), got


def test_flush_trains_the_rest_with_ignored_labels(run):
    _, facts, ref = run
    assert facts["flush"] == "1" and facts["flush_again"] == "0"
    assert np.float32(facts["flush_loss"]) == np.float32(ref["flush_loss"])
    ran, steps, count, skipped = (int(v) for v in facts["flush_one"].split())
    assert ran == (1 if ref["one"] >= 2 else 0) and skipped == 0
    assert steps == count == ref["steps"] + ran == int(facts["step_count"])


def test_export_adapter_writes_the_peft_files(run):
    from safetensors.numpy import load_file
    out, facts, ref = run
    kt, py = out / "work" / "peft", out / "py_peft"
    assert (kt / "adapter_config.json").is_file()
    got, want = load_file(kt / "adapter_model.safetensors"), load_file(py / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and got
    for k in want:   # the same steps on both sides: the same adapters
        np.testing.assert_array_equal(got[k], want[k])
    assert facts["done"] == "true"
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]
