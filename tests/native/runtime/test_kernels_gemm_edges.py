"""gemm.cpp's tiling edges: every transposition over sizes that cut the micro-tile,
the packed panels, the column blocks (512 wide; up to 2048 under a depth below 256)
and the depth blocks (256; a last one of at most 64 merged into the block before it), against
float64 numpy; and the same bits on 1, 2 and 3
threads for the shapes of an LLM step (row-count micro-kernels at the bottom edge,
column blocks split across threads)."""
import itertools

import numpy as np
import pytest

from conftest import ptr
from test_threads import build_threads_lib

EDGE = [1, 5, 17, 127]


@pytest.fixture(scope="module")
def lib():
    return build_threads_lib()


@pytest.fixture(scope="module")
def pools(lib):
    made = {n: lib.shim_pool_create(n) for n in (1, 2, 3)}
    yield made
    for p in made.values():
        lib.shim_pool_destroy(p)


def operands(rng, M, N, K, ta, tb):
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    return a, b, (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_edge_sizes(lib, pools, ta, tb):
    rng = np.random.default_rng(ta * 2 + tb)
    for M, N, K in itertools.product(EDGE, EDGE, EDGE):
        a, b, want = operands(rng, M, N, K, ta, tb)
        c = np.full((M, N), np.nan, np.float32)
        lib.shim_gemm_pool(pools[1], ptr(a), ptr(b), ptr(c), 1, M, N, K, ta, tb, 0, 0, 0, 0.0)
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4 * np.sqrt(K), err_msg=f"{M}x{N}x{K}")


@pytest.mark.parametrize("M,N,K", [(128, 576, 576), (128, 192, 576), (128, 64, 128), (127, 1100, 300),
                                   (25, 1030, 257), (300, 577, 129), (13, 40, 530),
                                   (700, 130, 90),  # ta: a packed op(A), threads cut rows first
                                   (50, 2100, 40),  # shallow K: column blocks at their widest (2048)
                                   (600, 192, 288), (40, 70, 320), (40, 70, 321)])  # depth 288 and 320: one
#                                    merged block; 321: 256 + 65, the last block too deep to merge
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_blocks_same_bits_on_any_threads(lib, pools, M, N, K, ta, tb):
    rng = np.random.default_rng(M + N + K)
    a, b, want = operands(rng, M, N, K, ta, tb)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    got = []
    for threads in (1, 2, 3):
        c = np.full((M, N), np.nan, np.float32)
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(c), 1, M, N, K, ta, tb, 0, 0, 0, 0.0)
        c2 = c0.copy()
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(c2), 1, M, N, K, ta, tb, 0, 0, 0, 1.0)
        np.testing.assert_allclose(c2, want + c0, rtol=1e-4, atol=1e-4 * np.sqrt(K))
        got.append(c)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])
