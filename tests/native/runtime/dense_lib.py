"""What the dense-kernel tests share (test_kernels_dense.py, test_kernels_conv.py): output
buffers pre-filled with NaN (catches elements never written) and followed by a guard region that
must stay untouched (catches out-of-bounds writes), ctypes pointers, and the float32 comparison."""
import ctypes

import numpy as np
import torch

RTOL, ATOL = 1e-4, 1e-5
GUARD = 16
SENTINEL = -12345.0

vp = ctypes.c_void_p


class Buffers:
    """Output buffers: NaN-filled (or given initial values), each followed by a guard region."""

    def __init__(self):
        self.raw = []

    def __call__(self, *shape, dtype=np.float32, init=None):
        n = int(np.prod(shape))
        raw = np.empty(n + GUARD, dtype=dtype)
        if init is not None:
            raw[:n] = np.asarray(init, dtype=dtype).reshape(-1)
        else:
            raw[:n] = np.nan if dtype == np.float32 else -777
        raw[n:] = SENTINEL
        self.raw.append((raw, n))
        return raw[:n].reshape(shape)

    def check_guards(self):
        for raw, n in self.raw:
            assert (raw[n:] == np.asarray(SENTINEL, dtype=raw.dtype)).all(), "write past the end of an output"


def P(a):
    """ctypes pointer of a contiguous array (None stays None)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(vp)


def I64(values):
    arr = np.ascontiguousarray(values, dtype=np.int64)
    return arr, P(arr)


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def T(a, grad=False):
    return torch.tensor(a, requires_grad=grad)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
