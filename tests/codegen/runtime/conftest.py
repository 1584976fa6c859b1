"""Build helpers for kernel tests: compile every runtime kernel plus one test shim
(extern "C" wrappers over the pk:: kernels) into a shared library and load it."""
import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import march_flags

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "codegen" / "runtime"
SHIMS = Path(__file__).resolve().parent / "shims"
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", *march_flags()]


def _sources(shim):
    """Every kernel, the thread pool they run on, and the shim."""
    return sorted((RUNTIME / "kernels").glob("*.cpp")) + [RUNTIME / "threadpool.cpp", SHIMS / shim]


def build_shim(shim: str, extra_flags=()) -> ctypes.CDLL:
    """Compile kernels + shims/<shim> (cached by content hash) and load it."""
    srcs = _sources(shim)
    flags = [*FLAGS, *extra_flags]
    h = hashlib.sha256(" ".join(flags + [CXX]).encode())
    for s in srcs + sorted(RUNTIME.rglob("*.h")):  # kernels/*.h too (conv_common.h, rnn_math.h)
        h.update(s.read_bytes())
    out_dir = Path(os.environ.get("POCK_CACHE_DIR", Path.home() / ".cache" / "pockengine")) / "shims"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{Path(shim).stem}-{h.hexdigest()[:16]}.so"
    if not lib.exists():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([CXX, *flags, "-I", str(RUNTIME / "include"), "-I", str(RUNTIME), *map(str, srcs), "-o", str(tmp)],
                       check=True)
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


def ptr(a: np.ndarray):
    """A ctypes void pointer to a contiguous numpy array (None stays None)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.fixture(scope="session")
def shim_builder():
    return build_shim
