"""Convolution and pooling kernels (kernels/conv2d.cpp, conv2d_small_k.cpp, conv2d_dw_small.cpp,
conv2d_plane3x3.cpp, pool2d.cpp) against torch / torch.autograd in float32, with the same NaN-filled,
guarded output buffers as test_kernels_dense.py (dense_lib.py)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dense_lib import Buffers, P, T, close, rand


@pytest.fixture(scope="module")
def lib(shim_builder):
    return shim_builder()  # the shims generated from the op records, their argtypes set (conv2d's and
    # pool2d's take Conv2dParams / Pool2dParams as their fields, in order: conv_setup, pool_params)


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
