"""pock-build --platform ios off macOS: the XCFramework (zig), the bundle, the Swift package."""
import json
import plistlib
import re

import lief
import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.runtime.bundle import read_bundle
from pockengine.codegen import RUNTIME_DIR
from pockengine.platforms.ios import SLICES, build_ios, swift_name
from pockengine.platforms.macho import read_archive, read_fat, read_macho

from ios_models import tiny_spec

lief.logging.disable()
POCK_API = sorted(set(re.findall(r"POCK_API\s+[\w\s\*]+?\b(pock_\w+)\s*\(", (RUNTIME_DIR / "include" / "pock.h").read_text())))
EXPECTED = {"ios-arm64": [("arm64", "ios")],
            "ios-arm64_x86_64-simulator": [("arm64", "ios-simulator"), ("x86_64", "ios-simulator")]}


def test_swift_name():
    assert swift_name("tiny_tagger") == "TinyTagger"
    assert swift_name("keyboard") == "Keyboard"


def test_info_plist_names_both_slices(ios_build):
    xcf = ios_build["xcframework"]
    assert xcf.name == "TinyTagger.xcframework"
    info = plistlib.loads((xcf / "Info.plist").read_bytes())
    assert info["CFBundlePackageType"] == "XFWK" and info["XCFrameworkFormatVersion"] == "1.0"
    libs = {lib["LibraryIdentifier"]: lib for lib in info["AvailableLibraries"]}
    assert set(libs) == {"ios-arm64", "ios-arm64_x86_64-simulator"}
    assert libs["ios-arm64"]["SupportedArchitectures"] == ["arm64"]
    assert "SupportedPlatformVariant" not in libs["ios-arm64"]
    assert libs["ios-arm64_x86_64-simulator"]["SupportedArchitectures"] == ["arm64", "x86_64"]
    assert libs["ios-arm64_x86_64-simulator"]["SupportedPlatformVariant"] == "simulator"
    for ident, lib in libs.items():
        assert lib["SupportedPlatform"] == "ios" and lib["LibraryPath"] == "libpock_tiny_tagger.a"
        assert (xcf / ident / lib["LibraryPath"]).is_file()
        headers = xcf / ident / lib["HeadersPath"]
        assert (headers / "pock.h").read_bytes() == (RUNTIME_DIR / "include" / "pock.h").read_bytes()
        modulemap = (headers / "module.modulemap").read_text()
        assert 'module PockC {' in modulemap and 'header "pock.h"' in modulemap and 'link "c++"' in modulemap


@pytest.mark.parametrize("ident", sorted(EXPECTED))
def test_every_object_is_macho_for_its_platform_ios15(ios_build, ident):
    blob = (ios_build["xcframework"] / ident / "libpock_tiny_tagger.a").read_bytes()
    slices = read_fat(blob)
    seen = []
    for _cpu, archive in slices:
        members = read_archive(archive)
        stems = {name.rsplit("-", 1)[0] for name, _ in members}  # cached objects are <stem>-<hash>.o
        assert {"pock_api", "checkpoint", "gemm", "linear", "tiny_tagger"} <= stems, stems
        kinds = set()
        for name, obj in members:
            ours = read_macho(obj)
            theirs = lief.parse(obj)  # an independent reader agrees
            assert isinstance(theirs, lief.MachO.Binary), name
            assert theirs.header.file_type == lief.MachO.Header.FILE_TYPE.OBJECT
            bv = theirs.build_version
            want = lief.MachO.BuildVersion.PLATFORMS.IOS if ours.platform == "ios" else \
                lief.MachO.BuildVersion.PLATFORMS.IOS_SIMULATOR
            assert bv.platform == want and list(bv.minos) == [15, 0, 0], name
            assert ours.minos == (15, 0, 0)
            assert theirs.header.cpu_type.name.lower().replace("_", "") == ours.cpu.replace("_", ""), name
            kinds.add((ours.cpu, ours.platform))
        assert len(kinds) == 1, kinds
        seen += kinds
    assert seen == EXPECTED[ident]


@pytest.mark.parametrize("ident", sorted(EXPECTED))
def test_c_api_symbols_are_exported(ios_build, ident):
    blob = (ios_build["xcframework"] / ident / "libpock_tiny_tagger.a").read_bytes()
    for _cpu, archive in read_fat(blob):
        exported = set().union(*(read_macho(obj).exported for _, obj in read_archive(archive)))
        assert len(POCK_API) == (RUNTIME_DIR / "include" / "pock.h").read_text().count("\nPOCK_API ")
        missing = [s for s in POCK_API if s not in exported]
        assert not missing, missing
        # kernels, runtime internals and inline libc++ stay hidden (-fvisibility=hidden)
        assert exported - set(POCK_API) <= {"pock_compiled_model"}, sorted(exported - set(POCK_API))


def test_bundle_weights_load_on_host_and_equal_the_model(ios_build):
    prog, bundle = ios_build["prog"], ios_build["bundle"]
    m = read_bundle(bundle)
    assert m["name"] == "tiny_tagger" and m["hash"] == prog.hash and m["prefix"] is None
    assert m["inputs"] == [{"name": m["inputs"][0]["name"], "shape": [2, 4], "dtype": "i64"}]
    trainer = prog.build_cpu()
    try:
        trainer.load(bundle / m["weights"])  # pock_load validates hash, names, shapes, CRC
        model = ios_build["spec"]["model"]
        for name, p in model.state_dict().items():
            np.testing.assert_array_equal(trainer.get_tensor(name), p.numpy())
        assert trainer.step_count == 0 and trainer.learning_rate == pytest.approx(0.1)
        x, y = ios_build["spec"]["example_inputs"][0], ios_build["spec"]["example_targets"][0]
        ref = torch.nn.functional.cross_entropy(model(x).reshape(-1, 20), y.reshape(-1)).item()
        assert trainer.step((x,), (y,)) == pytest.approx(ref, rel=1e-5)
    finally:
        trainer.close()


def test_swift_package_references_the_xcframework_and_bundle(ios_build):
    out = ios_build["package"]
    package = (out / "Package.swift").read_text()
    assert '.binaryTarget(name: "TinyTagger", path: "TinyTagger.xcframework")' in package
    assert ".iOS(.v15)" in package and 'resources: [.copy("Resources/tiny_tagger.pockmodel")]' in package
    res = out / "Sources" / "PockTinyTagger" / "Resources" / "tiny_tagger.pockmodel"
    assert json.loads((res / "model.json").read_text()) == read_bundle(ios_build["bundle"])
    assert (res / "weights.pockckpt").read_bytes() == (ios_build["bundle"] / "weights.pockckpt").read_bytes()
    sdk = out.parents[0]  # the sdk's sources are copied verbatim
    from pockengine.platforms.ios import SDK_DIR
    for src in (SDK_DIR / "Sources" / "PockEngine").glob("*.swift"):
        assert (out / "Sources" / "PockEngine" / src.name).read_text() == src.read_text()
    assert "PockTrainer(modelURL: bundleURL" in (out / "Sources" / "PockTinyTagger" / "PockTinyTagger.swift").read_text()
    del sdk


def test_cli_builds_for_ios(ios_build, tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text("import sys\nsys.path.insert(0, %r)\nfrom ios_models import tiny_spec as make\n"
                    % str(__import__("pathlib").Path(__file__).parent))
    from pockengine.cli import main
    assert main([f"{spec}:make", "--platform", "ios", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "TinyTagger.xcframework" / "Info.plist").is_file()
    # the same sources give byte-identical libraries (cached objects, deterministic archives)
    for ident in SLICES:
        lib = f"TinyTagger.xcframework/{ident}/libpock_tiny_tagger.a"
        assert (tmp_path / "out" / lib).read_bytes() == (ios_build["out"] / lib).read_bytes()


def test_coreml_with_nothing_frozen_runs_everything_in_cpp(ios_build, tmp_path):
    prog = pe.compile(**tiny_spec())  # update="full": no frozen prefix to hand to Core ML
    files = build_ios(prog, tmp_path, coreml=True)
    assert read_bundle(files["bundle"])["prefix"] is None and not (files["bundle"] / "prefix").exists()
