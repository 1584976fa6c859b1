"""pock-build's CMakeLists.txt of a Vulkan build builds the Vulkan library: configured and
built with cmake, the library links the Vulkan loader and holds the Vulkan runtime."""
import ctypes.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pockengine as pe
from pockengine.cli import cmake_lists
from pockengine.codegen import RUNTIME_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import MLP, batches  # noqa: E402

NO_TOOLS = next((why for why, bad in (("no cmake", shutil.which("cmake") is None),
                                      ("no glslc", shutil.which("glslc") is None),
                                      ("no libvulkan", ctypes.util.find_library("vulkan") is None)) if bad), None)


def test_cpu_cmakelists_is_unchanged():
    text = cmake_lists("m", RUNTIME_DIR)
    assert "add_library(pock_m SHARED m.cpp ${POCK_CORE} ${POCK_KERNELS})" in text
    assert "Vulkan" not in text


@pytest.mark.slow
@pytest.mark.skipif(NO_TOOLS is not None, reason=str(NO_TOOLS))
def test_vulkan_cmake_project_builds_the_vulkan_library(tmp_path):
    torch.manual_seed(0)
    (x,), (y,) = batches("mlp")[0]
    prog = pe.compile(MLP(), (x,), (y,), optimizer=pe.SGD(lr=0.1), name="vk_cmake")
    source = prog.emit(["vulkan", "cpu"])
    assert "pvk::" in source.text
    (tmp_path / "vk_cmake.cpp").write_text(source.text)
    (tmp_path / "CMakeLists.txt").write_text(cmake_lists("vk_cmake", RUNTIME_DIR, vulkan=True))
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(tmp_path), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "-j", "2"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (lib,) = build.glob("libpock_vk_cmake.*")
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libvulkan" in needed  # linked to the Vulkan loader
    symbols = subprocess.run(["nm", "-DC", str(lib)], capture_output=True, text=True).stdout
    assert "pock_step" in symbols
    syms_all = subprocess.run(["nm", "-C", str(lib)], capture_output=True, text=True).stdout
    assert "pvk::" in syms_all  # the Vulkan runtime is in the library
