"""The optimizer update fused into the weight gradient (linear.cpp: linear_bwd_weight_sgd /
_adamw over gemm.cpp's update epilogue), for the native build and -march=x86-64-v3:

* bit-identical to the unfused path (linear_bwd_weight, then sgd_update / adamw_update):
  parameters and optimizer state compared with np.array_equal, over shapes that take the
  blocked GEMM with one and several depth blocks, edge tiles, a partial (first-k input
  columns) region, and the GEMV fallback; on 1 and 2 threads;
* against torch.optim (SGD, momentum, nesterov, AdamW) in float64 over three steps,
  within float32 tolerance;
* a NaN in the gradient: false, and no NaN reaches the parameter;
* the exact guard's check made as the gradient is stored (linear_bwd_weight_finite): the
  same bits as linear_bwd_weight, false for a NaN, an inf or an overflow anywhere in it."""
import ctypes

import numpy as np
import pytest
import torch

from conftest import build_shim, ptr

i64, cint, vp, cf = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
# (tokens M, out features N, updated input columns k, input width K)
SHAPES = [(512, 96, 256, 256),   # two depth blocks: the last one adds C's partial sums
          (37, 70, 19, 19),      # edge strips and panels, one depth block
          (300, 33, 10, 40),     # first 10 of 40 input columns: region rows of stride 40
          (20, 3, 24, 24)]       # 3 output rows: the GEMV path, run unfused
SGD_CASES = [dict(momentum=0.0, dampening=0.0, wd=0.0, nesterov=0), dict(momentum=0.9, dampening=0.0, wd=0.0, nesterov=0),
             dict(momentum=0.9, dampening=0.1, wd=1e-2, nesterov=0), dict(momentum=0.9, dampening=0.0, wd=1e-2, nesterov=1)]


@pytest.fixture(scope="module", params=["native", "x86-64-v3"])
def lib(request):
    L = build_shim("fused_update_shim.cpp", ("-pthread", f"-march={request.param}"))
    L.fu_pool_create.argtypes, L.fu_pool_create.restype = [cint], vp
    L.fu_pool_destroy.argtypes = [vp]
    L.fu_sgd.argtypes = [vp, cint] + [vp] * 3 + [i64] * 4 + [vp] * 2 + [i64] * 3 + [cf] * 4 + [cint] * 3
    L.fu_sgd.restype = cint
    L.fu_adamw.argtypes = [vp, cint] + [vp] * 3 + [i64] * 4 + [vp] * 3 + [i64] * 3 + [cf] * 5 + [i64, cint]
    L.fu_adamw.restype = cint
    L.fu_finite.argtypes, L.fu_finite.restype = [vp, cint] + [vp] * 3 + [i64] * 4, cint
    L.pools = {n: L.fu_pool_create(n) for n in (1, 2)}
    yield L
    for p in L.pools.values():
        L.fu_pool_destroy(p)


def region(N, k, K):
    return (1, N * K, N * K) if k == K else (N, k, K)


def problem(M, N, k, K, seed):
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.1).astype(np.float32)
    return dy, x, w


def run_sgd(lib, threads, fused, shape, case, steps=3, lr=0.05, dy_x=None):
    M, N, k, K = shape
    dy, x, w = problem(M, N, k, K, 0) if dy_x is None else dy_x
    p, buf, ok = w.copy(), np.zeros((N, k), np.float32), []
    for s in range(steps):
        dw = np.full((N, k), np.nan, np.float32)
        ok.append(lib.fu_sgd(lib.pools[threads], fused, ptr(dy), ptr(x), ptr(dw), M, N, k, K, ptr(p), ptr(buf),
                             *region(N, k, K), lr, case["momentum"], case["dampening"], case["wd"], case["nesterov"],
                             int(s == 0), 1))
        dy = dy * np.float32(0.7)  # a different gradient each step
    return p, buf, ok


def run_adamw(lib, threads, fused, shape, steps=3, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=1e-2, dy_x=None):
    M, N, k, K = shape
    dy, x, w = problem(M, N, k, K, 1) if dy_x is None else dy_x
    p, m, v, ok = w.copy(), np.zeros((N, k), np.float32), np.zeros((N, k), np.float32), []
    for s in range(steps):
        dw = np.full((N, k), np.nan, np.float32)
        ok.append(lib.fu_adamw(lib.pools[threads], fused, ptr(dy), ptr(x), ptr(dw), M, N, k, K, ptr(p), ptr(m), ptr(v),
                               *region(N, k, K), lr, *betas, eps, wd, s + 1, 1))
        dy = dy * np.float32(0.7)
    return p, m, v, ok


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_sgd_bit_identical_to_unfused(lib, shape, threads):
    for case in SGD_CASES:
        p1, b1, ok1 = run_sgd(lib, threads, 1, shape, case)
        p0, b0, ok0 = run_sgd(lib, threads, 0, shape, case)
        assert all(ok1) and all(ok0)
        assert np.array_equal(p1, p0), (shape, case)
        assert np.array_equal(b1, b0), (shape, case)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_adamw_bit_identical_to_unfused(lib, shape, threads):
    p1, m1, v1, ok1 = run_adamw(lib, threads, 1, shape)
    p0, m0, v0, ok0 = run_adamw(lib, threads, 0, shape)
    assert all(ok1) and all(ok0)
    assert np.array_equal(p1, p0) and np.array_equal(m1, m0) and np.array_equal(v1, v0)


def torch_steps(opt_make, shape, dy_x, steps=3):
    """torch.optim in float64 over the same gradients (dw = dy^T x[:, :k], the rest frozen)."""
    M, N, k, K = shape
    dy, x, w = (torch.from_numpy(a).double() for a in dy_x)
    p = w.clone().requires_grad_(True)
    opt = opt_make([p])
    for _ in range(steps):
        g = torch.zeros_like(p)
        g[:, :k] = dy.t() @ x[:, :k]
        p.grad = g
        if k < K:  # only the first k columns train: step a copy, keep the frozen columns
            before = p.detach().clone()
            opt.step()
            with torch.no_grad():
                p[:, k:] = before[:, k:]
        else:
            opt.step()
        dy = dy * 0.7
    return p.detach().numpy()


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_fused_matches_torch_optim(lib, shape):
    M, N, k, K = shape
    for case in SGD_CASES:
        dy_x = problem(M, N, k, K, 0)
        got, _, ok = run_sgd(lib, 1, 1, shape, case, dy_x=dy_x)
        want = torch_steps(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=case["momentum"],
                                                      dampening=case["dampening"], weight_decay=case["wd"],
                                                      nesterov=bool(case["nesterov"])), shape, dy_x)
        assert all(ok)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(M), err_msg=str(case))
    dy_x = problem(M, N, k, K, 1)
    got, _, _, ok = run_adamw(lib, 1, 1, shape, dy_x=dy_x)
    want = torch_steps(lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
                       shape, dy_x)
    assert all(ok)
    # AdamW divides by sqrt(v): where a gradient element nearly cancels (a sum of M products),
    # its float32 rounding moves m / sqrt(v) by a few percent, i.e. the step by a few % of lr
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=0.03 * 1e-2)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_fused_nan_gradient_reports_and_never_writes_nan(lib, shape):
    M, N, k, K = shape
    dy, x, w = problem(M, N, k, K, 0)
    dy[:, N // 2] = np.nan  # one output row of dw goes NaN
    p, _, ok = run_sgd(lib, 1, 1, shape, SGD_CASES[1], steps=1, dy_x=(dy, x, w))
    assert ok == [0]
    assert np.isfinite(p).all()
    assert np.array_equal(p[N // 2], w[N // 2])  # the bad row is left alone


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES + [(128, 1100, 70, 70)], ids=str)
def test_weight_gradient_checked_as_it_is_stored(lib, threads, shape):
    """linear_bwd_weight_finite: dw bit-identical to linear_bwd_weight, true while finite; false
    for a NaN or inf of dy (its dw row), or for finite inputs whose sum overflows, whether the
    element lands in a full tile, an edge tile or the GEMV fallback."""
    M, N, k, K = shape
    dy, x, _ = problem(M, N, k, K, 1)
    pool = lib.pools[threads]

    def run(checked, dy, x):
        dw = np.full((N, k), np.nan, np.float32)
        ok = lib.fu_finite(pool, checked, ptr(dy), ptr(x), ptr(dw), M, N, k, K)
        return ok, dw

    ok, dw = run(1, dy, x)
    assert ok == 1
    assert np.array_equal(dw, run(0, dy, x)[1])
    for i, j in ((0, 0), (N - 1, k - 1), (N // 2, k // 2)):
        for poison in (np.nan, np.inf, -np.inf):
            bad = dy.copy()
            bad[M // 2, i] = poison
            assert run(1, bad, x)[0] == 0, (i, poison)
        big, ones = dy.copy(), x.copy()
        big[:, i], ones[:, j] = 3e38, 1.0  # dw[i, j] = M * 3e38
        ok, dw = run(1, big, ones)
        assert not np.isfinite(dw[i, j]) and ok == 0, (i, j)
