"""The one-row low-precision product of generation's decode step (kernels/gemv.cpp,
pk::gemv_lowp): against float64 products of pockengine.schemes.quant.dequantize for every storage
format, over row counts that cut its 4-row passes and column counts that cut its 32-column
blocks; a one-hot x reads the dequantized weight back bit-exactly (q4: q * d rounded, then
+ m, never one FMA); the same bits on 1, 2 and 3 threads; and faster than the many-row
kernel (linear_fwd_lowp) at one row."""
import ctypes

import numpy as np
import pytest

from pockengine.schemes.quant import dequantize, quantize
from test_kernels_lowp import CODES, P, stored
from test_threads import build_threads_lib

vp, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SHAPES = [(1, 32), (5, 64), (7, 96), (13, 576), (64, 1536), (3, 5), (6, 100), (2, 33)]


@pytest.fixture(scope="module")
def lib():
    lib = build_threads_lib()  # the library test_threads.py builds (shims/threads_shim.cpp)
    lib.shim_gemv_lowp_pool.restype = ctypes.c_double
    lib.shim_gemv_lowp_pool.argtypes = [vp, vp, vp, cint, vp, vp, vp, i64, i64, cint]
    return lib


@pytest.fixture(scope="module")
def pools(lib):
    made = {n: lib.shim_pool_create(n) for n in (2, 3)}
    yield made
    for p in made.values():
        lib.shim_pool_destroy(p)


def gemv(lib, pool, x, q, dt, scale, b, N, K, reps=0):
    y = np.full(N, np.nan, np.float32)
    t = lib.shim_gemv_lowp_pool(pool, P(x), P(q), CODES[dt], P(scale), P(b), P(y), N, K, reps)
    return y, t


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_lowp_matches_float64(lib, pools, dt, N, K):
    if dt == "q4" and K % 32:
        pytest.skip("q4 rows are whole blocks of 32")
    rng = np.random.default_rng(N * 31 + K)
    q, scale, w = stored(rng, N, K, dt)
    x = rng.standard_normal(K).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    y, _ = gemv(lib, None, x, q, dt, scale, b, N, K)
    np.testing.assert_allclose(y, w.astype(np.float64) @ x.astype(np.float64) + b, rtol=1e-5, atol=1e-5)
    y0, _ = gemv(lib, None, x, q, dt, scale, None, N, K)
    np.testing.assert_allclose(y0, w.astype(np.float64) @ x.astype(np.float64), rtol=1e-5, atol=1e-5)
    for pool in pools.values():  # rows split over threads: each row the same chain
        np.testing.assert_array_equal(gemv(lib, pool, x, q, dt, scale, b, N, K)[0], y)


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
def test_gemv_lowp_dequantizes_exactly(lib, dt):
    N, K = 9, 96
    rng = np.random.default_rng(5)
    q, scale, w = stored(rng, N, K, dt)
    for k in (0, 17, 31, 32, 95):
        x = np.zeros(K, np.float32)
        x[k] = 1.0
        np.testing.assert_array_equal(gemv(lib, None, x, q, dt, scale, None, N, K)[0], w[:, k])


def test_gemv_lowp_is_faster_than_the_many_row_kernel_at_one_row(lib):
    """SmolLM2's MLP shape (1536 x 576) in q4: the one-row kernel against linear_fwd_lowp at M = 1."""
    N, K = 1536, 576
    rng = np.random.default_rng(0)
    q, scale, _ = stored(rng, N, K, "q4")
    x = rng.standard_normal(K).astype(np.float32)
    fast = min(gemv(lib, None, x, q, "q4", scale, None, N, K, reps=20)[1] for _ in range(3))
    y = np.empty(N, np.float32)
    import time
    slow = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        lib.shim_linear_fwd_lowp(P(x), P(q), CODES["q4"], P(scale), None, P(y), 1, N, K, 0)
        slow = min(slow, time.perf_counter() - t)
    print(f"q4 1536 x 576, one row: gemv_lowp {fast * 1e6:.0f} us, linear_fwd_lowp {slow * 1e6:.0f} us")
    assert fast < slow
