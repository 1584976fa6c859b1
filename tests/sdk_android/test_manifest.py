"""Hostile model bundle manifests against the Kotlin SDK (ModelBundle.kt, MiniJson.kt) on this
machine's JVM, with a host JNI build of a small model: every tampered manifest is refused with
a PockException naming the field (before: NegativeArraySizeException, OutOfMemoryError,
StackOverflowError, ClassCastException, a dimension of 4294967302 read as 6, weights outside
the bundle), the manifest is checked against the library's pock_io_info, and the manifest
reader is fuzzed (ManifestJvmTest.kt: one compiled program for every case)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from torch import nn

import pockengine as pe
from pockengine.platforms import android
from shared_build import build_jvm_model, jvm_toolchain_missing, run_kotlin_main, run_once

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ_SECONDS = 20

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def _set(path):
    """A mutation setting manifest[path...] = value."""
    def apply(m, value):
        *head, last = path
        for k in head:
            m = m[k]
        m[last] = value
    return apply


# case -> (mutation of the manifest dict or None, the field the message must name, what it must say)
CASES = {
    "negative_shape": (lambda m: _set(["inputs", 0, "shape", 0])(m, -4), "inputs[0].shape[0]", ">= 0"),
    "huge_output": (lambda m: _set(["outputs", 0, "shape"])(m, [46340, 46340]), "outputs[0].shape", "bytes"),
    "output_not_the_library": (lambda m: _set(["outputs", 0, "shape"])(m, [1000, 1000]), "outputs[0]",
                               "the library"),
    "input_count_not_the_library": (lambda m: m["inputs"].append(dict(m["inputs"][0], name="extra")), "inputs",
                                    "the library"),
    "wrapped_dim": (lambda m: _set(["inputs", 0, "shape", 0])(m, 4294967302), "inputs[0].shape[0]",
                    "more than 2147483647"),
    "float_dim": (lambda m: _set(["inputs", 0, "shape", 0])(m, 4.0), "inputs[0].shape[0]", "integer"),
    "string_shape": (lambda m: _set(["inputs", 0, "shape"])(m, "4x3"), "inputs[0].shape", "must be a list"),
    "too_many_dims": (lambda m: _set(["inputs", 0, "shape"])(m, [1] * 9), "inputs[0].shape", "more than 8"),
    "unknown_dtype": (lambda m: _set(["inputs", 0, "dtype"])(m, "f64"), "inputs[0].dtype", "f64"),
    "prefix_string": (lambda m: _set(["prefix"])(m, "x"), "prefix", "must be an object or null"),
    "prefix_file_escapes": (lambda m: _set(["prefix"])(m, {"files": {"onnx": "../../x.onnx"}}), "prefix.files.onnx",
                            "inside the bundle"),
    "name_not_string": (lambda m: _set(["name"])(m, 5), "name", "must be a string"),
    "inputs_not_list": (lambda m: _set(["inputs"])(m, {}), "inputs", "must be a list"),
    "weights_parent": (lambda m: _set(["weights"])(m, "../../../../etc/passwd"), "weights", "inside the bundle"),
    "weights_absolute": (lambda m: _set(["weights"])(m, "/etc/passwd"), "weights", "inside the bundle"),
    "weights_symlink_escape": (lambda m: _set(["weights"])(m, "escape.pockckpt"), "weights", "outside the bundle"),
}
# raw manifest texts (not expressible as a dict)
DEEP = 200_000
RAW = {
    "deep_json": (lambda text: text.rstrip().rstrip("}") + ', "extra": ' + "[" * DEEP + "]" * DEEP + "}",
                  None, "nesting deeper than 64"),
    "integer_beyond_64_bits": (lambda text: text.replace('"format": 1', '"format": 99999999999999999999'), None,
                               "does not fit 64 bits"),
    "duplicate_key": (lambda text: text.replace('"format": 1', '"format": 1, "format": 1'), None,
                      "duplicate key 'format'"),
}


@pytest.fixture(scope="module")
def jvm_facts(tmp_path_factory):
    _, result = run_once(tmp_path_factory, "android-jvm-manifest", _build_and_run)
    return result


def _build_and_run(out):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    prog = pe.compile(model, example_inputs=(torch.randn(4, 3),), example_targets=(torch.randn(4, 2),), loss="mse",
                      optimizer=pe.SGD(lr=0.1), name="manifest_probe")
    bundle, library = build_jvm_model(prog, out)
    text = (bundle / "model.json").read_text()
    cases = out / "cases"
    shutil.copytree(bundle, cases / "ok")
    for name, (mutate, _, _) in CASES.items():
        d = cases / name
        shutil.copytree(bundle, d)
        m = json.loads(text)
        mutate(m)
        (d / "model.json").write_text(json.dumps(m, indent=2))
    os.symlink("/etc/passwd", cases / "weights_symlink_escape" / "escape.pockckpt")
    for name, (mutate, _, _) in RAW.items():
        d = cases / name
        shutil.copytree(bundle, d)
        (d / "model.json").write_text(mutate(text))
    core = android.kotlin_core_jar()
    test_jar = android.compile_kotlin([os.path.join(HERE, "ManifestJvmTest.kt")], "manifest-jvm-test",
                                      classpath=[core, android.kotlin_stdlib()])
    return run_kotlin_main([core, test_jar], "ManifestJvmTestKt", [cases, library, FUZZ_SECONDS], "ManifestJvmTest")


def test_the_untampered_bundle_opens(jvm_facts):
    assert jvm_facts["case.ok"] == "OK", jvm_facts
    assert jvm_facts["done"] == "true"


@pytest.mark.parametrize("case", [*CASES, *RAW])
def test_a_tampered_manifest_is_a_pock_exception_naming_the_field(jvm_facts, case):
    _, field, says = CASES.get(case) or RAW[case]
    got = jvm_facts[f"case.{case}"]
    assert got.startswith("PockException INVALID_ARGUMENT "), got
    if field is not None:
        assert f"manifest field '{field}'" in got, got
    assert says in got, got


def test_the_manifest_reader_survives_fuzzing(jvm_facts):
    assert jvm_facts["fuzz_first_bad"] == "none"
    assert int(jvm_facts["fuzz_runs"]) >= 1000
    assert "FATAL" not in jvm_facts["_stderr"]
