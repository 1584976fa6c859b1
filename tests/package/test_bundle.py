"""bundle.read_bundle checks the manifest schema with the SDKs' bounds (ModelBundle.kt,
ModelManifest.swift): the tampered manifests of the Kotlin test (tests/sdk_android/
test_manifest.py) each raise PockError naming the field, and a bounded mutational fuzz of
the reader raises nothing else."""
import json
import os
import random
import time

import pytest

from pockengine.runtime.bundle import read_bundle
from pockengine.errors import PockError

GOOD = {
    "format": 1, "name": "probe", "hash": "ab" * 32, "library": "pock_probe", "weights": "weights.pockckpt",
    "inputs": [{"name": "input0", "shape": [4, 3], "dtype": "f32"}],
    "targets": [{"name": "target0", "shape": [4, 2], "dtype": "f32"}],
    "outputs": [{"name": "output0", "shape": [4, 2], "dtype": "f32"}],
    "optimizer": {"kind": "SGD", "lr": 0.1}, "prefix": None,
}


def _with(path, value):
    def mutate(m):
        *head, last = path
        for k in head:
            m = m[k]
        m[last] = value
    return mutate


CASES = {
    "negative_shape": (_with(["inputs", 0, "shape", 0], -4), "inputs[0].shape[0]", ">= 0"),
    "huge_output": (_with(["outputs", 0, "shape"], [46340, 46340]), "outputs[0].shape", "bytes"),
    "wrapped_dim": (_with(["inputs", 0, "shape", 0], 4294967302), "inputs[0].shape[0]", "more than 2147483647"),
    "float_dim": (_with(["inputs", 0, "shape", 0], 4.0), "inputs[0].shape[0]", "integer"),
    "bool_dim": (_with(["inputs", 0, "shape", 0], True), "inputs[0].shape[0]", "integer"),
    "string_shape": (_with(["inputs", 0, "shape"], "4x3"), "inputs[0].shape", "must be a list"),
    "too_many_dims": (_with(["inputs", 0, "shape"], [1] * 9), "inputs[0].shape", "more than 8"),
    "unknown_dtype": (_with(["inputs", 0, "dtype"], "f64"), "inputs[0].dtype", "f64"),
    "prefix_string": (_with(["prefix"], "x"), "prefix", "must be an object or null"),
    "prefix_file_escapes": (_with(["prefix"], {"files": {"onnx": "../../x.onnx"}}), "prefix.files.onnx",
                            "inside the bundle"),
    "name_not_string": (_with(["name"], 5), "name", "must be a non-empty string"),
    "inputs_not_list": (_with(["inputs"], {}), "inputs", "must be a list"),
    "weights_parent": (_with(["weights"], "../../../../etc/passwd"), "weights", "inside the bundle"),
    "weights_absolute": (_with(["weights"], "/etc/passwd"), "weights", "inside the bundle"),
    "weights_symlink_escape": (_with(["weights"], "escape.pockckpt"), "weights", "outside the bundle"),
}


def _bundle(tmp_path, text):
    d = tmp_path / "bundle"
    d.mkdir(exist_ok=True)
    (d / "weights.pockckpt").write_bytes(b"POCKCKPT")
    if not (d / "escape.pockckpt").is_symlink():
        os.symlink("/etc/passwd", d / "escape.pockckpt")
    (d / "model.json").write_text(text)
    return d


def test_the_good_manifest_reads(tmp_path):
    assert read_bundle(_bundle(tmp_path, json.dumps(GOOD)))["name"] == "probe"


@pytest.mark.parametrize("case", CASES)
def test_a_tampered_manifest_names_the_field(tmp_path, case):
    mutate, field, says = CASES[case]
    m = json.loads(json.dumps(GOOD))
    mutate(m)
    with pytest.raises(PockError, match="manifest field") as e:
        read_bundle(_bundle(tmp_path, json.dumps(m)))
    assert f"manifest field {field!r}" in str(e.value) and says in str(e.value)


@pytest.mark.parametrize("text, says", [
    (json.dumps(GOOD)[:-1] + ', "extra": ' + "[" * 200_000 + "]" * 200_000 + "}", "nesting deeper than 64"),
    (json.dumps(GOOD).replace('"format": 1', '"format": NaN'), "corrupt manifest"),
    (json.dumps(GOOD).replace('"format": 1', '"format": 1.0'), "bundle format"),
    ("[1, 2]", "not a JSON object"),
])
def test_a_hostile_manifest_text_is_refused(tmp_path, text, says):
    with pytest.raises(PockError, match=says):
        read_bundle(_bundle(tmp_path, text))


TOKENS = ["{", "}", "[", "]", ",", ":", '"', "\\", "null", "true", "-1", "0", "4294967302", "1e400", "-0", "1.5",
          '"x"', "[]", "{}", '"../w"', '"/etc/passwd"', "[[[[[[[[", "]]]]]]]]", "NaN"]


def test_the_reader_survives_fuzzing(tmp_path):
    """Mutations of the good manifest (bit flips, spliced tokens, deletions, duplicated slices) for
    about 3 s: each either reads or raises PockError."""
    seed = json.dumps(GOOD, indent=1)
    rng = random.Random(20261201)
    d = _bundle(tmp_path, seed)
    runs, read, deadline = 0, 0, time.monotonic() + 3
    while time.monotonic() < deadline and runs < 20000:
        text = list(seed)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(text) + 1)
            op = rng.randrange(4)
            if op == 0 and at < len(text):
                text[at] = chr(ord(text[at]) ^ (1 << rng.randrange(7)))
            elif op == 1:
                text[at:at] = rng.choice(TOKENS)
            elif op == 2:
                del text[at:at + rng.randint(1, 16)]
            else:
                start = rng.randrange(len(text))
                text[at:at] = text[start:start + rng.randint(1, 64)]
        (d / "model.json").write_text("".join(text))
        runs += 1
        try:
            read_bundle(d)
            read += 1
        except PockError:
            pass
    assert runs >= 200
