"""platforms/android.py without building anything: the SoC table's errors, the
NDK search and the message when there is no NDK (nothing here compiles)."""
from __future__ import annotations

import pytest

from pockengine.errors import PockError
from pockengine.platforms import android
from pockengine.platforms.socs import SOCS, get_soc

NDK_VARS = ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "ANDROID_HOME", "ANDROID_SDK_ROOT")


@pytest.fixture
def no_ndk(monkeypatch):
    for var in NDK_VARS:
        monkeypatch.delenv(var, raising=False)


def test_unknown_soc_lists_the_known(tmp_path):
    with pytest.raises(PockError) as e:
        android.build_android(None, tmp_path / "out", soc="sm9999")
    for name in ("sm8450", "sm8550", "sm8650", "sm8750", "generic-arm64"):
        assert name in str(e.value)
    assert "sm9999" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_soc_table_targets_arm64():
    assert get_soc("SM8550").march.startswith("armv9-a")
    for soc in SOCS.values():
        assert soc.abi == "arm64-v8a" and soc.march.startswith("armv") and "dotprod" in soc.features


def test_without_ndk_says_what_to_install(no_ndk, tmp_path):
    with pytest.raises(PockError) as e:
        android.build_android(None, tmp_path / "out", soc="sm8550")
    msg = str(e.value)
    assert "needs the Android NDK" in msg and "ANDROID_NDK_HOME" in msg and "--cxx" in msg and "install" in msg


def test_unknown_abi_and_cxx_for_other_abis(no_ndk, tmp_path):
    with pytest.raises(PockError, match=r"unknown Android ABI.*mips.*known: arm64-v8a, armeabi-v7a, x86_64"):
        android.build_android(None, tmp_path, abis=["mips"])
    with pytest.raises(PockError, match=r"--cxx builds arm64-v8a only"):
        android.build_android(None, tmp_path, abis=["arm64-v8a", "x86_64"], cxx="aarch64-linux-gnu-g++")
    with pytest.raises(PockError, match=r"--cxx 'no-such-g\+\+': compiler not found"):
        android.build_android(None, tmp_path, cxx="no-such-g++")


def test_ndk_search_order(no_ndk, monkeypatch, tmp_path):
    sdk = tmp_path / "sdk"
    for version in ("25.1.8937393", "27.2.12479018", "26.3.11579264"):
        (sdk / "ndk" / version).mkdir(parents=True)
    monkeypatch.setenv("ANDROID_HOME", str(sdk))
    assert android.find_ndk() == sdk / "ndk" / "27.2.12479018"  # the newest
    explicit = tmp_path / "android-ndk-r27c"
    explicit.mkdir()
    monkeypatch.setenv("ANDROID_NDK_ROOT", str(explicit))
    assert android.find_ndk() == explicit
    # an NDK without its clang is named in the error
    with pytest.raises(PockError, match=r"android-ndk-r27c has no toolchains/llvm/prebuilt"):
        android.build_android(None, tmp_path / "out", soc="sm8550")


def test_cxx_falls_back_when_the_compiler_lacks_the_socs_march():
    if not android.shutil.which("aarch64-linux-gnu-g++"):
        pytest.skip("aarch64-linux-gnu-g++ not installed")
    tool = ("aarch64-linux-gnu-g++",)
    assert android._supported_march(tool, get_soc("sm8550")) == "armv9-a+dotprod+fp16+i8mm"
    # GCC 12 has no armv9.2-a: the same extensions on ARMv8.2-A (a newer GCC keeps the SoC's)
    assert android._supported_march(tool, get_soc("sm8650")) in ("armv9.2-a+dotprod+fp16+i8mm",
                                                                  "armv8.2-a+dotprod+fp16+i8mm")
