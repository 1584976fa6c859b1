"""compute_dtype's products (kernels/lowp.cpp linear_fwd_lowp_cd / linear_bwd_input_lowp_cd): bf16 and
fp16 arithmetic on frozen weights with fp32 accumulation, against float64 products of the rounded
operands (passes/compute_dtype.round_operand / round_to: exact products, so only the fp32 sums differ),
for every storage format, over edge sizes; identity inputs read the rounded weight back bit-exactly; the
rounding itself (ties to even, subnormals, overflow, NaN) against numpy's; fp16's per-call scaling
keeps tiny gradients and huge activations."""
import ctypes

import numpy as np
import pytest

from pockengine.passes.compute_dtype import round_operand, round_to
from test_kernels_lowp import CODES, ODD, SHAPES, P, stored


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()


def fwd(lib, x, q, dt, scale, b, N, act, cd):
    M, K = x.shape
    y = np.full((M, N), np.nan, np.float32)
    lib.shim_linear_fwd_lowp_cd(P(x), P(q), CODES[dt], P(scale), P(b), P(y), M, N, K, act, CODES[cd])
    return y


def bwd(lib, dy, q, dt, scale, K, cd):
    M, N = dy.shape
    dx = np.full((M, K), np.nan, np.float32)
    lib.shim_linear_bwd_input_lowp_cd(P(dy), P(q), CODES[dt], P(scale), P(dx), M, N, K, CODES[cd])
    return dx


@pytest.mark.parametrize("cd", ["bf16", "f16"])
@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
@pytest.mark.parametrize("M,N,K", SHAPES + ODD)
def test_linear_cd_against_fp64_of_rounded_operands(lib, cd, dt, M, N, K):
    if dt == "q4" and K % 32:
        pytest.skip("q4 rows are whole blocks of 32")
    rng = np.random.default_rng(M * 7 + N * 13 + K)
    q, scale, w = stored(rng, N, K, dt)
    wr = round_to(w, cd).astype(np.float64)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    ref = round_operand(x, cd) @ wr.T + b
    tol = dict(rtol=1e-5, atol=2e-6 * np.sqrt(K))  # fp32 accumulation of exact products
    for act, f in ((0, lambda v: v), (1, lambda v: np.maximum(v, 0))):
        np.testing.assert_allclose(fwd(lib, x, q, dt, scale, b, N, act, cd), f(ref), **tol)
    np.testing.assert_allclose(bwd(lib, dy, q, dt, scale, K, cd), round_operand(dy, cd) @ wr, rtol=1e-5,
                               atol=2e-6 * np.sqrt(N))


@pytest.mark.parametrize("cd", ["bf16", "f16"])
def test_the_product_really_is_in_low_precision(lib, cd):
    """Against the unrounded fp64 product the error is that of cd's rounding (2^-9 / 2^-12 relative
    per operand), far above fp32's and within a few of cd's units."""
    rng = np.random.default_rng(1)
    M, N, K = 16, 64, 256
    q, scale, w = stored(rng, N, K, "i8")
    x = rng.standard_normal((M, K)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    err = np.abs(fwd(lib, x, q, "i8", scale, None, N, 0, cd) - exact).max() / np.abs(exact).max()
    unit = 2.0**-8 if cd == "bf16" else 2.0**-11
    assert 1e-6 < err < 4 * unit, err


@pytest.mark.parametrize("cd", ["bf16", "f16"])
@pytest.mark.parametrize("N,K", [(37, 96), (3, 544)])
def test_identity_reads_the_rounded_weight(lib, cd, N, K):
    rng = np.random.default_rng(N + K)
    for dt in ("bf16", "f16", "i8", "q4"):
        q, scale, w = stored(rng, N, K, dt)
        np.testing.assert_array_equal(fwd(lib, np.eye(K, dtype=np.float32), q, dt, scale, None, N, 0, cd),
                                      round_to(w, cd).T)
        np.testing.assert_array_equal(bwd(lib, np.eye(N, dtype=np.float32), q, dt, scale, K, cd), round_to(w, cd))


@pytest.mark.parametrize("cd", ["bf16", "f16"])
def test_rounding_edges(lib, cd):
    """Ties to even, fp32 subnormals, fp16 subnormals and its largest finite values, through an identity
    weight (bf16-stored 1.0s are exact in both formats), bit for bit against torch's bf16 / numpy's
    fp16 conversion (for fp16 after the per-call scale: here 2^-2, the largest value being 65519); a
    NaN or an inf in the operand makes the whole product non-finite, as in fp32 (the guard sees it)."""
    import torch

    vals = [1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11, 1 + 3 * 2.0**-11, -2.5, 3e-41, -1e-38, 1e-7, 6e-8,
            2.0**-25, 65504.0, 65519.0, 0.0, -0.0]
    x = np.array([vals], np.float32)
    K = x.shape[1]
    q = np.ascontiguousarray((np.eye(K, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16))
    got = bwd(lib, x, q, "bf16", None, K, cd)  # dx = dy @ I
    if cd == "bf16":
        want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    else:
        want = (x * np.float32(0.25)).astype(np.float16).astype(np.float32) * np.float32(4)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.astype(np.float64), round_operand(x, cd))
    for bad in (np.nan, np.inf):
        x[0, 3] = bad
        assert not np.isfinite(bwd(lib, x, q, "bf16", None, K, cd)).any()


def test_fp16_scaling_keeps_tiny_gradients_and_huge_activations(lib):
    """Gradients of 1e-9 would flush to zero in fp16 (smallest subnormal 6e-8), activations of 1e6 would
    overflow (largest finite 65504): scaled by a power of two per call, both keep fp16's relative
    precision."""
    rng = np.random.default_rng(5)
    M, N, K = 8, 48, 64
    q, scale, w = stored(rng, N, K, "f16")
    for mag in (1e-9, 1e6):
        dy = (rng.standard_normal((M, N)) * mag).astype(np.float32)
        exact = dy.astype(np.float64) @ w.astype(np.float64)
        got = bwd(lib, dy, q, "f16", scale, K, "f16")
        assert np.isfinite(got).all()
        assert np.abs(got - exact).max() < 4 * 2.0**-11 * np.abs(exact).max(), mag
        x = (rng.standard_normal((M, K)) * mag).astype(np.float32)
        exact = x.astype(np.float64) @ w.T.astype(np.float64)
        got = fwd(lib, x, q, "f16", scale, None, N, 0, "f16")
        assert np.abs(got - exact).max() < 4 * 2.0**-11 * np.abs(exact).max(), mag
