"""Dense kernels (kernels/gemm.cpp, linear.cpp, conv2d.cpp, pool2d.cpp, embedding.cpp,
layer_norm.cpp, batch_norm.cpp) against numpy / torch / torch.autograd in float32.

Every output buffer is pre-filled with NaN (catches elements never written) and
followed by a guard region that must stay untouched (catches out-of-bounds
writes).  Inputs are float32; references are torch float32 (or float64 numpy
for gemm), compared with rtol/atol around 1e-4/1e-5."""
import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-4, 1e-5
GUARD = 16
SENTINEL = -12345.0

vp = ctypes.c_void_p


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()  # the shims generated from the op records, their argtypes set (conv2d's and
    # pool2d's take Conv2dParams / Pool2dParams as their fields, in order: conv_setup, pool_params)


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


# ----------------------------------------------------------------------------- conv2d

# N, C, H, W, O, (KH, KW), (sh, sw), (ph, pw), (dh, dw), groups
CONV_CASES = [
    (2, 5, 7, 9, 6, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # pointwise -> gemm
    (2, 4, 5, 6, 6, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # pointwise, grouped
    (2, 4, 7, 7, 3, (1, 1), (2, 2), (0, 0), (1, 1), 1),  # strided 1x1 -> direct
    (2, 3, 8, 7, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (3, 4, 9, 11, 5, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (2, 6, 10, 9, 4, (3, 2), (1, 2), (2, 1), (2, 1), 2),  # asymmetric everything
    (1, 3, 12, 12, 4, (3, 3), (1, 1), (2, 2), (2, 2), 1),  # dilation 2
    (2, 6, 7, 7, 9, (3, 3), (1, 1), (1, 1), (1, 1), 3),  # groups
    (2, 8, 9, 9, 8, (3, 3), (1, 1), (1, 1), (1, 1), 8),  # depthwise
    (2, 5, 10, 10, 5, (5, 5), (2, 2), (2, 2), (1, 1), 5),  # depthwise, stride 2
    (2, 3, 6, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), 3),  # depthwise, multiplier 2
    (1, 2, 3, 3, 2, (5, 5), (1, 1), (2, 2), (1, 1), 1),  # kernel wider than the input
    (2, 3, 40, 37, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # rows longer than a chunk
    # enough channels per group for the implicit-GEMM paths
    (2, 16, 9, 11, 24, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 12, 10, 9, 16, (3, 2), (2, 3), (1, 2), (2, 1), 1),
    (2, 16, 11, 10, 16, (5, 5), (2, 2), (2, 2), (1, 1), 2),
    (1, 10, 13, 12, 9, (3, 3), (3, 2), (0, 1), (1, 2), 1),
    (2, 16, 7, 7, 8, (1, 1), (2, 2), (0, 0), (1, 1), 1),  # strided 1x1
    (2, 3, 16, 16, 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # GEMM forward, direct input gradient
    (1, 20, 20, 20, 12, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # several GEMM blocks in K and N
    (2, 8, 5, 5, 8, (5, 5), (1, 1), (3, 3), (1, 1), 1),  # padding wider than half the kernel
]


def conv_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def conv_setup(case, seed):
    N, C, H, W, O, (KH, KW), (sh, sw), (ph, pw), (dh, dw_), G = case
    OH, OW = conv_out(H, KH, sh, ph, dh), conv_out(W, KW, sw, pw, dw_)
    params = np.array([N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw_, G], dtype=np.int64)
    rng = np.random.default_rng(seed)
    x = rand(rng, N, C, H, W)
    w = rand(rng, O, C // G, KH, KW, scale=(C // G * KH * KW) ** -0.5)
    b = rand(rng, O)
    dy = rand(rng, N, O, OH, OW)
    return params, x, w, b, dy


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(lib, case):
    params, x, w, b, dy = conv_setup(case, sum(case[:5]))
    N, C, H, W, O = case[:5]
    G = case[-1]
    OH, OW = params[7], params[8]
    tx, tw, tb = T(x, True), T(w, True), T(b, True)
    ty = F.conv2d(tx, tw, tb, stride=case[6], padding=case[7], dilation=case[8], groups=G)
    ty.backward(T(dy))
    bufs = Buffers()
    y, y_nb, dx, dw, db = bufs(N, O, OH, OW), bufs(N, O, OH, OW), bufs(N, C, H, W), bufs(*w.shape), bufs(O)
    lib.shim_conv2d_fwd(P(x), P(w), P(b), P(y), *params.tolist())
    close(y, ty)
    lib.shim_conv2d_fwd(P(x), P(w), None, P(y_nb), *params.tolist())
    close(y_nb, ty.detach() - tb.detach()[:, None, None])
    lib.shim_conv2d_bwd_input(P(dy), P(w), P(dx), *params.tolist())
    close(dx, tx.grad)
    lib.shim_conv2d_bwd_weight(P(dy), P(x), P(dw), *params.tolist(), C // G, C)
    close(dw, tw.grad)
    lib.shim_conv2d_bwd_bias(P(dy), P(db), *params.tolist())
    close(db, tb.grad)
    bufs.check_guards()


@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[1] // c[-1] > 1])
def test_conv2d_bwd_weight_partial_channels(lib, case):
    """dw[O, k, KH, KW] for the first k input channels of each group (x full, xc == C)."""
    params, x, w, b, dy = conv_setup(case, 99)
    C, G = case[1], case[-1]
    tx, tw = T(x), T(w, True)
    F.conv2d(tx, tw, None, stride=case[6], padding=case[7], dilation=case[8], groups=G).backward(T(dy))
    full = tw.grad.numpy()
    for k in {1, C // G - 1}:
        bufs = Buffers()
        dw = bufs(w.shape[0], k, w.shape[2], w.shape[3])
        lib.shim_conv2d_bwd_weight(P(dy), P(x), P(dw), *params.tolist(), k, C)
        close(dw, full[:, :k])
        if G == 1:  # x already sliced to its first k channels (xc == k)
            xs = np.ascontiguousarray(x[:, :k])
            dw2 = bufs(w.shape[0], k, w.shape[2], w.shape[3])
            lib.shim_conv2d_bwd_weight(P(dy), P(xs), P(dw2), *params.tolist(), k, k)
            close(dw2, full[:, :k])
        bufs.check_guards()


# conv2d_bwd_weight's pieces (conv2d.cpp, sum_over_images): image groups for a small gradient (at
# most 64K floats), column blocks or row blocks of a larger one (a 1x1 convolution's on small
# planes: its images side by side in one GEMM), the implicit-GEMM (im2col) path likewise; each
# sized to be threaded.
# N, C, H, W, O, (KH, KW), (sh, sw), (ph, pw), (dh, dw), groups
BWD_WEIGHT_PIECE_CASES = [
    (8, 16, 32, 32, 96, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # small gradient: 4 groups of 2 images
    (3, 24, 16, 16, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # fewer images than groups
    (3, 32, 8, 8, 48, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # grouped
    (3, 256, 9, 9, 320, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # 82K floats: column blocks (96, 96, 64)
    (2, 64, 9, 9, 1100, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # 70K floats, 64 columns: row blocks
    (5, 256, 4, 4, 320, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # 82K floats, 4x4 planes: images side by side
    (3, 400, 8, 8, 800, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # grouped (80K floats per group), side by side
    (8, 3, 32, 32, 32, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # the stem: image groups through im2col
    (2, 64, 6, 6, 128, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # 74K floats through im2col: row blocks
]


@pytest.fixture(scope="module")
def threads_lib(shim_builder):
    from pointwise_lib import load
    return load(shim_builder)


@pytest.mark.parametrize("case", BWD_WEIGHT_PIECE_CASES)
def test_conv2d_bwd_weight_pieces_same_bits_on_any_threads(threads_lib, case):
    """The weight gradient's pieces are fixed by the shape: 1, 2 and 3 threads give the same bits,
    and torch's float64 gradient (sums of thousands of terms: judged against the largest element)."""
    params, x, w, b, dy = conv_setup(case, 7)
    C, G = case[1], case[-1]
    tx, tw = torch.from_numpy(x).double(), torch.from_numpy(w).double().requires_grad_(True)
    F.conv2d(tx, tw, None, stride=case[6], padding=case[7], dilation=case[8], groups=G).backward(
        torch.from_numpy(dy).double())
    got = {}
    try:
        for threads in (1, 2, 3):
            threads_lib.pw_use_threads(threads)
            bufs = Buffers()
            dw = bufs(*w.shape)
            threads_lib.shim_conv2d_bwd_weight(P(dy), P(x), P(dw), *params.tolist(), C // G, C)
            bufs.check_guards()
            got[threads] = dw.copy()
    finally:
        threads_lib.pw_use_threads(1)
    want = tw.grad.numpy()
    assert np.abs(got[1] - want).max() <= 1e-6 * np.abs(want).max()
    for threads in (2, 3):
        assert got[threads].tobytes() == got[1].tobytes(), f"{threads} threads"


@pytest.mark.parametrize("case", [
    (8, 3, 64, 64, 32, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # the stem (conv2d_small_k.cpp)
    (3, 3, 33, 31, 10, (3, 3), (2, 2), (1, 1), (1, 1), 1),
])
def test_conv2d_fwd_small_k_same_bits_on_any_threads(threads_lib, case):
    """The few-taps forward splits over (image, position block) only: 1, 2 and 3 threads give
    the same bits (relu6 fused), and torch's float64 result."""
    params, x, w, b, _ = conv_setup(case, 5)
    ref = F.relu6(F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                           stride=case[6], padding=case[7]))
    got = {}
    try:
        for threads in (1, 2, 3):
            threads_lib.pw_use_threads(threads)
            bufs = Buffers()
            y = bufs(case[0], case[4], params[7], params[8])
            threads_lib.shim_conv2d_fwd_act(P(x), P(w), P(b), P(y), *params.tolist(), 2)
            bufs.check_guards()
            got[threads] = y.copy()
    finally:
        threads_lib.pw_use_threads(1)
    close(got[1], ref, atol=2e-5)
    for threads in (2, 3):
        assert got[threads].tobytes() == got[1].tobytes(), f"{threads} threads"


@pytest.mark.parametrize("case", [
    (5, 256, 4, 4, 320, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # MobileNetV2-like 4x4 projection
    (3, 400, 8, 8, 160, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # grouped, 8x8 planes
])
def test_conv2d_bwd_input_side_by_side_same_bits(threads_lib, case):
    """A 1x1 input gradient on small planes is one GEMM over the images side by side: the same
    bits as a GEMM per image (each image on its own), on 1, 2 and 3 threads."""
    params, x, w, b, dy = conv_setup(case, 11)
    N, C, H, W = case[:4]
    one = params.copy()
    one[0] = 1
    try:
        threads_lib.pw_use_threads(1)
        bufs = Buffers()
        ref = bufs(*x.shape)
        for n in range(N):
            dyn, dxn = np.ascontiguousarray(dy[n:n + 1]), bufs(1, C, H, W)
            threads_lib.shim_conv2d_bwd_input(P(dyn), P(w), P(dxn), *one.tolist())
            ref[n] = dxn[0]
        for threads in (1, 2, 3):
            threads_lib.pw_use_threads(threads)
            dx = bufs(*x.shape)
            threads_lib.shim_conv2d_bwd_input(P(dy), P(w), P(dx), *params.tolist())
            assert dx.tobytes() == ref.tobytes(), f"{threads} threads"
        bufs.check_guards()
    finally:
        threads_lib.pw_use_threads(1)


# The fast paths of conv2d.cpp: 3x3 depthwise planes (flat form for planes that
# fit a stack buffer, row form otherwise; wide stride-2 rows: split rows forward,
# row form gradients; edges and vector tails at odd sizes), 3x3 with few channels
# per group (plane sums), 1x1 GEMMs, and the stem (3 -> many, stride 2).
FAST_CONV_CASES = [
    (2, 5, 64, 64, 5, (3, 3), (1, 1), (1, 1), (1, 1), 5),  # depthwise s1, flat
    (2, 4, 64, 64, 4, (3, 3), (2, 2), (1, 1), (1, 1), 4),  # depthwise s2, split rows / row form (OW = 32)
    (2, 3, 66, 70, 3, (3, 3), (2, 2), (1, 1), (1, 1), 3),  # s2 wide rows, even/odd sizes
    (1, 3, 67, 69, 3, (3, 3), (2, 2), (1, 1), (1, 1), 3),  # s2 wide rows, odd sizes, vector tails
    (1, 2, 5, 1101, 2, (3, 3), (2, 2), (1, 1), (1, 1), 2),  # s2, OW = 551: split rows in three column chunks
    (1, 2, 9, 81, 2, (3, 3), (2, 2), (0, 0), (1, 1), 2),  # s2 wide rows, no padding
    (1, 2, 10, 80, 2, (3, 3), (2, 2), (2, 2), (1, 1), 2),  # s2 wide rows, padding 2
    (1, 4, 12, 70, 2, (3, 3), (2, 2), (1, 1), (1, 1), 2),  # s2 wide rows, 2 channels per group (accumulated)
    (1, 2, 130, 131, 2, (3, 3), (1, 1), (1, 1), (1, 1), 2),  # too big for the flat form: s1 row form
    (1, 2, 101, 99, 2, (3, 3), (1, 1), (0, 0), (1, 1), 2),  # row form, no padding
    (1, 2, 100, 100, 2, (3, 3), (1, 1), (2, 2), (1, 1), 2),  # row form, padding 2
    (2, 6, 31, 29, 6, (3, 3), (2, 2), (1, 1), (1, 1), 6),  # s2 flat, odd sizes
    (2, 6, 17, 33, 6, (3, 3), (1, 1), (1, 1), (1, 1), 6),  # s1 flat, odd sizes
    (3, 7, 8, 8, 7, (3, 3), (2, 2), (1, 1), (1, 1), 7),
    (2, 9, 4, 4, 9, (3, 3), (1, 1), (1, 1), (1, 1), 9),
    (2, 4, 1, 1, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4),  # 1x1 plane
    (2, 4, 2, 3, 4, (3, 3), (2, 2), (1, 1), (1, 1), 4),
    (2, 4, 9, 9, 4, (3, 3), (1, 1), (0, 0), (1, 1), 4),  # no padding
    (2, 4, 9, 10, 4, (3, 3), (2, 2), (0, 0), (1, 1), 4),
    (2, 4, 7, 7, 4, (3, 3), (1, 1), (2, 2), (1, 1), 4),  # padding 2
    (1, 4, 9, 7, 4, (3, 3), (2, 2), (2, 2), (1, 1), 4),
    (2, 4, 12, 12, 8, (3, 3), (1, 1), (1, 1), (1, 1), 4),  # multiplier 2: plane sums
    (2, 6, 40, 37, 4, (3, 3), (2, 2), (1, 1), (1, 1), 2),  # grouped, few channels: plane sums
    (2, 3, 64, 64, 32, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # MobileNetV2 stem
    (3, 16, 12, 12, 24, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # pointwise
    (3, 24, 5, 5, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (3, 80, 4, 4, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # small planes, wide w^T: images side by side
    (2, 160, 3, 5, 60, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # the same, 2 groups of 80 input channels
    (1, 80, 4, 4, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # one image: a GEMM per image
    # depthwise, padding 1, small planes (conv2d_dw_small.cpp's masked flat form on AVX-512)
    (2, 20, 4, 4, 20, (3, 3), (1, 1), (1, 1), (1, 1), 20),  # a plane per vector
    (2, 17, 8, 8, 17, (3, 3), (2, 2), (1, 1), (1, 1), 17),  # s2 -> 4x4
    (3, 5, 16, 16, 5, (3, 3), (1, 1), (1, 1), (1, 1), 5),
    (3, 5, 16, 16, 5, (3, 3), (2, 2), (1, 1), (1, 1), 5),
    (2, 3, 5, 7, 3, (3, 3), (1, 1), (1, 1), (1, 1), 3),  # rows straddle vectors
    (2, 3, 15, 13, 3, (3, 3), (2, 2), (1, 1), (1, 1), 3),  # odd sizes, s2
    (2, 3, 9, 7, 3, (3, 3), (2, 2), (1, 1), (1, 1), 3),
    (1, 3, 1, 17, 3, (3, 3), (1, 1), (1, 1), (1, 1), 3),  # one row
    (1, 3, 2, 3, 3, (3, 3), (2, 2), (1, 1), (1, 1), 3),
    (70, 2, 2, 2, 2, (3, 3), (1, 1), (1, 1), (1, 1), 2),  # weight-gradient flushes over many images
    # few taps per output (C*KH*KW <= 32, >= 8 output channels): conv2d_small_k.cpp's forward
    (2, 3, 33, 31, 10, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # odd sizes, 4 channels past the 6-row tiles
    (1, 2, 15, 70, 9, (3, 3), (1, 1), (2, 2), (2, 2), 1),  # dilated, stride 1, 3 channels past the tiles
    (2, 1, 19, 40, 13, (5, 5), (2, 2), (2, 2), (1, 1), 1),  # 5x5 s2: deinterleaved rows, 1 channel past the tiles
    (1, 2, 6, 9, 11, (2, 4), (3, 1), (0, 3), (1, 1), 1),  # uneven kernel and strides, wide padding
]


@pytest.mark.parametrize("case", FAST_CONV_CASES)
def test_conv2d_fast_paths(lib, case):
    """Against a float64 reference; the weight gradient sums thousands of terms
    per element, so its tolerance scales with the largest gradient."""
    params, x, w, b, dy = conv_setup(case, sum(case[:5]))
    N, C, H, W, O = case[:5]
    G = case[-1]
    OH, OW = params[7], params[8]
    D = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
    tx, tw, tb = D(x), D(w), D(b)
    ty = F.conv2d(tx, tw, tb, stride=case[6], padding=case[7], dilation=case[8], groups=G)
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    bufs = Buffers()
    y, dx, dw, db = bufs(N, O, OH, OW), bufs(N, C, H, W), bufs(*w.shape), bufs(O)
    lib.shim_conv2d_fwd(P(x), P(w), P(b), P(y), *params.tolist())
    close(y, ty, atol=2e-5)
    lib.shim_conv2d_bwd_input(P(dy), P(w), P(dx), *params.tolist())
    close(dx, tx.grad, atol=2e-5)
    lib.shim_conv2d_bwd_weight(P(dy), P(x), P(dw), *params.tolist(), C // G, C)
    close(dw, tw.grad, atol=1e-6 * float(tw.grad.abs().max()) + 1e-5)
    lib.shim_conv2d_bwd_bias(P(dy), P(db), *params.tolist())
    close(db, tb.grad, atol=1e-5)
    bufs.check_guards()


@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("case", [FAST_CONV_CASES[i] for i in (0, 1, 7, 10, 17, 19, 20, 22, 23, 27)] + [CONV_CASES[5], CONV_CASES[12]])
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_fwd_act(lib, case, act, bias):
    params, x, w, b, _ = conv_setup(case, 7 + act)
    x *= 4.0  # plenty of values on both sides of 0 and 6
    N, O, G = case[0], case[4], case[-1]
    b = b if bias else None
    ty = F.conv2d(T(x), T(w), None if b is None else T(b), stride=case[6], padding=case[7], dilation=case[8],
                  groups=G)
    ty = [ty, F.relu(ty), F.relu6(ty)][act]
    bufs = Buffers()
    y = bufs(N, O, params[7], params[8])
    lib.shim_conv2d_fwd_act(P(x), P(w), P(b), P(y), *params.tolist(), act)
    close(y, ty, atol=5e-5)
    bufs.check_guards()


def test_conv2d_fwd_act_nan_propagates(lib):
    case = (1, 2, 6, 6, 2, (3, 3), (1, 1), (1, 1), (1, 1), 2)
    params, x, w, b, _ = conv_setup(case, 3)
    x[0, 1, 2, 3] = np.nan
    ref = F.relu6(F.conv2d(T(x), T(w), T(b), padding=1, groups=2))
    for act in (1, 2):
        bufs = Buffers()
        y = bufs(1, 2, 6, 6)
        lib.shim_conv2d_fwd_act(P(x), P(w), P(b), P(y), *params.tolist(), act)
        assert np.isnan(y[0, 1]).sum() == np.isnan(ref[0, 1].numpy()).sum() > 0
        assert not np.isnan(y[0, 0]).any()


# ----------------------------------------------------------------------------- pooling

# N, C, H, W, (KH, KW), (sh, sw), (ph, pw), (dh, dw), ceil_mode
MAX_POOL_CASES = [
    (2, 3, 8, 8, (2, 2), (2, 2), (0, 0), (1, 1), False),
    (2, 3, 7, 9, (3, 3), (2, 2), (1, 1), (1, 1), False),
    (1, 2, 7, 9, (3, 3), (2, 2), (1, 1), (1, 1), True),  # ceil: last window overhangs
    (2, 2, 10, 11, (3, 2), (3, 2), (0, 1), (1, 1), True),
    (1, 3, 11, 10, (3, 3), (2, 3), (1, 1), (2, 2), False),  # dilation
    (1, 2, 12, 13, (2, 3), (3, 2), (1, 1), (3, 2), True),  # dilation + ceil + pad
    (2, 2, 5, 5, (5, 5), (1, 1), (2, 2), (1, 1), False),
    (1, 1, 6, 6, (2, 2), (4, 4), (1, 1), (1, 1), True),  # stride > kernel, ceil window starts in pad
]


def pool_params(N, C, H, W, OH, OW, k, s, p, d, count_include_pad=True, divisor_override=0):
    return np.array([N, C, H, W, OH, OW, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1],
                     int(count_include_pad), divisor_override or 0], dtype=np.int64)


@pytest.mark.parametrize("case", MAX_POOL_CASES)
def test_max_pool2d(lib, case):
    N, C, H, W, k, s, p, d, ceil = case
    rng = np.random.default_rng(H * W)
    x = rand(rng, N, C, H, W)
    tx = T(x, True)
    ty, tidx = F.max_pool2d(tx, k, s, p, d, ceil_mode=ceil, return_indices=True)
    OH, OW = ty.shape[2:]
    dy = rand(rng, *ty.shape)
    ty.backward(T(dy))
    params = pool_params(N, C, H, W, OH, OW, k, s, p, d)
    bufs = Buffers()
    y, idx, dx = bufs(N, C, OH, OW), bufs(N, C, OH, OW, dtype=np.int32), bufs(N, C, H, W)
    lib.shim_max_pool2d_fwd(P(x), P(y), P(idx), *params.tolist())
    close(y, ty, rtol=0, atol=0)
    np.testing.assert_array_equal(idx, tidx.numpy())
    lib.shim_max_pool2d_bwd(P(dy), P(idx), P(dx), *params.tolist())
    close(dx, tx.grad)
    bufs.check_guards()


def test_max_pool2d_ties_and_nan(lib):
    x = np.zeros((1, 2, 4, 4), np.float32)  # plane 0: all ties -> first position wins
    x[0, 1] = np.arange(16, dtype=np.float32).reshape(4, 4)
    x[0, 1, 1, 0] = np.nan  # NaN propagates and wins
    k, s, p, d = (2, 2), (2, 2), (0, 0), (1, 1)
    ty, tidx = F.max_pool2d(T(x), k, s, p, d, return_indices=True)
    params = pool_params(1, 2, 4, 4, 2, 2, k, s, p, d)
    bufs = Buffers()
    y, idx = bufs(1, 2, 2, 2), bufs(1, 2, 2, 2, dtype=np.int32)
    lib.shim_max_pool2d_fwd(P(x), P(y), P(idx), *params.tolist())
    np.testing.assert_array_equal(y, ty.numpy())  # NaN compares equal here
    np.testing.assert_array_equal(idx, tidx.numpy())
    assert np.isnan(y[0, 1, 0, 0]) and idx[0, 1, 0, 0] == 4
    bufs.check_guards()


# N, C, H, W, (KH, KW), (sh, sw), (ph, pw), ceil_mode, count_include_pad, divisor_override
AVG_POOL_CASES = [
    (2, 3, 8, 8, (2, 2), (2, 2), (0, 0), False, True, None),
    (2, 3, 7, 9, (3, 3), (2, 2), (1, 1), False, True, None),
    (2, 3, 7, 9, (3, 3), (2, 2), (1, 1), False, False, None),
    (1, 2, 7, 9, (3, 3), (2, 2), (1, 1), True, True, None),  # ceil: overhang beyond the padding
    (1, 2, 7, 9, (3, 3), (2, 2), (1, 1), True, False, None),
    (2, 2, 10, 11, (3, 2), (3, 2), (0, 1), True, True, None),
    (1, 2, 6, 6, (2, 2), (4, 4), (1, 1), True, True, None),  # ceil window starting in pad
    (1, 2, 6, 5, (3, 3), (2, 2), (1, 1), True, True, 5),  # divisor_override
    (2, 3, 5, 5, (5, 5), (1, 1), (2, 2), False, False, None),
]


@pytest.mark.parametrize("case", AVG_POOL_CASES)
def test_avg_pool2d(lib, case):
    N, C, H, W, k, s, p, ceil, cip, div = case
    rng = np.random.default_rng(H + 3 * W)
    x = rand(rng, N, C, H, W)
    tx = T(x, True)
    ty = F.avg_pool2d(tx, k, s, p, ceil_mode=ceil, count_include_pad=cip, divisor_override=div)
    OH, OW = ty.shape[2:]
    dy = rand(rng, *ty.shape)
    ty.backward(T(dy))
    params = pool_params(N, C, H, W, OH, OW, k, s, p, (1, 1), cip, div)
    bufs = Buffers()
    y, dx = bufs(N, C, OH, OW), bufs(N, C, H, W)
    lib.shim_avg_pool2d_fwd(P(x), P(y), *params.tolist())
    close(y, ty)
    lib.shim_avg_pool2d_bwd(P(dy), P(dx), *params.tolist())
    close(dx, tx.grad)
    bufs.check_guards()


@pytest.mark.parametrize("H,W,OH,OW", [(7, 9, 3, 4), (5, 5, 5, 5), (10, 3, 4, 2), (6, 6, 1, 1), (3, 3, 5, 7)])
def test_adaptive_avg_pool2d(lib, H, W, OH, OW):
    N, C = 2, 3
    rng = np.random.default_rng(H * 7 + W)
    x = rand(rng, N, C, H, W)
    tx = T(x, True)
    ty = F.adaptive_avg_pool2d(tx, (OH, OW))
    dy = rand(rng, *ty.shape)
    ty.backward(T(dy))
    bufs = Buffers()
    y, dx = bufs(N, C, OH, OW), bufs(N, C, H, W)
    lib.shim_adaptive_avg_pool2d_fwd(P(x), P(y), N, C, H, W, OH, OW)
    close(y, ty)
    lib.shim_adaptive_avg_pool2d_bwd(P(dy), P(dx), N, C, H, W, OH, OW)
    close(dx, tx.grad)
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
