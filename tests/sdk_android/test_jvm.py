"""The Kotlin SDK (sdk-android/src/main/kotlin, compiled with kotlinc) on this
machine's JVM over a host build of the keyboard model's library with
pock_jni.cpp: 50 training steps, forward, save/load, and PockException
for every misuse; KeyboardJvmTest.kt drives it and prints what it saw."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pockengine as pe
from pockengine.platforms import android
from shared_build import build_jvm_model, jvm_toolchain_missing, load_keyboard_spec, run_kotlin_main, run_once

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 50


pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


@pytest.fixture(scope="module")
def jvm_run(tmp_path_factory):
    """KeyboardJvmTest's facts and the Python trainer's losses on the same batch (built and run once)."""
    _, result = run_once(tmp_path_factory, "android-jvm", _build_and_run)
    return result["facts"], result["reference"]


def _build_and_run(out):
    spec = load_keyboard_spec()
    prog = pe.compile(**spec.make())
    bundle, library = build_jvm_model(prog, out)
    core = android.kotlin_core_jar()
    test_jar = android.compile_kotlin([os.path.join(HERE, "KeyboardJvmTest.kt")], "keyboard-jvm-test",
                                      classpath=[core, android.kotlin_stdlib(), android.kotlin_coroutines()])
    x, y = spec.example_batch(0)
    batch = out / "batch.bin"
    batch.write_bytes(x.numpy().astype("<i8").tobytes() + y.numpy().astype("<i8").tobytes())
    work = out / "work"
    work.mkdir()
    facts = run_kotlin_main([core, test_jar], "KeyboardJvmTestKt", [bundle, library, batch, work], "KeyboardJvmTest")

    reference = prog.build_cpu(out / "reference")
    reference.load(bundle / "weights.pockckpt")
    ref_losses = [reference.step((x,), (y,)) for _ in range(STEPS)]
    reference.close()
    return {"facts": facts, "reference": ref_losses}


def test_trains_50_steps_with_falling_loss(jvm_run):
    facts, ref = jvm_run
    assert facts["model"] == "keyboard"
    assert facts["inputs"] == "input0: i64[4, 16]" and facts["outputs"].endswith(": f32[4, 16, 1500]")
    losses = np.array(facts["losses"].split(), dtype=np.float32)
    assert len(losses) == STEPS and np.isfinite(losses).all()
    assert losses[0] == pytest.approx(np.log(1500), rel=0.05)  # untrained: about uniform over the vocabulary
    assert losses[-1] < 0.5 * losses[0], losses
    # the same library code as the Python Trainer: the same losses
    np.testing.assert_array_equal(losses, np.array(ref, dtype=np.float32))
    assert facts["step_count"] == str(STEPS)
    assert float(facts["learning_rate"]) == pytest.approx(3e-3)


def test_predict_save_restore_is_bit_identical(jvm_run):
    facts, _ = jvm_run
    assert facts["predict_numel"] == str(4 * 16 * 1500)
    assert facts["predict_int32_equal"] == "true"
    assert facts["fresh_equal_before_restore"] == "false"  # a fresh trainer starts from the initial weights
    assert facts["restored_equal"] == "true"
    assert facts["restored_step_count"] == str(STEPS)
    assert facts["restored_next_loss_equal"] == "true"
    assert float(facts["learning_rate_set"]) == 0.5


def test_errors_are_pock_exceptions_naming_the_problem(jvm_run):
    facts, _ = jvm_run
    assert facts["error.wrong_shape"].startswith("SHAPE ")
    assert "'input0'" in facts["error.wrong_shape"] and "[4, 15]" in facts["error.wrong_shape"] \
        and "[4, 16]" in facts["error.wrong_shape"]
    assert facts["error.wrong_dtype"].startswith("DTYPE ") and "f32" in facts["error.wrong_dtype"] and "i64" in facts["error.wrong_dtype"]
    assert facts["error.wrong_count"].startswith("INVALID_ARGUMENT ") and "got 2" in facts["error.wrong_count"]
    assert facts["error.array_too_short"].startswith("SHAPE ") and "3 elements" in facts["error.array_too_short"]
    assert facts["error.negative_lr"].startswith("VALUE ") and "learning rate" in facts["error.negative_lr"]
    assert facts["error.token_out_of_range"].startswith("VALUE ") and "1500" in facts["error.token_out_of_range"]
    assert facts["error.corrupt_checkpoint"].startswith("CHECKPOINT ")
    assert "corrupt.pockckpt" in facts["error.corrupt_checkpoint"]
    assert facts["error.missing_checkpoint"].startswith("IO ") and "nowhere.pockckpt" in facts["error.missing_checkpoint"]
    assert facts["state_kept_after_corrupt"] == "true"
    for what in ("closed_step", "closed_predict", "closed_save"):
        assert facts[f"error.{what}"].startswith("CLOSED ") and "closed" in facts[f"error.{what}"]
    assert facts["closed"] == "true"
    assert facts["error.not_a_bundle"].startswith("IO ") and "model.json" in facts["error.not_a_bundle"]


def test_background_training_and_stream_bundle(jvm_run):
    facts, _ = jvm_run
    assert facts["async_losses_finite"] == "true" and facts["suspend_loss_finite"] == "true"
    assert facts["async_step_count"] == str(STEPS + 1 + 4 + 3)  # + the restore comparison's step
    assert facts["suspend_error"].startswith("PockException")
    assert facts["stream_step_count"] == "0"
    assert float(facts["stream_first_loss"]) == pytest.approx(np.log(1500), rel=0.05)
    assert facts["done"] == "true"
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]
