"""Build helpers for kernel tests: compile every runtime kernel plus the test shims
(extern "C" wrappers over the pk:: kernels, generated from the op records and
pock_kernels.h; and optionally one hand-written file of test helpers: thread pools,
scratch sizes) into a shared library and load it."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import build_kernel_library
from pockengine.ops.kernels import argtypes, record_shim_kernels, signatures, write_record_shims

SHIMS = Path(__file__).resolve().parent / "shims"


def build_shim(shim: str | None = None, extra_flags=()) -> ctypes.CDLL:
    """Every kernel + the thread pool + the shims derived from the op records (a `shim_<kernel>`
    for each kernel a record calls with plain arguments, its ctypes signature set: see
    pockengine.ops.kernels) + shims/<shim> (hand-written helpers: thread pools, scratch sizes;
    a kernel it wraps is left out of the generated file),
    compiled and cached by build.host.build_kernel_library, and loaded."""
    hand = [SHIMS / shim] if shim else []
    srcs = [write_record_shims(beside=hand)] + hand
    lib = ctypes.CDLL(str(build_kernel_library(srcs, extra_flags, name=Path(shim or "record_shims").stem)))
    sigs = signatures()
    for name in record_shim_kernels(beside=hand):
        fn = getattr(lib, f"shim_{name}")
        fn.argtypes, fn.restype = argtypes(sigs[name])
    return lib


def ptr(a: np.ndarray):
    """A ctypes void pointer to a contiguous numpy array (None stays None)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.fixture(scope="session")
def shim_builder():
    return build_shim
