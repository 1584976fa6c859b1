"""The persistent thread pool (native/runtime/threadpool.cpp) and the threaded
dense kernels (gemm.cpp, linear.cpp): parallel_for covers every index exactly
once, nested calls run inline, threaded GEMM/linear agree with numpy, and a
trainer gives the same losses with 1 and 2 threads."""
import ctypes
import os
import time

import numpy as np
import pytest
import torch

from conftest import build_shim, ptr

vp, i64, cint, cf = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def build_threads_lib() -> ctypes.CDLL:
    """Every kernel + threadpool.cpp + shims/threads_shim.cpp (conftest.build_shim, -pthread)."""
    lib = build_shim("threads_shim.cpp", ("-pthread",))
    sigs = {
        "shim_pool_create": (vp, [cint]),
        "shim_pool_destroy": (None, [vp]),
        "shim_default_threads": (cint, []),
        "shim_pool_regions": (i64, [vp]),
        "shim_pool_dispatches": (i64, [vp]),
        "shim_pool_back_off_for": (None, [vp, i64]),
        "shim_pool_backoffs": (i64, [vp]),
        "shim_parallel_now": (cint, [vp]),
        "shim_relu_pool": (None, [vp, vp, vp, i64]),
        "shim_parallel_for": (cint, [vp, i64, i64, vp, vp, cint, cint, vp, vp, vp]),
        "shim_gemm_pool": (None, [vp] * 4 + [i64] * 4 + [cint, cint] + [i64] * 3 + [cf]),
        "shim_linear_fwd_act_pool": (None, [vp] * 5 + [i64] * 3 + [cint]),
        "shim_linear_bwd_pool": (None, [vp] * 7 + [i64] * 3),
        "shim_embedding_bwd_pool": (i64, [vp] * 4 + [i64] * 5),
        "shim_time_gemm": (ctypes.c_double, [vp] * 4 + [i64] * 3 + [cint] * 3),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


@pytest.fixture(scope="module")
def lib():
    return build_threads_lib()


@pytest.fixture(scope="module")
def pools(lib):
    made = {n: lib.shim_pool_create(n) for n in (1, 2, 3, 5)}
    yield made
    for p in made.values():
        lib.shim_pool_destroy(p)


def run_parallel_for(lib, pool, n, grain, nested=False):
    counts = np.zeros(max(n, 1), np.int32)
    chunk_len = np.zeros(256, np.int64)
    seen, ok, nthreads = cint(), cint(), cint()
    chunks = lib.shim_parallel_for(pool, n, grain, ptr(counts), ptr(chunk_len), 256, int(nested),
                                   ctypes.byref(seen), ctypes.byref(ok), ctypes.byref(nthreads))
    return counts[:n], chunk_len[:chunks], chunks, seen.value, ok.value, nthreads.value


def test_default_threads_is_online_cores(lib):
    assert lib.shim_default_threads() == max(1, os.cpu_count() or 1)


@pytest.mark.parametrize("threads", [None, 1, 2, 3, 5])
@pytest.mark.parametrize("nested", [False, True])
def test_parallel_for_covers_each_index_once(lib, pools, threads, nested):
    pool = None if threads is None else pools[threads]
    size = 1 if threads is None else threads
    for n in [0, 1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4099]:
        for grain in [1, 2, 3, 7, 64, 1000, 5000]:
            counts, lens, chunks, _, ok, nthreads = run_parallel_for(lib, pool, n, grain, nested)
            assert nthreads == size
            assert (counts == 1).all(), (n, grain, threads)
            if chunks > 1:  # inside a chunk of a split range: num_threads() == 1, nested calls inline
                assert ok == 1
            if n == 0:
                assert chunks == 0
                continue
            assert 1 <= chunks <= 4 * size and lens.sum() == n
            if threads is None or threads == 1:
                assert chunks == 1
            if chunks > 1:
                assert lens.min() >= grain


def test_pool_uses_other_threads_and_survives_many_calls(lib, pools):
    # Many back-to-back calls (spinning and sleeping workers alike) with n < threads too.
    for it in range(2000):
        n = it % 9
        counts, _, _, _, _, _ = run_parallel_for(lib, pools[5], n, 1)
        assert (counts == 1).all()
    # A long enough job is shared: some chunk runs on a worker.  On a busy machine (CI's two
    # cores under pytest -n 2) the pool may back off to the caller for a while, by design
    # (threadpool.cpp); a back-off is short, so the job is retried until one run shares it.
    pool = lib.shim_pool_create(2)
    try:
        seen, deadline = 1, time.monotonic() + 30
        while seen < 2 and time.monotonic() < deadline:
            seen = run_parallel_for(lib, pool, 1 << 22, 1)[3]
        if seen < 2 and lib.shim_pool_backoffs(pool) > 0:
            pytest.skip("the machine was busy for 30 s: the pool kept backing off to the caller")
        assert seen == 2
    finally:
        lib.shim_pool_destroy(pool)


def test_small_regions_do_not_reach_the_pool(lib, pools):
    """A kernel whose work is below its threshold (pock_parallel.h kMinChunkElems) runs on the caller
    without touching the pool (no region, no wake-up); a large one is a region of the pool."""
    pool = pools[2]
    x = np.linspace(-1, 1, 1 << 20, dtype=np.float32)
    y = np.empty_like(x)
    before = lib.shim_pool_regions(pool), lib.shim_pool_dispatches(pool)
    for n in (1, 100, 4096, 1 << 15):
        lib.shim_relu_pool(pool, ptr(x), ptr(y), n)
        np.testing.assert_array_equal(y[:n], np.maximum(x[:n], 0))
    run_parallel_for(lib, pool, 1000, 600)  # grain > n / 2: one chunk
    assert (lib.shim_pool_regions(pool), lib.shim_pool_dispatches(pool)) == before
    lib.shim_relu_pool(pool, ptr(x), ptr(y), x.size)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert lib.shim_pool_regions(pool) == before[0] + 1
    # handed to the worker unless the pool backed off (a busy machine); never more than the regions
    assert before[1] <= lib.shim_pool_dispatches(pool) <= before[1] + 1


def test_a_backed_off_pool_gets_one_thread_gemm_plans(lib):
    """While the pool is backed off (a busy machine: every chunk runs on the caller), a GEMM is
    planned for one thread, as on a one-thread pool: no region of it reaches the pool. A plan cut
    for two threads and run on one cost the native transformer step 45% over one thread (make
    bench, 172.9 vs 250.4 ms). Every element keeps its FMA chain: the same bits either way."""
    rng = np.random.default_rng(7)
    M, N, K = 512, 768, 256
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    pool = lib.shim_pool_create(2)
    try:
        out = {}
        for state in ("shared", "backed off"):
            if state == "backed off":
                lib.shim_pool_back_off_for(pool, 60 * 10**9)
                assert lib.shim_parallel_now(pool) == 0
            else:
                assert lib.shim_parallel_now(pool) == 1
            before = lib.shim_pool_regions(pool)
            c = np.full((M, N), np.nan, np.float32)
            lib.shim_gemm_pool(pool, ptr(a), ptr(b), ptr(c), 1, M, N, K, 0, 1, 0, 0, 0, 0.0)
            out[state] = (c, lib.shim_pool_regions(pool) - before)
        assert out["shared"][1] == 1 and out["backed off"][1] == 0
        np.testing.assert_array_equal(out["shared"][0], out["backed off"][0])
    finally:
        lib.shim_pool_destroy(pool)


def test_pool_create_destroy_repeatedly(lib):
    for n in (1, 2, 4, 2, 1):
        pool = lib.shim_pool_create(n)
        counts = run_parallel_for(lib, pool, 1000, 1)[0]
        assert (counts == 1).all()
        lib.shim_pool_destroy(pool)


GEMM_SHAPES = [(1, 1, 1), (3, 5, 7), (13, 33, 17), (25, 31, 300), (8, 96, 24), (16, 70, 40), (17, 65, 33),
               (64, 97, 129), (130, 200, 260), (300, 130, 70), (8, 1000, 300), (257, 65, 513)]


@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_threads_match_numpy(lib, pools, M, N, K, ta, tb):
    rng = np.random.default_rng(M * 1000 + N * 10 + K)
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    results = []
    for threads in (1, 2):
        c = np.full((M, N), np.nan, np.float32)
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(c), 1, M, N, K, ta, tb, 0, 0, 0, 0.0)
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
        c2 = c0.copy()
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(c2), 1, M, N, K, ta, tb, 0, 0, 0, 1.0)
        np.testing.assert_allclose(c2, want + c0, rtol=1e-4, atol=1e-4 * np.sqrt(K))
        results.append(c)
    # the partition never changes the arithmetic of one element
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_batched_threads(lib, pools, ta, tb):
    rng = np.random.default_rng(3)
    batch, M, N, K = 12, 24, 40, 36  # small products: threaded over the batch
    a = rng.standard_normal((batch, K, M) if ta else (batch, M, K)).astype(np.float32)
    b = rng.standard_normal((batch, N, K) if tb else (batch, K, N)).astype(np.float32)
    want = np.matmul(a.transpose(0, 2, 1) if ta else a, b.transpose(0, 2, 1) if tb else b)
    for threads in (1, 2, 3):
        c = np.full((batch, M, N), np.nan, np.float32)
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(c), batch, M, N, K, ta, tb, M * K, K * N, M * N, 0.0)
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)
        acc = np.zeros((M, N), np.float32)  # sc = 0: every batch sums into one C, in order
        lib.shim_gemm_pool(pools[threads], ptr(a), ptr(b), ptr(acc), batch, M, N, K, ta, tb, M * K, K * N, 0, 1.0)
        np.testing.assert_allclose(acc, want.sum(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (5, 7, 3), (8, 96, 24), (13, 70, 33), (100, 130, 257), (300, 64, 16)])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_fwd_act_and_bwd_threads(lib, pools, M, N, K, act, bias):
    rng = np.random.default_rng(M + N + K)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) * 4 if bias else None
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    y_ref = torch.nn.functional.linear(tx, tw, None if b is None else torch.from_numpy(b))
    y_ref = [y_ref, torch.relu(y_ref), torch.nn.functional.relu6(y_ref)][act].numpy()
    dy = rng.standard_normal((M, N)).astype(np.float32)
    for threads in (1, 2):
        y = np.full((M, N), np.nan, np.float32)
        lib.shim_linear_fwd_act_pool(pools[threads], ptr(x), ptr(w), ptr(b), ptr(y), M, N, K, act)
        np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4 * np.sqrt(K))
        dx, dw, db = np.empty((M, K), np.float32), np.empty((N, K), np.float32), np.empty(N, np.float32)
        lib.shim_linear_bwd_pool(pools[threads], ptr(dy), ptr(x), ptr(w), ptr(dx), ptr(dw), ptr(db), M, N, K)
        np.testing.assert_allclose(dx, dy @ w, rtol=1e-4, atol=1e-4 * np.sqrt(N))
        np.testing.assert_allclose(dw, dy.T @ x, rtol=1e-4, atol=1e-3 * np.sqrt(M))
        np.testing.assert_allclose(db, dy.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,N,K", [(16, 700, 96), (32, 300, 600), (24, 500, 40)])
def test_small_m_against_w_transposed_same_bits(lib, pools, M, N, K):
    """x @ w^T at a few rows (gemm.cpp's swapped form, C^T = w @ x^T in scratch where M fills
    whole panels): the same bits as the product with w^T laid out row-major (packed directly),
    on 1 and 2 threads, with the bias and activation epilogue as linear_fwd_act applies it."""
    rng = np.random.default_rng(M * N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[3, 5] = np.nan  # propagates through the epilogue as the direct store does
    wt = np.ascontiguousarray(w.T)
    b = rng.standard_normal(N).astype(np.float32)
    want = np.empty((M, N), np.float32)
    lib.shim_gemm_pool(pools[1], ptr(x), ptr(wt), ptr(want), 1, M, N, K, 0, 0, 0, 0, 0, 0.0)
    for threads in (1, 2):
        c = np.full((M, N), np.inf, np.float32)
        lib.shim_gemm_pool(pools[threads], ptr(x), ptr(w), ptr(c), 1, M, N, K, 0, 1, 0, 0, 0, 0.0)
        np.testing.assert_array_equal(c, want)
        for act, f in ((0, lambda v: v), (2, lambda v: np.where(v < 0, 0, np.where(v > 6, 6, v)))):
            y = np.full((M, N), np.inf, np.float32)
            lib.shim_linear_fwd_act_pool(pools[threads], ptr(x), ptr(w), ptr(b), ptr(y), M, N, K, act)
            np.testing.assert_array_equal(y, f(want + b))
    assert np.isnan(want[:, 3]).all()


def test_relu_epilogue_propagates_nan(lib, pools):
    x = np.array([[np.nan, 1.0], [1.0, 1.0]], np.float32)
    w = np.eye(2, dtype=np.float32)
    for act in (1, 2):
        y = np.zeros((2, 2), np.float32)
        lib.shim_linear_fwd_act_pool(pools[1], ptr(x), ptr(w), None, ptr(y), 2, 2, 2, act)
        assert np.isnan(y[0, 0]) and y[1, 1] == 1.0


def test_embedding_bwd_threads_zero_the_whole_table(lib, pools):
    """The dense table gradient's zeroing is split over the threads (8000 x 256: a chunk per thread
    and more); the n rows are summed in index order on the caller: the same table for every pool."""
    rng = np.random.default_rng(0)
    n, V, D, k = 64, 8000, 256, 200
    idx = rng.integers(0, V, n).astype(np.int64)
    idx[:5] = idx[5]  # a row hit several times
    idx[7] = V + 3  # out of range: skipped, reported
    dy = rng.standard_normal((n, D)).astype(np.float32)
    want = np.zeros((V, k), np.float32)
    for i, r in enumerate(idx):
        if r < V:
            want[r] += dy[i, :k]
    for t in (1, 2, 5):
        dw = np.full((V, k), np.nan, np.float32)  # every element must be written
        bad = lib.shim_embedding_bwd_pool(pools[t], ptr(dy), ptr(idx), ptr(dw), n, V, D, k, -1)
        assert bad == 7
        np.testing.assert_array_equal(dw, want)


# ----------------------------------------------------------------------------- trainer
# GPT with d=128 has products big enough to be threaded (fc1: 16 x 512 x 128).
@pytest.mark.parametrize("name,kwargs", [("mlp", {}), ("gpt", {"d": 128, "heads": 4}), ("lstm", {"hidden": 96})])
def test_trainer_same_losses_with_two_threads(name, kwargs):
    import pockengine as pe
    from models import MODELS, batches

    data = batches(name, n=3)
    losses = {}
    for threads in (1, 2):
        torch.manual_seed(0)
        model = MODELS[name](**kwargs)
        prog = pe.compile(model, *data[0], optimizer=pe.SGD(lr=0.1))
        with prog.build() as trainer:
            trainer.set_num_threads(threads)
            losses[threads] = [trainer.step(*data[i % len(data)]) for i in range(6)]
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-5)


def test_pointwise_conv_step_bit_identical_on_two_threads():
    """A 1x1 conv's weight gradient (96 x 16 over 2 x 64 x 64 pixels) is threaded over pieces fixed
    by the shape, never by the thread count: rows split by the thread count once took the GEMM's
    <= 16-row dot-product path on 2 threads only, and MobileNetV2's steps drifted apart (1.86773
    vs 1.86910 after 3 steps)."""
    import pockengine as pe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 96, 1),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(96, 10))
    x, y = torch.randn(2, 3, 64, 64), torch.tensor([1, 7])
    prog = pe.compile(model, (x,), (y,), optimizer=pe.SGD(lr=0.1, momentum=0.9))
    states = []
    for threads in (1, 2):
        with prog.build() as trainer:
            trainer.set_num_threads(threads)
            for _ in range(2):
                trainer.step((x,), (y,))
            states.append(trainer.state_dict())
    for name in states[0]:
        assert np.array_equal(states[0][name], states[1][name]), name
