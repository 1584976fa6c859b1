"""Low-precision frozen-weight kernels (kernels/lowp.cpp: linear forward and input
gradient, embedding) against float64 products of pockengine.schemes.quant.dequantize, over
edge sizes that cut the packed panels (M, N, K = 1, 5, 17, 127, ... and beyond one
depth block / column block). Identity inputs read the dequantized weight back
bit-exactly (q4 included: q * d rounded, then + m, never one FMA)."""
import ctypes

import numpy as np
import pytest

from pockengine.schemes.quant import dequantize, quantize

CODES = {"bf16": 0, "f16": 1, "i8": 2, "q4": 3}


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()  # the lowp kernels' shims are generated from the op records (plain arguments)


def P(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def stored(rng, N, K, dt):
    w = (rng.standard_normal((N, K)) * K**-0.5).astype(np.float32)
    q, scale = quantize(w, dt)
    q = np.ascontiguousarray(q.view(np.uint16) if dt == "f16" else q)
    scale = None if scale is None else np.ascontiguousarray(scale, np.float32)
    return q, scale, dequantize(quantize(w, dt)[0], dt, scale)


SHAPES = [(1, 1, 32), (5, 17, 64), (17, 5, 96), (127, 33, 288), (13, 530, 64), (3, 70, 544), (128, 40, 32)]
ODD = [(1, 1, 1), (5, 7, 5), (17, 127, 17), (127, 5, 127), (2, 3, 300)]


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
@pytest.mark.parametrize("M,N,K", SHAPES + ODD)
def test_linear_lowp(lib, dt, M, N, K):
    if dt == "q4" and K % 32:
        pytest.skip("q4 rows are whole blocks of 32")
    rng = np.random.default_rng(M * 7 + N * 13 + K)
    q, scale, w = stored(rng, N, K, dt)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    for act, f in ((0, lambda v: v), (1, lambda v: np.maximum(v, 0))):
        y = np.full((M, N), np.nan, np.float32)
        lib.shim_linear_fwd_lowp(P(x), P(q), CODES[dt], P(scale), P(b), P(y), M, N, K, act)
        np.testing.assert_allclose(y, f(ref), rtol=1e-4, atol=1e-4)
    dx = np.full((M, K), np.nan, np.float32)
    lib.shim_linear_bwd_input_lowp(P(dy), P(q), CODES[dt], P(scale), P(dx), M, N, K)
    np.testing.assert_allclose(dx, dy.astype(np.float64) @ w.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
@pytest.mark.parametrize("N,K", [(37, 96), (3, 544), (300, 32)])
def test_lowp_dequantizes_exactly(lib, dt, N, K):
    rng = np.random.default_rng(N + K)
    q, scale, w = stored(rng, N, K, dt)
    y = np.full((K, N), np.nan, np.float32)  # identity x: y = w^T
    lib.shim_linear_fwd_lowp(P(np.eye(K, dtype=np.float32)), P(q), CODES[dt], P(scale), None, P(y), K, N, K, 0)
    np.testing.assert_array_equal(y, w.T)
    dx = np.full((N, K), np.nan, np.float32)  # identity dy: dx = w
    lib.shim_linear_bwd_input_lowp(P(np.eye(N, dtype=np.float32)), P(q), CODES[dt], P(scale), P(dx), N, N, K)
    np.testing.assert_array_equal(dx, w)
    idx = np.array([N - 1, 0, N // 2, N, -1], np.int64)
    e = np.full((5, K), np.nan, np.float32)
    assert lib.shim_embedding_fwd_lowp(P(q), CODES[dt], P(scale), P(idx), P(e), 5, N, K) == 3
    np.testing.assert_array_equal(e[:3], w[idx[:3]])
    assert (e[3:] == 0).all()
