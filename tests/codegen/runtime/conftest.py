"""Build helpers for kernel tests: compile every runtime kernel plus one test shim
(extern "C" wrappers over the pk:: kernels) into a shared library and load it."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import build_kernel_library

SHIMS = Path(__file__).resolve().parent / "shims"


def build_shim(shim: str, extra_flags=()) -> ctypes.CDLL:
    """Every kernel + the thread pool + shims/<shim>, compiled and cached by
    build.host.build_kernel_library, and loaded."""
    return ctypes.CDLL(str(build_kernel_library([SHIMS / shim], extra_flags)))


def ptr(a: np.ndarray):
    """A ctypes void pointer to a contiguous numpy array (None stays None)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.fixture(scope="session")
def shim_builder():
    return build_shim
