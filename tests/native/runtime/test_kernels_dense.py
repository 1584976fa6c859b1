"""Dense kernels (kernels/gemm.cpp, linear.cpp, embedding.cpp, layer_norm.cpp, rms_norm.cpp,
batch_norm.cpp) against numpy / torch / torch.autograd in float32 (convolution and pooling:
test_kernels_conv.py).

Every output buffer is pre-filled with NaN (catches elements never written) and
followed by a guard region that must stay untouched (catches out-of-bounds
writes); dense_lib.py.  Inputs are float32; references are torch float32 (or float64 numpy
for gemm), compared with rtol/atol around 1e-4/1e-5."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dense_lib import Buffers, I64, P, T, close, rand


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()  # the shims generated from the op records, their argtypes set (conv2d's and
    # pool2d's take Conv2dParams / Pool2dParams as their fields, in order: conv_setup, pool_params)


# ----------------------------------------------------------------------------- gemm

GEMM_SHAPES = [(1, 1, 1), (7, 13, 5), (12, 32, 128), (37, 65, 129), (50, 200, 300), (13, 97, 1), (1, 300, 40),
               # M <= 4: the GEMV (row-major op(B)) and dot (op(B) = W^T) paths, column tails
               (1, 670, 96), (2, 96, 700), (3, 83, 37), (4, 1100, 300), (1, 15, 7), (2, 4, 17),
               # either side of the dot path's row limit (8), W in several of its L2 blocks
               (8, 1500, 96), (9, 1500, 96)]


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_gemm_single(lib, ta, tb, M, N, K):
    rng = np.random.default_rng(M * 1000 + N + K)
    a, b = rand(rng, M, K, scale=K**-0.5), rand(rng, K, N)
    A = np.ascontiguousarray(a.T) if ta else a
    B = np.ascontiguousarray(b.T) if tb else b
    bufs = Buffers()
    c = bufs(M, N)
    lib.shim_gemm(P(A), P(B), P(c), 1, M, N, K, ta, tb, 0, 0, 0, 0.0)
    close(c, a.astype(np.float64) @ b.astype(np.float64))
    # beta = 1 accumulates onto C
    c0 = rand(rng, M, N)
    c2 = bufs(M, N, init=c0)
    lib.shim_gemm(P(A), P(B), P(c2), 1, M, N, K, ta, tb, 0, 0, 0, 1.0)
    close(c2, c0 + a.astype(np.float64) @ b.astype(np.float64))
    bufs.check_guards()


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_batched_strides(lib, ta, tb):
    rng = np.random.default_rng(7)
    batch, M, N, K = 3, 29, 70, 150
    a, b = rand(rng, batch, M, K, scale=K**-0.5), rand(rng, batch, K, N)
    A = np.ascontiguousarray(a.transpose(0, 2, 1)) if ta else a
    B = np.ascontiguousarray(b.transpose(0, 2, 1)) if tb else b
    bufs = Buffers()
    # independent batches
    c = bufs(batch, M, N)
    lib.shim_gemm(P(A), P(B), P(c), batch, M, N, K, ta, tb, M * K, K * N, M * N, 0.0)
    close(c, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b))
    # A broadcast (sa = 0) over batched B
    c = bufs(batch, M, N)
    lib.shim_gemm(P(A), P(B), P(c), batch, M, N, K, ta, tb, 0, K * N, M * N, 0.0)
    close(c, np.einsum("mk,bkn->bmn", a[0].astype(np.float64), b))
    # B broadcast (sb = 0)
    c = bufs(batch, M, N)
    lib.shim_gemm(P(A), P(B), P(c), batch, M, N, K, ta, tb, M * K, 0, M * N, 0.0)
    close(c, np.einsum("bmk,kn->bmn", a.astype(np.float64), b[0]))
    # sc = 0, beta = 1: every batch's product summed into one C
    c0 = rand(rng, M, N)
    c = bufs(M, N, init=c0)
    lib.shim_gemm(P(A), P(B), P(c), batch, M, N, K, ta, tb, M * K, K * N, 0, 1.0)
    close(c, c0 + np.einsum("bmk,bkn->mn", a.astype(np.float64), b), atol=1e-4)
    bufs.check_guards()


def test_gemm_k0_and_beta0_overwrites_nan(lib):
    bufs = Buffers()
    a = np.zeros(1, np.float32)
    c = bufs(4, 5)  # NaN-filled
    lib.shim_gemm(P(a), P(a), P(c), 1, 4, 5, 0, 0, 0, 0, 0, 0, 0.0)
    assert (c == 0).all()
    c0 = np.arange(20, dtype=np.float32).reshape(4, 5)
    c = bufs(4, 5, init=c0)
    lib.shim_gemm(P(a), P(a), P(c), 1, 4, 5, 0, 0, 0, 0, 0, 0, 1.0)
    close(c, c0)
    # beta = 0 must not read C (NaN in C must not leak)
    rng = np.random.default_rng(1)
    x, y = rand(rng, 4, 3), rand(rng, 3, 5)
    c = bufs(4, 5)
    lib.shim_gemm(P(x), P(y), P(c), 1, 4, 5, 3, 0, 0, 0, 0, 0, 0.0)
    close(c, x.astype(np.float64) @ y)
    # other betas scale C (beyond the contract's 0/1, kept consistent)
    c = bufs(4, 5, init=c0)
    lib.shim_gemm(P(x), P(y), P(c), 1, 4, 5, 3, 0, 0, 0, 0, 0, 0.5)
    close(c, 0.5 * c0 + x.astype(np.float64) @ y)
    bufs.check_guards()


# ----------------------------------------------------------------------------- linear


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (5, 7, 3), (33, 17, 130), (64, 100, 50)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(lib, M, N, K, bias):
    rng = np.random.default_rng(M + 10 * N + 100 * K)
    x, w, b = rand(rng, M, K), rand(rng, N, K, scale=K**-0.5), rand(rng, N) if bias else None
    dy = rand(rng, M, N)
    tx, tw = T(x, True), T(w, True)
    tb = T(b, True) if bias else None
    ty = F.linear(tx, tw, tb)
    ty.backward(T(dy))
    bufs = Buffers()
    y, dx, dw = bufs(M, N), bufs(M, K), bufs(N, K)
    lib.shim_linear_fwd(P(x), P(w), P(b), P(y), M, N, K)
    close(y, ty)
    lib.shim_linear_bwd_input(P(dy), P(w), P(dx), M, N, K)
    close(dx, tx.grad)
    lib.shim_linear_bwd_weight(P(dy), P(x), P(dw), M, N, K, K)
    close(dw, tw.grad)
    if bias:
        db = bufs(N)
        lib.shim_bias_bwd(P(dy), P(db), M, N)
        close(db, tb.grad)
    bufs.check_guards()


@pytest.mark.parametrize("M,N,K,k", [(9, 6, 20, 7), (40, 33, 150, 129), (3, 2, 5, 1)])
def test_linear_bwd_weight_partial(lib, M, N, K, k):
    rng = np.random.default_rng(K + k)
    x, dy = rand(rng, M, K), rand(rng, M, N)
    full = dy.T.astype(np.float64) @ x.astype(np.float64)
    bufs = Buffers()
    dw = bufs(N, k)
    lib.shim_linear_bwd_weight(P(dy), P(x), P(dw), M, N, k, K)  # x full, row length K
    close(dw, full[:, :k])
    xs = np.ascontiguousarray(x[:, :k])
    dw2 = bufs(N, k)
    lib.shim_linear_bwd_weight(P(dy), P(xs), P(dw2), M, N, k, k)  # x already sliced
    close(dw2, full[:, :k])
    bufs.check_guards()


@pytest.mark.parametrize("M,N", [(37, 600),  # more columns than one accumulator block
                                 (200, 77),  # several row blocks, a column tail
                                 (130, 3), (1, 1029)])
def test_bias_bwd_wide(lib, M, N):
    rng = np.random.default_rng(3)
    dy = rand(rng, M, N)
    bufs = Buffers()
    db = bufs(N)
    lib.shim_bias_bwd(P(dy), P(db), M, N)
    close(db, dy.astype(np.float64).sum(0))
    bufs.check_guards()


# ----------------------------------------------------------------------------- embedding


@pytest.mark.parametrize("n,V,D,k,padding_idx", [(1, 1, 1, 1, -1), (17, 10, 6, 6, -1), (30, 7, 9, 4, 3),
                                                  (12, 50, 5, 5, 0)])
def test_embedding(lib, n, V, D, k, padding_idx):
    rng = np.random.default_rng(n + V)
    w = rand(rng, V, D)
    idx_np = rng.integers(0, V, size=n).astype(np.int64)
    if padding_idx >= 0:
        idx_np[: min(3, n)] = padding_idx
    idx, pidx = I64(idx_np)
    dy = rand(rng, n, D)
    tw = T(w, True)
    ty = F.embedding(torch.from_numpy(idx_np), tw, padding_idx=None if padding_idx < 0 else padding_idx)
    ty.backward(T(dy))
    bufs = Buffers()
    y, dw = bufs(n, D), bufs(V, k)
    lib.shim_embedding_fwd(P(w), pidx, P(y), n, V, D)
    close(y, ty, rtol=0, atol=0)
    lib.shim_embedding_bwd(P(dy), pidx, P(dw), n, V, D, k, padding_idx)
    close(dw, tw.grad[:, :k])
    if padding_idx >= 0:
        assert (dw[padding_idx] == 0).all()
    # summed onto another gradient of the table (a tied head's): out of place, then in place
    base = rand(rng, V, k)
    onto, inplace = bufs(V, k), bufs(V, k)
    inplace[...] = base
    lib.shim_embedding_bwd_onto(P(dy), pidx, P(base), P(onto), n, V, D, k, padding_idx)
    lib.shim_embedding_bwd_onto(P(dy), pidx, P(inplace), P(inplace), n, V, D, k, padding_idx)
    close(onto, T(base) + tw.grad[:, :k])
    assert np.array_equal(onto, inplace)
    bufs.check_guards()
    # the exact guard's check of the rows it summed into (every other row is zero, or base's)
    rows = [int(r) for r in idx_np if r != padding_idx]
    assert lib.shim_embedding_rows_finite(P(dw), pidx, n, V, k, padding_idx)
    untouched = [r for r in range(V) if r not in rows]
    if untouched:
        dw[untouched[0], 0] = np.nan  # not a row it wrote: not looked at
        assert lib.shim_embedding_rows_finite(P(dw), pidx, n, V, k, padding_idx)
    if rows:
        dw[rows[-1], k - 1] = np.inf
        assert not lib.shim_embedding_rows_finite(P(dw), pidx, n, V, k, padding_idx)


# ----------------------------------------------------------------------------- layer_norm


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (16, 64), (4, 600)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(lib, rows, cols, affine):
    rng = np.random.default_rng(rows * cols)
    x = rand(rng, rows, cols) * 2 + 0.5
    w, b = (rand(rng, cols), rand(rng, cols)) if affine else (None, None)
    dy = rand(rng, rows, cols)
    eps = 1e-5
    tx = T(x, True)
    tw, tb = (T(w, True), T(b, True)) if affine else (None, None)
    ty, tmean, trstd = torch.native_layer_norm(tx, [cols], tw, tb, eps)
    ty.backward(T(dy))
    bufs = Buffers()
    y, mean, rstd, dx = bufs(rows, cols), bufs(rows), bufs(rows), bufs(rows, cols)
    lib.shim_layer_norm_fwd(P(x), P(w), P(b), P(y), P(mean), P(rstd), rows, cols, eps)
    close(y, ty, atol=2e-5)
    close(mean, tmean.reshape(rows))
    close(rstd, trstd.reshape(rows))
    dw, db = (bufs(cols), bufs(cols)) if affine else (None, None)
    lib.shim_layer_norm_bwd(P(dy), P(x), P(mean), P(rstd), P(w), P(dx), P(dw), P(db), rows, cols)
    close(dx, tx.grad, atol=2e-5)
    if affine:
        close(dw, tw.grad)
        close(db, tb.grad)
        # nullable outputs: each gradient alone
        for want in ("dx", "dw", "db"):
            outs = {name: (bufs(*shape) if name == want else None)
                    for name, shape in (("dx", (rows, cols)), ("dw", (cols,)), ("db", (cols,)))}
            lib.shim_layer_norm_bwd(P(dy), P(x), P(mean), P(rstd), P(w), P(outs["dx"]), P(outs["dw"]),
                                    P(outs["db"]), rows, cols)
            close(outs[want], {"dx": tx.grad, "dw": tw.grad, "db": tb.grad}[want], atol=2e-5)
    bufs.check_guards()


def test_layer_norm_far_from_zero(lib):
    """Rows whose mean is far larger than their spread (the one-pass block moments keep the
    variance exact) and rows spanning several 256-column blocks with a tail."""
    rng = np.random.default_rng(7)
    rows, cols = 5, 1000
    x = (rand(rng, rows, cols) * 0.01 + 3000.0).astype(np.float32)
    x[1] = 7.0  # constant row: variance 0, never negative
    x[2] = rand(rng, cols) + 3000.0  # spread 1: y within float rounding of the mean
    bufs = Buffers()
    y, mean, rstd = bufs(rows, cols), bufs(rows), bufs(rows)
    lib.shim_layer_norm_fwd(P(x), None, None, P(y), P(mean), P(rstd), rows, cols, 1e-8)
    ty, tmean, trstd = torch.native_layer_norm(T(x).double(), [cols], None, None, 1e-8)
    close(mean, tmean.reshape(rows), rtol=1e-7)
    close(rstd, trstd.reshape(rows), rtol=1e-5)
    close(y[2], ty[2], atol=1e-3)
    assert (y[1] == 0).all() and np.isfinite(rstd).all()
    bufs.check_guards()


# ----------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (16, 64), (4, 600), (2, 1537)])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm(lib, rows, cols, weighted):
    rng = np.random.default_rng(rows * cols + 1)
    x = rand(rng, rows, cols) * 2 + 0.5
    w = rand(rng, cols) if weighted else None
    dy = rand(rng, rows, cols)
    eps = 1e-6
    tx = T(x, True)
    tw = T(w, True) if weighted else None
    r = torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + eps)
    ty = tx * r * (tw if weighted else 1.0)
    ty.backward(T(dy))
    bufs = Buffers()
    y, rstd, dx = bufs(rows, cols), bufs(rows), bufs(rows, cols)
    lib.shim_rms_norm_fwd(P(x), P(w), P(y), P(rstd), rows, cols, eps)
    close(y, ty, atol=2e-5)
    close(rstd, r.reshape(rows))
    dw = bufs(cols) if weighted else None
    lib.shim_rms_norm_bwd(P(dy), P(x), P(rstd), P(w), P(dx), P(dw), rows, cols)
    close(dx, tx.grad, atol=2e-5)
    if weighted:
        close(dw, tw.grad, atol=2e-5)
        for want in ("dx", "dw"):  # nullable outputs: each gradient alone
            outs = {"dx": bufs(rows, cols) if want == "dx" else None, "dw": bufs(cols) if want == "dw" else None}
            lib.shim_rms_norm_bwd(P(dy), P(x), P(rstd), P(w), P(outs["dx"]), P(outs["dw"]), rows, cols)
            close(outs[want], {"dx": tx.grad, "dw": tw.grad}[want], atol=2e-5)
    bufs.check_guards()


# ----------------------------------------------------------------------------- batch_norm

BN_SHAPES = [(4, 3, 1), (2, 5, 7), (3, 4, 36), (8, 2, 100)]


@pytest.mark.parametrize("N,C,S", BN_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_train(lib, N, C, S, affine):
    rng = np.random.default_rng(N * C * S)
    x = rand(rng, N, C, S) * 1.5 + 0.7
    w, b = (rand(rng, C), rand(rng, C)) if affine else (None, None)
    rm, rv = rand(rng, C), np.abs(rand(rng, C)) + 0.5
    dy = rand(rng, N, C, S)
    momentum, eps = 0.1, 1e-5
    tx = T(x, True)
    tw, tb = (T(w, True), T(b, True)) if affine else (None, None)
    trm, trv = T(rm), T(rv)
    ty, tsave_mean, tsave_invstd = torch.native_batch_norm(tx, tw, tb, trm, trv, True, momentum, eps)
    ty.backward(T(dy))  # torch updated trm / trv in place
    bufs = Buffers()
    y, smean, sinv, new_rm, new_rv = bufs(N, C, S), bufs(C), bufs(C), bufs(C), bufs(C)
    lib.shim_batch_norm_train_fwd(P(x), P(w), P(b), P(rm), P(rv), P(y), P(smean), P(sinv), P(new_rm), P(new_rv),
                                  N, C, S, momentum, eps)
    close(y, ty, atol=2e-5)
    close(smean, tsave_mean)
    close(sinv, tsave_invstd)
    close(new_rm, trm)
    close(new_rv, trv)
    # running statistics updated in place (new_rm / new_rv alias rm / rv)
    rm2, rv2 = bufs(C, init=rm), bufs(C, init=rv)
    y2 = bufs(N, C, S)
    lib.shim_batch_norm_train_fwd(P(x), P(w), P(b), P(rm2), P(rv2), P(y2), P(smean), P(sinv), P(rm2), P(rv2),
                                  N, C, S, momentum, eps)
    close(rm2, trm)
    close(rv2, trv)
    dx = bufs(N, C, S)
    dw, db = (bufs(C), bufs(C)) if affine else (None, None)
    lib.shim_batch_norm_train_bwd(P(dy), P(x), P(smean), P(sinv), P(w), P(dx), P(dw), P(db), N, C, S)
    close(dx, tx.grad, atol=2e-5)
    if affine:
        close(dw, tw.grad, atol=2e-5)
        close(db, tb.grad, atol=2e-5)
        # dx not wanted: the parameter gradients still come out
        dw2, db2 = bufs(C), bufs(C)
        lib.shim_batch_norm_train_bwd(P(dy), P(x), P(smean), P(sinv), P(w), None, P(dw2), P(db2), N, C, S)
        close(dw2, tw.grad, atol=2e-5)
        close(db2, tb.grad, atol=2e-5)
    bufs.check_guards()


@pytest.mark.parametrize("N,C,S", BN_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_eval(lib, N, C, S, affine):
    rng = np.random.default_rng(N + C + S)
    x = rand(rng, N, C, S)
    w, b = (rand(rng, C), rand(rng, C)) if affine else (None, None)
    rm, rv = rand(rng, C), np.abs(rand(rng, C)) + 0.5
    dy = rand(rng, N, C, S)
    eps = 1e-3
    tx = T(x, True)
    tw, tb = (T(w, True), T(b, True)) if affine else (None, None)
    ty = F.batch_norm(tx, T(rm), T(rv), tw, tb, training=False, eps=eps)
    ty.backward(T(dy))
    bufs = Buffers()
    y, dx = bufs(N, C, S), bufs(N, C, S)
    lib.shim_batch_norm_eval_fwd(P(x), P(w), P(b), P(rm), P(rv), P(y), N, C, S, eps)
    close(y, ty)
    dw, db = (bufs(C), bufs(C)) if affine else (None, None)
    lib.shim_batch_norm_eval_bwd(P(dy), P(x), P(rm), P(rv), P(w), P(dx), P(dw), P(db), N, C, S, eps)
    close(dx, tx.grad)
    if affine:
        close(dw, tw.grad, atol=2e-5)
        close(db, tb.grad, atol=2e-5)
        # only the parameter gradients
        dw2 = bufs(C)
        lib.shim_batch_norm_eval_bwd(P(dy), P(x), P(rm), P(rv), P(w), None, P(dw2), None, N, C, S, eps)
        close(dw2, tw.grad, atol=2e-5)
    bufs.check_guards()


@pytest.mark.parametrize("N,C,S", BN_SHAPES + [(8, 3, 4096), (2, 5, 33)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_batch_norm_fwd_act(lib, N, C, S, act):
    rng = np.random.default_rng(N * C + S + act)
    x = rand(rng, N, C, S) * 4.0 + 2.0
    w, b = rand(rng, C) * 3.0, rand(rng, C) * 2.0
    rm, rv = rand(rng, C), np.abs(rand(rng, C)) + 0.5
    momentum, eps = 0.1, 1e-5
    trm, trv = T(rm), T(rv)
    ty, tmean, tinv = torch.native_batch_norm(T(x), T(w), T(b), trm, trv, True, momentum, eps)
    fn = [lambda t: t, F.relu, F.relu6][act]
    bufs = Buffers()
    y, smean, sinv, new_rm, new_rv = bufs(N, C, S), bufs(C), bufs(C), bufs(C), bufs(C)
    lib.shim_batch_norm_train_fwd_act(P(x), P(w), P(b), P(rm), P(rv), P(y), P(smean), P(sinv), P(new_rm),
                                      P(new_rv), N, C, S, momentum, eps, act)
    close(y, fn(ty), atol=5e-5)
    close(smean, tmean)
    close(sinv, tinv)
    close(new_rm, trm)
    close(new_rv, trv)
    ye = bufs(N, C, S)
    lib.shim_batch_norm_eval_fwd_act(P(x), P(w), P(b), P(rm), P(rv), P(ye), N, C, S, eps, act)
    close(ye, fn(F.batch_norm(T(x), T(rm), T(rv), T(w), T(b), training=False, eps=eps)), atol=5e-5)
    # the backward through the activation in one kernel: the bits of relu_bwd / hardtanh_bwd then
    # batch_norm_train_bwd (y holds exact 0s and 6s at the clamps; a NaN output masks its dy)
    y.reshape(-1)[::97] = np.nan
    dy = rand(rng, N, C, S)
    g = bufs(N, C, S)
    if act == 1:
        lib.shim_relu_bwd(P(dy), P(y), P(g), y.size)
    elif act == 2:
        lib.shim_hardtanh_bwd(P(dy), P(y), P(g), y.size, 0.0, 6.0)
    else:
        g[...] = dy
    want = [bufs(N, C, S), bufs(C), bufs(C)]
    lib.shim_batch_norm_train_bwd(P(g), P(x), P(smean), P(sinv), P(w), *map(P, want), N, C, S)
    got = [bufs(N, C, S), bufs(C), bufs(C)]
    lib.shim_batch_norm_train_bwd_act(P(dy), P(y), P(x), P(smean), P(sinv), P(w), *map(P, got), N, C, S, act)
    for a_, b_ in zip(got, want):
        np.testing.assert_array_equal(a_, b_)
    bufs.check_guards()


def test_batch_norm_fwd_streamed_rows(lib):
    """A y of 2^21 floats or more (batch_norm.cpp's kStreamMin) is written with non-temporal stores
    on AVX2 builds, rows of 1024+ floats from their first 32-byte boundary (odd S: every row
    starts at another alignment): the same values as torch, train and eval, through relu6."""
    rng = np.random.default_rng(21)
    N, C, S = 2, 1001, 1051
    x = rand(rng, N, C, S) * 4.0 + 2.0
    w, b = rand(rng, C) * 3.0, rand(rng, C) * 2.0
    rm, rv = rand(rng, C), np.abs(rand(rng, C)) + 0.5
    ty, tmean, tinv = torch.native_batch_norm(T(x), T(w), T(b), None, None, True, 0.1, 1e-5)
    bufs = Buffers()
    y, smean, sinv = bufs(N, C, S), bufs(C), bufs(C)
    lib.shim_batch_norm_train_fwd_act(P(x), P(w), P(b), None, None, P(y), P(smean), P(sinv), None, None, N, C, S,
                                      0.1, 1e-5, 2)
    close(y, F.relu6(ty), atol=5e-5)
    close(smean, tmean)
    close(sinv, tinv)
    ye = bufs(N, C, S)
    lib.shim_batch_norm_eval_fwd_act(P(x), P(w), P(b), P(rm), P(rv), P(ye), N, C, S, 1e-5, 2)
    close(ye, F.relu6(F.batch_norm(T(x), T(rm), T(rv), T(w), T(b), training=False, eps=1e-5)), atol=5e-5)
    bufs.check_guards()


def test_batch_norm_large_offset(lib):
    """Statistics stay accurate for a channel whose mean dwarfs its spread."""
    rng = np.random.default_rng(5)
    N, C, S = 4, 2, 1000
    x = (rand(rng, N, C, S) * 0.01 + 300.0).astype(np.float32)
    ty, tmean, tinv = torch.native_batch_norm(T(x), None, None, None, None, True, 0.1, 1e-5)
    bufs = Buffers()
    y, smean, sinv = bufs(N, C, S), bufs(C), bufs(C)
    lib.shim_batch_norm_train_fwd(P(x), None, None, None, None, P(y), P(smean), P(sinv), None, None, N, C, S, 0.1,
                                  1e-5)
    close(smean, tmean)
    close(sinv, tinv, rtol=1e-3)
    # y against float64: the forward is centered, (x - mean) * scale + b, not x * scale + (b - mean * scale),
    # which cancels ~1e-3 away here; the mean is corrected by a second pass over x - mean (float
    # lanes alone leave it ~2e-6 off, i.e. y ~2e-4 off)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=(0, 2), keepdims=True)
    ref = (x64 - mu) / np.sqrt(x64.var(axis=(0, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(sinv, 1.0 / np.sqrt(x64.var(axis=(0, 2)) + 1e-5), rtol=1e-5)
    assert np.abs(y.astype(np.float64) - ref).max() < 2e-6
    # with an affine and relu, through the same centered path
    w, b = rand(rng, C) * 2.0, rand(rng, C)
    ya = bufs(N, C, S)
    lib.shim_batch_norm_train_fwd_act(P(x), P(w), P(b), None, None, P(ya), P(smean), P(sinv), None, None, N, C,
                                      S, 0.1, 1e-5, 1)
    ref_a = np.maximum(ref * w.reshape(1, C, 1) + b.reshape(1, C, 1), 0.0)
    assert np.abs(ya.astype(np.float64) - ref_a).max() < 1e-5
    bufs.check_guards()
