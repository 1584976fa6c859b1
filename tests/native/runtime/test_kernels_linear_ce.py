"""linear_ce_fwd/linear_ce_bwd (kernels/linear_ce.cpp: the LM head fused with cross_entropy over
tiles of rows x classes, no logits) against PyTorch float64 autograd: ignore_index, bias or not,
a partial-channel dW, tiles that cut the rows and the classes unevenly, one tile, every target
ignored; low-precision frozen weights (dx only) against the dequantized weight."""
import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pockengine.schemes.quant import dequantize, quantize

CODES = {"bf16": 0, "f16": 1, "i8": 2, "q4": 3}


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()


def P(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def run(lib, x, w, b, t, rows, cols, k=None, dt=None, scale=None, wanted=(True, True, True), dloss=0.7):
    M, K = x.shape
    V = w.shape[0] if dt != "q4" else w.shape[0]
    k = K if k is None else k
    params = (M, V, K, k, -100, rows, cols, int(dt is not None), CODES.get(dt, 0))
    loss, lse = np.full(1, np.nan, np.float32), np.full(M, np.nan, np.float32)
    scratch = np.full(rows * (cols + K), np.nan, np.float32)
    bad = lib.shim_linear_ce_fwd(P(x), P(w), P(scale), P(b), P(t), P(loss), P(lse), P(scratch), *params)
    dx = np.full((M, K), np.nan, np.float32) if wanted[0] else None
    dw = np.full((V, k), np.nan, np.float32) if wanted[1] else None
    db = np.full(V, np.nan, np.float32) if wanted[2] and b is not None else None
    bad2 = lib.shim_linear_ce_bwd(P(np.array([dloss], np.float32)), P(x), P(w), P(scale), P(b), P(t), P(lse), P(dx),
                                  P(dw), P(db), P(scratch), *params)
    assert bad == bad2 == -1
    return loss[0], lse, dx, dw, db


def reference(x, w, b, t, dloss=0.7):
    xt, wt = torch.from_numpy(x).double().requires_grad_(), torch.from_numpy(w).double().requires_grad_()
    bt = None if b is None else torch.from_numpy(b).double().requires_grad_()
    z = F.linear(xt, wt, bt)
    tt = torch.from_numpy(t)
    loss = F.cross_entropy(z, tt, ignore_index=-100) if (tt != -100).any() else (z * 0).sum()
    (loss * dloss).backward()
    return loss, torch.logsumexp(z, -1), xt.grad, wt.grad, None if bt is None else bt.grad


@pytest.mark.parametrize("M,V,K,rows,cols,bias,k", [
    (7, 50, 16, 3, 16, True, None),     # tiles cut rows and classes unevenly
    (7, 50, 16, 256, 4096, False, None),  # one tile
    (33, 130, 24, 8, 64, True, 10),    # a partial-channel dW (the first 10 input channels)
    (5, 9, 3, 2, 2, False, None),
])
def test_linear_ce_against_torch(lib, M, V, K, rows, cols, bias, k):
    rng = np.random.default_rng(M + V + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((V, K)) * K**-0.5).astype(np.float32)
    b = rng.standard_normal(V).astype(np.float32) if bias else None
    t = rng.integers(0, V, M).astype(np.int64)
    t[1] = t[M - 1] = -100  # ignored rows: the mean runs over the others
    loss, lse, dx, dw, db = run(lib, x, w, b, t, min(rows, M), min(cols, V), k)
    rl, rlse, rdx, rdw, rdb = reference(x, w, b, t)
    np.testing.assert_allclose(loss, rl.item(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, rlse.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, rdx.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw, rdw.numpy()[:, :k], rtol=1e-4, atol=1e-6)
    assert np.all(dx[1] == 0) and np.all(dx[M - 1] == 0)
    if bias:
        np.testing.assert_allclose(db, rdb.numpy(), rtol=1e-4, atol=1e-6)


def test_every_target_ignored_gives_zeros(lib):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((10, 8)).astype(np.float32)
    t = np.full(4, -100, np.int64)
    loss, _, dx, dw, _ = run(lib, x, w, None, t, 2, 4)
    assert loss == 0 and not dx.any() and not dw.any()  # as cross_entropy (loss.cpp): 0, not NaN


def lowp_head_case(dt):
    """x[9,64], the head stored in dt (q, scale), its dequantized fp32 values wd, targets (one ignored)."""
    rng = np.random.default_rng(11)
    M, V, K = 9, 70, 64
    w = (rng.standard_normal((V, K)) * K**-0.5).astype(np.float32)
    q, scale = quantize(w, dt)
    q = np.ascontiguousarray(q.view(np.uint16) if dt == "f16" else q)
    scale = None if scale is None else np.ascontiguousarray(scale, np.float32)
    wd = np.asarray(dequantize(quantize(w, dt)[0], dt, scale), np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    t = rng.integers(0, V, M).astype(np.int64)
    t[2] = -100
    return x, q, scale, wd, t


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
def test_linear_ce_lowp_head(lib, dt):
    """A frozen low-precision head (a q4 model's int8 embedding table read in place): loss and dx."""
    x, q, scale, wd, t = lowp_head_case(dt)
    loss, lse, dx, _, _ = run(lib, x, q, None, t, 4, 32, dt=dt, scale=scale, wanted=(True, False, False))
    rl, rlse, rdx, _, _ = reference(x, wd, None, t)
    np.testing.assert_allclose(loss, rl.item(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, rdx.numpy(), rtol=1e-4, atol=1e-5)


def run_fwd_dx(lib, x, w, b, t, rows, cols, dt=None, scale=None, dloss=0.7):
    """linear_ce_fwd_dx (dx of the unit loss gradient in the forward's pass), then
    linear_ce_bwd_scale by dloss: the frozen head's step (passes/lm_head.head_dx_in_forward)."""
    M, K = x.shape
    V = w.shape[0]
    params = (M, V, K, K, -100, rows, cols, int(dt is not None), CODES.get(dt, 0))
    loss, lse = np.full(1, np.nan, np.float32), np.full(M, np.nan, np.float32)
    scratch = np.full(rows * (cols + K), np.nan, np.float32)
    dx1, dx = np.full((M, K), np.nan, np.float32), np.full((M, K), np.nan, np.float32)
    bad = lib.shim_linear_ce_fwd_dx(P(x), P(w), P(scale), P(b), P(t), P(loss), P(lse), P(dx1), 1.0, P(scratch),
                                    *params)
    assert bad == -1
    lib.shim_linear_ce_bwd_scale(P(np.array([dloss], np.float32)), P(dx1), P(dx), M * K)
    return loss[0], lse, dx


@pytest.mark.parametrize("M,V,K,rows,cols,bias,grow", [
    (7, 50, 16, 3, 16, True, False),     # tiles cut rows and classes unevenly
    (7, 50, 16, 256, 4096, False, False),  # one tile
    (33, 130, 24, 8, 64, True, True),    # later tiles raise the running max (dx rescaled)
    (5, 9, 3, 2, 2, False, True),
    (17, 300, 40, 17, 32, False, True),  # vector-width rows (K 40: a tail), many tiles
])
def test_linear_ce_fwd_dx_against_torch(lib, M, V, K, rows, cols, bias, grow):
    rng = np.random.default_rng(M + V + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((V, K)) * K**-0.5).astype(np.float32)
    if grow:  # logits growing with the class index: every tile raises the max of every row
        w += (np.linspace(0, 4, V)[:, None] * np.sign(x.sum(0))[None, :] / K).astype(np.float32)
    b = rng.standard_normal(V).astype(np.float32) if bias else None
    t = rng.integers(0, V, M).astype(np.int64)
    t[1] = t[M - 1] = -100
    loss, lse, dx = run_fwd_dx(lib, x, w, b, t, min(rows, M), min(cols, V))
    rl, rlse, rdx, _, _ = reference(x, w, b, t)
    np.testing.assert_allclose(loss, rl.item(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, rlse.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, rdx.numpy(), rtol=1e-4, atol=1e-6)
    assert np.all(dx[1] == 0) and np.all(dx[M - 1] == 0)
    # the same loss and lse bits as linear_ce_fwd; dx as linear_ce_bwd's up to rounding
    l2, lse2, dx2, _, _ = run(lib, x, w, b, t, min(rows, M), min(cols, V), wanted=(True, False, False))
    assert l2 == loss and np.array_equal(lse2, lse)
    np.testing.assert_allclose(dx, dx2, rtol=1e-5, atol=1e-7)


def test_fwd_dx_every_target_ignored_gives_zeros(lib):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((10, 8)).astype(np.float32)
    loss, _, dx = run_fwd_dx(lib, x, w, None, np.full(4, -100, np.int64), 2, 4)
    assert loss == 0 and not dx.any()


def test_fwd_dx_nonfinite_logits_give_a_nonfinite_loss(lib):
    """A NaN in x (so in its row's logits): the loss is NaN (the step's guard skips the update)."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((10, 8)).astype(np.float32)
    x[2, 3] = np.nan
    loss, _, _ = run_fwd_dx(lib, x, w, None, np.arange(4, dtype=np.int64), 2, 4)
    assert not np.isfinite(loss)


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
def test_linear_ce_fwd_dx_lowp_head(lib, dt):
    x, q, scale, wd, t = lowp_head_case(dt)
    loss, _, dx = run_fwd_dx(lib, x, q, None, t, 4, 32, dt=dt, scale=scale)
    rl, _, rdx, _, _ = reference(x, wd, None, t)
    np.testing.assert_allclose(loss, rl.item(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, rdx.numpy(), rtol=1e-4, atol=1e-5)
