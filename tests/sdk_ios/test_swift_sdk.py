"""The Swift layer (sdk-ios/) cannot be compiled here, so it is kept a one-to-one
wrapper and these tests hold it to that: every public PockTrainer member calls
the pock_ functions declared in pock.h the table below names (step/forward also run
the Core ML prefix), the module map's header is pock.h itself, and the manifest fields and
error codes Swift decodes are those the toolchain and C API produce."""
import re

from pockengine.runtime.bundle import manifest
from pockengine.codegen import RUNTIME_DIR
from pockengine.platforms.ios import SDK_DIR

SOURCES = SDK_DIR / "Sources" / "PockEngine"
POCK_H = (RUNTIME_DIR / "include" / "pock.h").read_text()
DECLARED = set(re.findall(r"POCK_API\s+[\w\s\*]+?\b(pock_\w+)\s*\(", POCK_H))
STRUCTS = set(re.findall(r"typedef (?:struct|enum) (pock_\w+)", POCK_H))  # pock_tensor(...) builds a struct


def c_calls(code: str) -> list[str]:
    return [c for c in re.findall(r"\b(pock_\w+)\(", code) if c not in STRUCTS]
# public member -> the C functions it calls (None: it delegates to step / forward(inputs:into:))
WRAPS = {"init(modelURL:": ("pock_open",), "deinit": ("pock_close",), "func close(": ("pock_close",),
         "func step(": ("pock_step", "pock_last_error"), "func forward(inputs: [PockTensor], into": ("pock_forward",),
         "func forward(inputs: [PockTensor]) throws": None,
         "func save(": ("pock_save_trained", "pock_save"), "func load(": ("pock_load",),
         "var stateTensors": ("pock_tensor_count", "pock_tensor_info_at"), "func tensor(named": ("pock_get_tensor",),
         "func setTensor(": ("pock_set_tensor",),
         "var learningRate": ("pock_get_learning_rate",), "func setLearningRate(": ("pock_set_learning_rate",),
         "var stepCount": ("pock_step_count",), "func setNumThreads(": ("pock_set_num_threads",),
         "func profile(": ("pock_profile_enable", "pock_profile_reset", "pock_profile_count", "pock_profile_entry"),
         "func stepAsync(": None, "func train(": None,
         "var canGenerate": ("pock_generate_supported",), "func generate(": ("pock_generate_default_options", "pock_generate"),
         "func exportAdapter(": ("pock_export_adapter",)}


def members(source: str) -> dict[str, str]:
    """public/deinit members of a Swift class -> their bodies (brace matched)."""
    out = {}
    for m in re.finditer(r"^    (?:public (?:func|var|init)|deinit)\b[^\n]*", source, re.M):
        start = source.index("{", m.start())
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            if depth == 0:
                break
            i += 1
        out[m.group(0).strip()] = source[start:i + 1]
    return out


def test_pock_h_copy_is_identical():
    assert (SDK_DIR / "Sources" / "PockC" / "pock.h").read_text() == POCK_H
    assert 'header "pock.h"' in (SDK_DIR / "Sources" / "PockC" / "module.modulemap").read_text()


def test_every_trainer_member_calls_one_c_function():
    body = members((SOURCES / "PockTrainer.swift").read_text())
    seen = set()
    for signature, code in body.items():
        key = next((k for k in WRAPS if k in signature), None)
        assert key is not None, f"public member {signature!r} is not in the wrapper table"
        seen.add(key)
        calls = c_calls(code)
        assert set(calls) <= DECLARED, calls
        if WRAPS[key] is None:
            assert calls == [] and ("self.step(inputs:" in code or "try forward(inputs:" in code), signature
        else:
            assert set(calls) == set(WRAPS[key]), (signature, calls)
        if key in ("func step(", "func forward(inputs: [PockTensor], into"):
            assert code.count("prefix?.stepInputs(") == 1  # the Core ML prefix, then the compiled step
        if key not in ("init(modelURL:", "deinit", "func close(", "var stateTensors", "var canGenerate") and WRAPS[key]:
            assert "try locked {" in code, f"{signature} must hold the trainer's lock"
    assert seen == set(WRAPS)
    every = c_calls("".join(p.read_text() for p in SOURCES.glob("*.swift")))
    assert set(every) <= DECLARED and "pock_last_error" in every


def test_error_codes_match_pock_status():
    codes = {int(v) for v in re.findall(r"POCK_ERR_\w+ = (\d+)", POCK_H)}
    swift = (SOURCES / "PockError.swift").read_text()
    run = re.search(r"case invalidArgument = 1, ([\w, ]+)\n", swift).group(1).split(", ")  # 1, 2, 3, ...
    explicit = {int(v) for v in re.findall(r"case \w+ = (\d+)", swift) if int(v) < 100}  # 100+: Swift-only
    assert set(range(1, len(run) + 2)) | explicit == codes


def test_manifest_fields_swift_decodes_exist(ios_build):
    swift = (SOURCES / "ModelManifest.swift").read_text()
    top = manifest(ios_build["prog"])
    top_fields = re.findall(r"^    public let (\w+):", swift, re.M)
    assert top_fields and set(top_fields) <= set(top), set(top_fields) - set(top)
    io_fields = re.findall(r"^        public let (\w+):", swift, re.M)
    assert {"name", "shape", "dtype", "inputs", "outputs", "coreml"} == set(io_fields)
    assert set(top["inputs"][0]) == {"name", "shape", "dtype"}
