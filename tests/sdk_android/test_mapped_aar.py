"""An AAR's bundle with its frozen weights mapped, on the JVM (issue 36): pock-build's AAR layout
(platforms/android.write_aar) around a host JNI build of the model; MappedAarJvmTest.kt packs its
assets as an app's build does, PockAssets copies the bundle out once and PockTrainer opens the
checkpoint by path.  After training, /proc/self/smaps of the JVM shows the weights file's pages
as clean file-backed ones (only the trained tensors and their optimizer state copied on write),
the frozen tensors are bit-identical, and the losses are Python's."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.runtime.checkpoint import read_checkpoint
from pockengine.memory.plan import is_mapped
from pockengine.platforms import android
from pockengine.compiler.program import written_state
from shared_build import build_jvm_model, jvm_toolchain_missing, run_kotlin_main, run_once

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 5
NAME = "mappedaar"

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def _program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(8, 512), torch.randint(0, 10, (8,))
    prog = pe.compile(model, (x,), (y,), update={"4.*": 1.0}, optimizer=pe.AdamW(lr=1e-2), name=NAME)
    return prog, x, y


def _build_and_run(out):
    prog, x, y = _program()
    bundle, library = build_jvm_model(prog, out)
    aar = android.write_aar(out / f"pockengine-{NAME}.aar", NAME, android.kotlin_core_jar(), {}, bundle,
                            test_build=True)
    written = written_state(prog.graph, prog.trained)
    frozen = [v.name for v in prog.state.values() if is_mapped(v, written)]
    (out / "batch.bin").write_bytes(x.numpy().astype("<f4").tobytes() + y.numpy().astype("<i8").tobytes())
    jars = [android.kotlin_core_jar(), android.kotlin_android_jar(), android.android_stubs_jar()]
    test_jar = android.compile_kotlin([os.path.join(HERE, "MappedAarJvmTest.kt")], "mapped-aar-jvm-test",
                                      classpath=[*jars, android.kotlin_stdlib(), android.kotlin_coroutines()])
    work = out / "work"
    work.mkdir()
    facts = run_kotlin_main([*jars, test_jar], "MappedAarJvmTestKt",
                            [aar, NAME, library, out / "batch.bin", ",".join(frozen), work, "4.weight"],
                            "MappedAarJvmTest")
    ref = prog.build()
    ref.load(bundle / "weights.pockckpt")
    before, after = read_checkpoint(bundle / "weights.pockckpt"), read_checkpoint(work / "kt_after.pockckpt")
    return {"facts": facts, "losses": [ref.step((x,), (y,)) for _ in range(STEPS)],
            "frozen": frozen, "frozen_kb": sum(prog.state[n].nbytes for n in frozen) / 1024,
            "private_kb": sum(v.nbytes for v in prog.state.values() if v.name not in frozen) / 1024,
            "file_frozen_identical": all(np.array_equal(before.tensors[n][1], after.tensors[n][1]) for n in frozen),
            "work": str(work)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_once(tmp_path_factory, "android-mapped-aar", _build_and_run)[1]


def test_the_extracted_checkpoint_is_mapped_clean_and_frozen_weights_stay_bit_identical(run):
    facts = run["facts"]
    assert facts["done"] == "true", facts
    assert facts["weights_file"].startswith(os.path.realpath(run["work"])) and "nobackup" in facts["weights_file"]
    assert len(run["frozen"]) == 4  # 0.weight/bias, 2.weight/bias
    # every frozen weight was read by the steps: resident and backed by the file, not copied (the
    # copied-on-write pages are the mapping's Anonymous ones; the file PockAssets just wrote may
    # still be dirty in the page cache, which smaps counts as Private_Dirty until written back)
    anon = int(facts["ckpt_anon_kb"])
    assert int(facts["ckpt_rss_kb"]) - anon >= 0.9 * run["frozen_kb"], (facts, run["frozen_kb"])
    assert int(facts["open_ckpt_anon_kb"]) <= 16, facts  # opening copies nothing
    # only the trained head and its optimizer state were copied (a page or two of slack each)
    assert anon <= run["private_kb"] + 16, (facts, run["private_kb"])
    assert int(facts["ckpt_dirty_kb"]) - anon <= int(facts["ckpt_rss_kb"]) - anon  # the rest: file pages
    assert facts["frozen_identical"] == "true" and facts["trained_changed"] == "true"
    assert run["file_frozen_identical"]
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]


def test_the_mapped_bundle_trains_like_python(run):
    losses = np.array(run["facts"]["losses"].split(), dtype=np.float32)
    np.testing.assert_array_equal(losses, np.array(run["losses"], dtype=np.float32))
