"""`pock-build --platform android --soc sm8550 --cxx aarch64-linux-gnu-g++` on
the keyboard model: the AAR holds every required entry, classes.jar holds the
Kotlin API, the .so is an aarch64 ELF exporting the JNI entry points, and the
same library trains under qemu-aarch64 (tests/arm64/train_driver.c linked
against it) with the host's losses."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import build_shared_library
from pockengine.runtime.trainer import Trainer
from shared_build import KEYBOARD_SPEC, load_keyboard_spec, run_once

ROOT = Path(__file__).resolve().parents[2]
CXX, CC, QEMU = "aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc", "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
STEPS = 5
JNI_METHODS = ("open", "close", "step", "forward", "save", "load", "getLearningRate", "setLearningRate",
               "stepCount", "setNumThreads", "modelName", "modelHash", "version", "getTensor", "setTensor",
               "tensorCount", "tensorName", "tensorInfo", "saveTrained", "profileEnable", "profileReset",
               "profileCount", "profileEntry")

missing = [t for t in (CXX, CC, QEMU) if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(bool(missing), reason=f"missing {missing} (apt-get install g++-aarch64-linux-gnu qemu-user)")


def pock_build(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_NDK", "ANDROID_HOME", "ANDROID_SDK"))}
    return subprocess.run([sys.executable, "-m", "pockengine.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(out dir, pock-build's stdout), built once per session."""
    def build(work):
        r = pock_build(f"{KEYBOARD_SPEC}:make", "--platform", "android", "--soc", "sm8550", "--cxx", CXX,
                       "--out", work / "out", cwd=ROOT)
        assert r.returncode == 0, r.stderr[-4000:]
        return {"stdout": r.stdout, "stderr": r.stderr}

    work, result = run_once(tmp_path_factory, "android-aar", build)
    return work / "out", result["stdout"]


@pytest.fixture(scope="module")
def build_stderr(built, tmp_path_factory):
    """What that pock-build printed on stderr."""
    return run_once(tmp_path_factory, "android-aar", None)[1]["stderr"]


def test_cli_lists_what_it_wrote(built):
    out, stdout = built
    for what in ("aar", "pom", "gradle", "jni:arm64-v8a"):
        assert re.search(rf"^\s+{re.escape(what)}\s+\S+", stdout, re.M), stdout
    pom = (out / "pockengine-keyboard.pom").read_text()
    assert "<packaging>aar</packaging>" in pom and "<artifactId>pockengine-keyboard</artifactId>" in pom
    assert "kotlin-stdlib" in pom and "<artifactId>kotlinx-coroutines-core</artifactId>" in pom
    assert 'implementation(files("libs/pockengine-keyboard.aar"))' in (out / "consume.gradle.kts").read_text()


def test_aar_has_every_entry(built, tmp_path):
    out, _ = built
    with zipfile.ZipFile(out / "pockengine-keyboard.aar") as aar:
        names = set(aar.namelist())
        assert {"AndroidManifest.xml", "classes.jar", "R.txt", "proguard.txt",
                "jni/arm64-v8a/libpock_keyboard.so", "assets/pockengine/keyboard/model.json",
                "assets/pockengine/keyboard/weights.pockckpt"} <= names, names
        manifest = aar.read("AndroidManifest.xml").decode()
        assert 'android:minSdkVersion="24"' in manifest and 'package="ai.pockengine.keyboard"' in manifest
        rules = aar.read("proguard.txt").decode()
        assert "-keep class ai.pockengine.PockNative" in rules and "PockException" in rules
        assert aar.read("assets/pockengine/keyboard/weights.pockckpt") == (out / "bundle" / "weights.pockckpt").read_bytes()
        assert b'"library": "pock_keyboard"' in aar.read("assets/pockengine/keyboard/model.json")
        (tmp_path / "classes.jar").write_bytes(aar.read("classes.jar"))
    with zipfile.ZipFile(tmp_path / "classes.jar") as jar:
        classes = set(jar.namelist())
    for cls in ("PockTrainer", "PockException", "PockTensor", "PockNative", "ModelBundle"):
        assert f"ai/pockengine/{cls}.class" in classes, classes
    # the android helpers ship too (issue 41), compiled against stubs that stay out of the AAR
    for cls in ("PockAssets", "PockTrainingWorker"):
        assert f"ai/pockengine/android/{cls}.class" in classes, classes
    assert all(c.startswith(("ai/pockengine/", "META-INF/")) for c in classes), \
        [c for c in classes if not c.startswith(("ai/pockengine/", "META-INF/"))]


def test_library_is_aarch64_and_exports_jni(built):
    out, _ = built
    lib = out / "jni" / "arm64-v8a" / "libpock_keyboard.so"
    head = lib.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and head[4] == 2  # ELF64
    assert struct.unpack_from("<H", head, 18)[0] == 183  # e_machine EM_AARCH64
    nm = subprocess.run(["aarch64-linux-gnu-nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                        check=True).stdout
    exported = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    assert {f"Java_ai_pockengine_PockNative_{m}" for m in JNI_METHODS} | {"JNI_OnLoad", "pock_step"} <= exported
    assert not [s for s in exported if s.startswith("_Z")], "the static C++ runtime leaks symbols"
    needed = subprocess.run(["aarch64-linux-gnu-readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "libstdc++" not in needed and "SONAME" in needed and "libpock_keyboard.so" in needed


def test_library_trains_under_qemu_like_the_host(built, tmp_path):
    out, _ = built
    libdir = out / "jni" / "arm64-v8a"
    exe = tmp_path / "train"
    subprocess.run([CC, "-O2", "-I", str(ROOT / "native" / "runtime" / "include"),
                    str(ROOT / "tests" / "arm64" / "train_driver.c"), "-L", str(libdir), "-lpock_keyboard",
                    f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True, capture_output=True, text=True)

    keyboard_spec = load_keyboard_spec()
    batches = [keyboard_spec.example_batch(seed) for seed in range(STEPS)]
    with open(tmp_path / "data.bin", "wb") as f:
        for x, y in batches:
            f.write(x.numpy().astype("<i8").tobytes() + y.numpy().astype("<i8").tobytes())
    weights = out / "bundle" / "weights.pockckpt"
    r = subprocess.run([QEMU, "-L", SYSROOT, "-cpu", "max", str(exe), str(weights), str(tmp_path / "data.bin"),
                        str(STEPS), str(tmp_path / "arm.ckpt"), "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"train_driver under qemu failed:\n{r.stdout}\n{r.stderr}"
    arm = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("loss ")]

    host_lib = build_shared_library([out / "keyboard.cpp"], tmp_path / "host")  # the same generated source
    with Trainer(host_lib, checkpoint=weights) as host:
        want = [host.step((x,), (y,)) for x, y in batches]
    assert len(arm) == STEPS
    np.testing.assert_allclose(arm, want, rtol=1e-4, err_msg="losses: aarch64 AAR library vs host")
    with Trainer(host_lib, checkpoint=tmp_path / "arm.ckpt") as resumed:  # its checkpoint loads on the host
        assert resumed.step_count == STEPS


def test_aar_with_htp_prefix_ships_the_context_binary_for_the_soc(tmp_path):
    """--backends htp,cpu: the frozen embedding goes to the NPU; the AAR's assets hold its
    QNN context binary (compiled for SM8550 / HTP v73) and ONNX fallback, model.json records
    the split, the step's library takes the prefix output, and the POM pulls ONNX Runtime QNN."""
    pytest.importorskip("onnxruntime_qnn")
    import json

    from pockengine.backends.htp import binary_info
    r = pock_build(f"{KEYBOARD_SPEC}:make_sparse", "--platform", "android", "--soc", "sm8550", "--backends",
                   "htp,cpu", "--cxx", CXX, "--out", tmp_path / "out", cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]
    with zipfile.ZipFile(tmp_path / "out" / "pockengine-keyboard.aar") as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("assets/pockengine/keyboard/model.json"))
        prefix = manifest["prefix"]
        for key in ("onnx", "context", "context_binary"):
            assert f"assets/pockengine/keyboard/{prefix['files'][key]}" in names
        binary = tmp_path / "prefix.bin"
        binary.write_bytes(z.read(f"assets/pockengine/keyboard/{prefix['files']['context_binary']}"))
    assert (prefix["soc"], prefix["htp_arch"], prefix["qnn_soc_model"]) == ("sm8550", 73, 43)
    info = binary_info(binary)
    assert "SM8550" in str(info["soc"]).upper() and info["htp_arch"] == 73, info
    assert [i["name"] for i in prefix["inputs"]] == ["input0"] and prefix["kept_inputs"] == []
    assert [i["name"] for i in manifest["inputs"]] == [o["name"] for o in prefix["outputs"]]
    assert manifest["inputs"][0]["dtype"] == "f32" and manifest["inputs"][0]["shape"][-1] == 64
    assert "onnxruntime-android-qnn" in (tmp_path / "out" / "pockengine-keyboard.pom").read_text()


def test_htp_needs_a_soc_with_an_npu(tmp_path):
    r = pock_build(f"{KEYBOARD_SPEC}:make_sparse", "--platform", "android", "--soc", "generic-arm64",
                   "--backends", "htp,cpu", "--cxx", CXX, "--out", tmp_path / "out", cwd=ROOT)
    assert r.returncode == 2 and "needs a SoC with a Hexagon HTP" in r.stderr and "sm8550" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_glibc_build_is_a_loudly_marked_test_artifact(built, build_stderr):
    """--cxx aarch64-linux-gnu-g++ makes natives that need glibc: pock-build says so on stderr and
    the AAR's manifest records it (an app build can refuse it)."""
    out, _ = built
    assert "TEST ARTIFACT, NOT FOR ANDROID" in build_stderr and "libc.so.6" in build_stderr, build_stderr[-2000:]
    lib = out / "jni" / "arm64-v8a" / "libpock_keyboard.so"
    needed = subprocess.run(["aarch64-linux-gnu-readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "[libc.so.6]" in needed  # what the warning is about
    with zipfile.ZipFile(out / "pockengine-keyboard.aar") as aar:
        manifest = aar.read("AndroidManifest.xml").decode()
    assert '<meta-data android:name="ai.pockengine.native_libc" android:value="glibc" />' in manifest
    assert "TEST ARTIFACT" in manifest


def test_the_readmes_android_snippet_compiles_against_the_aar(built, tmp_path):
    """The README's Kotlin block (## Android) compiled with kotlinc against the AAR's classes.jar and
    the android stubs (the types an app gets from android.jar and androidx.work)."""
    from pockengine.platforms import android
    out, _ = built
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Android\n"):readme.index("\n## iOS\n")]
    snippet = re.search(r"```kotlin\n(.*?)```", section, re.S).group(1)
    assert "ai.pockengine.android.PockAssets" in snippet
    (tmp_path / "ReadmeSnippet.kt").write_text(snippet)
    with zipfile.ZipFile(out / "pockengine-keyboard.aar") as aar:
        (tmp_path / "classes.jar").write_bytes(aar.read("classes.jar"))
    jar = android.compile_kotlin([tmp_path / "ReadmeSnippet.kt"], "readme-android-snippet",
                                 classpath=[tmp_path / "classes.jar", android.android_stubs_jar(),
                                            android.kotlin_coroutines(), android.kotlin_stdlib()])
    assert jar.exists()
