"""Pointwise-family kernels (activation, elementwise, reduce, copy, softmax, loss,
attention, dropout, optimizer) against torch / torch.autograd / torch.optim, float32."""
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pointwise_lib import ACTS, ATOL, UNARY, I, P, bview, close, load, rnd, run_reduce, sdpa_args


@pytest.fixture(scope="module")
def lib(shim_builder):
    return load(shim_builder)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------ activation
@pytest.mark.parametrize("op", sorted(ACTS))
@pytest.mark.parametrize("shape", [(7,), (3, 5, 17), (4099,)])
def test_activation(lib, rng, op, shape):
    fn, a, b, uses_out = ACTS[op]
    x = rnd(rng, *shape, scale=3.0)
    x.reshape(-1)[:4] = [0.0, -1.0, 2.0, 1e-3]  # relu/hardtanh boundaries
    dy = rnd(rng, *shape)
    y = np.empty_like(x)
    lib.pw_act_fwd(op, P(x), P(y), x.size, a, b)
    xt = torch.from_numpy(x).requires_grad_()
    yt = fn(xt)
    # tanh-gelu: 1 + tanh(u) cancels for u << 0; torch's vectorized tanh rounds differently there
    atol = 1e-5 if op == 6 else ATOL
    close(y, yt, atol=atol)
    yt.backward(torch.from_numpy(dy))
    dx = np.empty_like(x)
    lib.pw_act_bwd(op, P(dy), P(y if uses_out else x), P(dx), x.size, a, b)
    close(dx, xt.grad, atol=atol)


# ------------------------------------------------------------------ elementwise
@pytest.mark.parametrize("op", range(len(UNARY)))
def test_unary(lib, rng, op):
    fn, positive = UNARY[op]
    x = rnd(rng, 3, 37, scale=2.0)
    if positive:
        x = np.abs(x) + 0.05
    y = np.empty_like(x)
    lib.pw_unary(op, P(x), P(y), x.size)
    close(y, fn(torch.from_numpy(x)))


def test_scalar_ops(lib, rng):
    x = rnd(rng, 5, 19)
    for op, fn in enumerate([lambda t: t + 1.5, lambda t: t * -0.75, lambda t: 2.5 - t]):
        y = np.empty_like(x)
        lib.pw_scalar(op, P(x), P(y), x.size, [1.5, -0.75, 2.5][op])
        close(y, fn(torch.from_numpy(x)))


@pytest.mark.parametrize("e", [2.0, 3.0, 1.0, 0.5, -0.5, -1.0, -2.0, 0.0, 1.7, -1.3])
def test_pow_scalar(lib, rng, e):
    x = np.abs(rnd(rng, 4, 33)) + 0.1
    if e in (2.0, 3.0, 1.0, 0.0):
        x[0] = -x[0]  # integral exponents accept negative bases
    y = np.empty_like(x)
    lib.pw_scalar(3, P(x), P(y), x.size, e)
    xt = torch.from_numpy(x).requires_grad_()
    yt = xt.pow(e)
    close(y, yt)
    dy = rnd(rng, 4, 33)
    yt.backward(torch.from_numpy(dy))
    dx = np.empty_like(x)
    lib.pw_pow_bwd(P(dy), P(x), P(dx), x.size, e)
    close(dx, xt.grad)
    dy2 = dy.copy()  # in place (dx aliases dy)
    lib.pw_pow_bwd(P(dy2), P(x), P(dy2), x.size, e)
    close(dy2, xt.grad)


def run_binary(lib, op, a, b):
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    out = np.empty(out_shape, np.float32)
    pa, sa = bview(a, out_shape)
    pb, sb = bview(b, out_shape)
    lib.pw_binary(op, pa, pb, P(out), len(out_shape), P(I(out_shape)), P(sa), P(sb))
    return out


TORCH_BIN = [torch.add, torch.sub, torch.mul, torch.div]
PAIRS = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), ()), ((), (3, 4, 5)), ((3, 4, 5), (5,)), ((5,), (3, 4, 5)),
         ((3, 4, 5), (4, 1)), ((3, 1, 5), (1, 4, 1)), ((2, 3, 1, 4, 1, 6), (1, 3, 5, 1, 2, 6)), ((), ()),
         ((1,), (7,)), ((64, 300), (300,)), ((64, 300), (64, 1)), ((1000,), (1000,))]
# every broadcast position: b has size 1 in each subset of the dims of (2,3,4,5)
PAIRS += [((2, 3, 4, 5), tuple(1 if m >> d & 1 else s for d, s in enumerate((2, 3, 4, 5)))) for m in range(16)]


@pytest.mark.parametrize("op", range(4))
def test_binary_broadcast(lib, rng, op):
    for sa_, sb_ in PAIRS:
        for a_shape, b_shape in ((sa_, sb_), (sb_, sa_)):
            a, b = rnd(rng, *a_shape), rnd(rng, *b_shape)
            if op == 3:
                b = np.where(np.abs(b) < 0.2, 0.7, b).astype(np.float32)
            got = run_binary(lib, op, a, b)
            close(got, TORCH_BIN[op](torch.from_numpy(a), torch.from_numpy(b)))


def test_binary_strided_views(lib, rng):
    base = rnd(rng, 6, 8, 10)
    a = base.transpose(2, 0, 1)[:, ::2]           # non-contiguous, step 2
    b = rnd(rng, 10, 1, 8)[..., ::-1]              # negative stride
    got = run_binary(lib, 2, a, b)
    close(got, torch.from_numpy(np.ascontiguousarray(a)) * torch.from_numpy(b.copy()))


@pytest.mark.parametrize("op", range(4))
def test_binary_grads_via_reduce(lib, rng, op):
    """The gradient of a broadcasting op = binary kernels + reduce_sum over the broadcast dims."""
    for a_shape, b_shape in [((2, 3, 4, 5), (3, 1, 5)), ((4, 1, 6), (1, 5, 1)), ((3, 7), ()), ((8, 9), (9,))]:
        a, b = rnd(rng, *a_shape), rnd(rng, *b_shape)
        b = np.where(np.abs(b) < 0.3, 0.9, b).astype(np.float32)
        at, bt = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
        out = TORCH_BIN[op](at, bt)
        g = rnd(rng, *out.shape)
        out.backward(torch.from_numpy(g))
        close(run_binary(lib, op, a, b), out)
        if op == 0:
            ga, gb = g, g
        elif op == 1:
            ga, gb = g, run_binary(lib, 2, g, np.full((), -1.0, np.float32))
        elif op == 2:
            ga, gb = run_binary(lib, 2, g, b), run_binary(lib, 2, g, a)
        else:
            ga = run_binary(lib, 3, g, b)
            gb = run_binary(lib, 2, run_binary(lib, 3, ga, b), -a)  # -g*a/b^2
        for full, small, want in ((ga, a, at.grad), (gb, b, bt.grad)):
            nd = full.ndim
            sh = (1,) * (nd - small.ndim) + small.shape
            dims = [d for d in range(nd) if sh[d] == 1 and full.shape[d] != 1]
            r = run_reduce(lib, np.ascontiguousarray(full, np.float32), dims)
            close(r.reshape(small.shape), want, rtol=1e-5, atol=1e-5)


def test_where(lib, rng):
    for cs, as_, bs in [((3, 4, 5),) * 3, ((3, 1, 5), (4, 1), ()), ((5,), (3, 4, 5), (3, 4, 1)),
                        ((2, 1, 4, 1), (1, 3, 1, 5), (2, 3, 4, 5)), ((), (6,), (6,))]:
        out_shape = np.broadcast_shapes(cs, as_, bs)
        c = np.asarray(rng.random(cs) < 0.5).astype(np.uint8)
        a, b = rnd(rng, *as_), rnd(rng, *bs)
        out = np.empty(out_shape, np.float32)
        (pc, sc), (pa, sa), (pb, sb) = bview(c, out_shape), bview(a, out_shape), bview(b, out_shape)
        lib.pw_where(pc, pa, pb, P(out), len(out_shape), P(I(out_shape)), P(sc), P(sa), P(sb))
        want = torch.where(torch.from_numpy(c).bool(), torch.from_numpy(a), torch.from_numpy(b))
        np.testing.assert_array_equal(out, want.numpy())


# ------------------------------------------------------------------ reduce
def test_reduce_every_subset(lib, rng):
    for shape in [(2, 3, 4, 5), (2, 1, 3, 4, 1, 5)]:
        x = rnd(rng, *shape)
        xt = torch.from_numpy(x)
        for r in range(len(shape) + 1):
            for dims in itertools.combinations(range(len(shape)), r):
                want = xt.sum(dim=dims, keepdim=True) if dims else xt.clone()
                close(run_reduce(lib, x, dims), want, atol=1e-5)
                if dims:  # mean via scale
                    cnt = math.prod(shape[d] for d in dims)
                    close(run_reduce(lib, x, dims, 1.0 / cnt), xt.mean(dim=dims, keepdim=True), atol=1e-6)


def test_reduce_fast_paths_and_accuracy(lib, rng):
    x = (rng.random(200_003) + 1000.0).astype(np.float32)  # large offset: naive float sum drifts
    got = run_reduce(lib, x, [0])
    np.testing.assert_allclose(got[0], x.astype(np.float64).sum(), rtol=1e-7)
    for shape, dims in [((50, 300), [0]), ((3, 70, 517), [0, 1]), ((517, 3), [1]), ((5, 1000), [1]),
                        ((4, 3, 260), [1]), ((6, 7, 8, 9), [0, 2]), ((6, 7, 8, 9), [1, 3]), ((2, 300, 3), [0, 2])]:
        x = rnd(rng, *shape)
        want = x.astype(np.float64).sum(axis=tuple(dims), keepdims=True)
        close(run_reduce(lib, x, dims), want, rtol=1e-6, atol=1e-6)
    # empty reductions give zeros; empty outputs write nothing
    x = np.zeros((3, 0, 4), np.float32)
    np.testing.assert_array_equal(run_reduce(lib, x, [1]), np.zeros((3, 1, 4), np.float32))
    # a 0-d tensor
    np.testing.assert_array_equal(run_reduce(lib, np.array(2.5, np.float32), [], 2.0), np.array(5.0, np.float32))


# ------------------------------------------------------------------ copy
DTYPES = {0: np.float32, 1: np.int64, 2: np.int32, 3: np.uint8}


def copy_into(lib, dt, src_base, src_view, dst_base, dst_view):
    """strided_copy src_view -> dst_view, both views of their bases; offsets passed explicitly."""
    it = src_base.itemsize
    in_off = (src_view.__array_interface__["data"][0] - src_base.__array_interface__["data"][0]) // it
    out_off = (dst_view.__array_interface__["data"][0] - dst_base.__array_interface__["data"][0]) // it
    assert src_view.shape == dst_view.shape
    lib.pw_strided_copy(dt, P(src_base), P(dst_base), src_view.ndim, P(I(src_view.shape)),
                        P(I([s // it for s in src_view.strides])), in_off,
                        P(I([s // it for s in dst_view.strides])), out_off)


def data_of(rng, dt, shape):
    if dt == 0:
        return rnd(rng, *shape)
    return np.asarray(rng.integers(-100 if dt in (1, 2) else 0, 200, size=shape)).astype(DTYPES[dt])


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_strided_copy(lib, rng, dt):
    x = data_of(rng, dt, (4, 6, 9, 5))
    views = [
        x,                                   # contiguous copy
        x.transpose(0, 2, 1, 3),             # permute, inner dim contiguous
        x.transpose(3, 1, 0, 2),             # permute, inner dim strided
        x[:, 1:6:2, ::3],                    # slice with steps
        x[1:3, :, 4:, 1:],                   # slice with offsets
        x[2],                                # select
        np.broadcast_to(x[:, :1, :, 2:3], (4, 7, 9, 3)),   # expand (stride 0)
        np.broadcast_to(x[:, 1:2, :, 3:4], (4, 2, 9, 11)),  # expand of the innermost dim
        x[..., ::-2],                        # negative step
    ]
    for v in views:
        y = np.zeros(v.shape, x.dtype)
        copy_into(lib, dt, x, v, y, y)
        np.testing.assert_array_equal(y, v)
    # strided destinations: expand into every other column; a permuted view into a permuted view
    for src in (np.broadcast_to(x[..., :1], (4, 6, 9, 3)), x.transpose(0, 1, 3, 2)[..., ::3]):
        ybuf = np.zeros(src.shape[:3] + (2 * src.shape[3],), x.dtype)
        copy_into(lib, dt, x, src, ybuf, ybuf[..., 1::2])
        np.testing.assert_array_equal(ybuf[..., 1::2], src)
        np.testing.assert_array_equal(ybuf[..., 0::2], 0)
    ybuf = np.zeros((9, 5, 6, 4), x.dtype)
    copy_into(lib, dt, x, x, ybuf, ybuf.transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(ybuf.transpose(3, 2, 0, 1), x)
    # cat along dim 1: two copies into offsets of one output
    a, b = data_of(rng, dt, (3, 4, 5)), data_of(rng, dt, (3, 2, 5))
    out = np.zeros((3, 6, 5), x.dtype)
    copy_into(lib, dt, a, a, out, out[:, :4])
    copy_into(lib, dt, b, b, out, out[:, 4:])
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))
    # backward of a strided slice: scatter into a zero-filled gradient
    g = data_of(rng, dt, (4, 3, 3, 5))
    dx = np.empty_like(x)
    lib.pw_fill(dt, P(dx), dx.size, 0.0, 0)
    copy_into(lib, dt, g, g, dx, dx[:, 1:6:2, ::3])
    want = np.zeros_like(x)
    want[:, 1:6:2, ::3] = g
    np.testing.assert_array_equal(dx, want)
    # 0-d and empty copies
    s = data_of(rng, dt, ())
    y = np.zeros((), x.dtype)
    copy_into(lib, dt, s, s, y, y)
    assert y == s
    e = np.zeros((0, 3), x.dtype)
    d = e.copy()
    copy_into(lib, dt, e, e, d, d)


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_fill(lib, dt):
    y = np.zeros(37, DTYPES[dt])
    lib.pw_fill(dt, P(y), 33, -2.5, 7 if dt == 3 else -(2**40) if dt == 1 else -7)
    want = {0: -2.5, 1: -(2**40), 2: -7, 3: 7}[dt]
    np.testing.assert_array_equal(y[:33], np.full(33, want, DTYPES[dt]))
    np.testing.assert_array_equal(y[33:], 0)


# ------------------------------------------------------------------ softmax
@pytest.mark.parametrize("log", [0, 1])
def test_softmax(lib, rng, log):
    for shape, dim in [((4, 10), 1), ((3, 5, 7), 0), ((3, 5, 7), 1), ((3, 5, 7), 2), ((2, 300, 3), 1),
                       ((2, 3, 200), 1), ((1, 1000), 1), ((6,), 0)]:
        x = rnd(rng, *shape, scale=20.0)  # large logits: needs the max subtraction
        outer, d = math.prod(shape[:dim]), shape[dim]
        inner = math.prod(shape[dim + 1:])
        y = np.empty_like(x)
        lib.pw_softmax(log, 0, P(x), None, P(y), outer, d, inner)
        xt = torch.from_numpy(x).requires_grad_()
        yt = (torch.log_softmax if log else torch.softmax)(xt, dim)
        close(y, yt, atol=1e-5 if log else 1e-6)
        dy = rnd(rng, *shape)
        yt.backward(torch.from_numpy(dy))
        dx = np.empty_like(x)
        lib.pw_softmax(log, 1, P(dy), P(y), P(dx), outer, d, inner)
        close(dx, xt.grad, rtol=1e-4, atol=1e-5)
        y2 = x.copy()  # in place
        lib.pw_softmax(log, 0, P(y2), None, P(y2), outer, d, inner)
        np.testing.assert_array_equal(y2, y)
    # stability: huge logits that differ per (outer, inner) column (exp would overflow without the max)
    for shape, dim in [((4, 10), 1), ((2, 3, 200), 1), ((3, 6, 5), 1)]:
        x = rnd(rng, *shape, scale=5.0) + np.linspace(-3000, 3000, math.prod(shape)).reshape(shape).astype(np.float32)
        outer, d, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
        y = np.empty_like(x)
        lib.pw_softmax(log, 0, P(x), None, P(y), outer, d, inner)
        want = (torch.log_softmax if log else torch.softmax)(torch.from_numpy(x).double(), dim)
        close(y, want, rtol=1e-4, atol=1e-4 if log else 1e-6)


# ------------------------------------------------------------------ loss
@pytest.mark.parametrize("ls", [0.0, 0.1, 0.35])
@pytest.mark.parametrize("ignore", [-100, 3])
def test_cross_entropy(lib, rng, ls, ignore):
    N, C = 16, 10
    logits = rnd(rng, N, C, scale=4.0)
    t = rng.integers(0, C, N).astype(np.int64)
    t[[1, 5, 6]] = ignore
    loss = np.zeros(1, np.float32)
    lib.pw_ce_fwd(P(logits), P(t), P(loss), N, C, ignore, ls)
    lt = torch.from_numpy(logits).requires_grad_()
    want = F.cross_entropy(lt, torch.from_numpy(t), ignore_index=ignore, label_smoothing=ls)
    close(loss[0], want)
    want.backward(torch.tensor(0.7))
    d = np.full_like(logits, np.nan)
    lib.pw_ce_bwd(P(np.array([0.7], np.float32)), P(logits), P(t), P(d), N, C, ignore, ls)
    close(d, lt.grad)
    if ignore == -100:
        assert np.all(d[[1, 5, 6]] == 0)


def test_losses_all_ignored_and_nll_mse(lib, rng):
    N, C = 5, 4
    logits = rnd(rng, N, C)
    t = np.full(N, -100, np.int64)
    # PyTorch gives NaN here; our documented behaviour is loss 0 and zero gradients
    assert torch.isnan(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(t)))
    loss, d = np.full(1, np.nan, np.float32), np.full_like(logits, np.nan)
    lib.pw_ce_fwd(P(logits), P(t), P(loss), N, C, -100, 0.1)
    lib.pw_ce_bwd(P(np.ones(1, np.float32)), P(logits), P(t), P(d), N, C, -100, 0.1)
    assert loss[0] == 0 and np.all(d == 0)
    lib.pw_nll_fwd(P(logits), P(t), P(loss), N, C, -100)
    lib.pw_nll_bwd(P(np.ones(1, np.float32)), P(t), P(d), N, C, -100)
    assert loss[0] == 0 and np.all(d == 0)
    # nll_loss on log-probabilities with ignore_index
    N, C = 12, 7
    logp = torch.log_softmax(torch.from_numpy(rnd(rng, N, C)), 1).numpy()
    t = rng.integers(0, C, N).astype(np.int64)
    t[[0, 7]] = -1
    lp = torch.from_numpy(logp).requires_grad_()
    want = F.nll_loss(lp, torch.from_numpy(t), ignore_index=-1)
    lib.pw_nll_fwd(P(logp), P(t), P(loss), N, C, -1)
    close(loss[0], want)
    want.backward(torch.tensor(1.3))
    d = np.full_like(logp, np.nan)
    lib.pw_nll_bwd(P(np.array([1.3], np.float32)), P(t), P(d), N, C, -1)
    close(d, lp.grad)
    # mse
    a, b = rnd(rng, 3, 50), rnd(rng, 3, 50)
    at, bt = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
    want = F.mse_loss(at, bt)
    lib.pw_mse_fwd(P(a), P(b), P(loss), a.size)
    close(loss[0], want)
    want.backward(torch.tensor(0.6))
    da, db = np.empty_like(a), np.empty_like(b)
    lib.pw_mse_bwd(P(np.array([0.6], np.float32)), P(a), P(b), P(da), P(db), a.size)
    close(da, at.grad)
    close(db, bt.grad)
    da2 = np.empty_like(a)
    lib.pw_mse_bwd(P(np.array([0.6], np.float32)), P(a), P(b), P(da2), None, a.size)  # db not wanted
    np.testing.assert_array_equal(da2, da)


# ------------------------------------------------------------------ attention
def ref_sdpa(q, k, v, scale, causal, bmask=None, fmask=None):
    """float64 reference; fully masked rows give zeros (PyTorch would give NaN)."""
    s = scale * q @ k.transpose(-1, -2)
    L, S = s.shape[-2:]
    allowed = torch.ones(s.shape, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(L, S, dtype=torch.bool).tril()
    if bmask is not None:
        allowed = allowed & bmask
    if fmask is not None:
        s = s + fmask
    s = s.masked_fill(~allowed, -math.inf)
    full = (s == -math.inf).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(full, 0.0), -1) * (~full)
    return p @ v, p


def run_sdpa(lib, q, k, v, scale, causal, kind, mask, mstrides, grads=(True, True, True), dout=None):
    B, L, E = q.shape
    S, Ev = k.shape[1], v.shape[2]
    params = sdpa_args(B, L, S, E, Ev, mstrides, scale, causal, kind)
    out = np.full((B, L, Ev), np.nan, np.float32)
    lse = np.full((B, L), np.nan, np.float32)
    lib.shim_sdpa_fwd(P(q), P(k), P(v), P(mask), P(out), P(lse), *params)
    probs = np.full((B, L, S), np.nan, np.float32)  # recomputed from lse, as a learned mask's gradient does
    lib.shim_sdpa_probs(P(q), P(k), P(mask), P(lse), P(probs), *params)
    if dout is None:
        return out, probs, None
    dq, dk, dv = (np.full(a.shape, np.nan, np.float32) if w else None for a, w in zip((q, k, v), grads))
    lib.shim_sdpa_bwd(P(dout), P(q), P(k), P(v), P(out), P(lse), P(mask), P(dq), P(dk), P(dv), None, *params)
    return out, probs, (dq, dk, dv)


def mstr(m, B, L, S):
    """element strides (b, l, s) of a mask broadcast to [B, L, S]."""
    return [s // m.itemsize for s in np.broadcast_to(m, (B, L, S)).strides]


@pytest.mark.parametrize("case", ["none", "causal", "causal_rect", "bool_ls", "bool_full", "float_b1s",
                                  "float_causal", "fully_masked", "no_dq"])
def test_sdpa(lib, rng, case):
    B, L, S, E, Ev = 3, 5, 7, 16, 6
    if case == "causal":
        S = L
    if case == "causal_rect":
        L, S, E = 7, 4, 3
    q, k, v = rnd(rng, B, L, E), rnd(rng, B, S, E), rnd(rng, B, S, Ev)
    scale = 1.0 / math.sqrt(E) if case != "none" else 0.3
    causal = case in ("causal", "causal_rect", "float_causal")
    kind, mask, bm, fm, ms = 0, None, None, None, [0, 0, 0]
    if case in ("bool_ls", "fully_masked"):
        mask = (rng.random((L, S)) < 0.7).astype(np.uint8)
        mask[:, 0] = 1
        if case == "fully_masked":
            mask[2] = 0
        kind, bm, ms = 1, torch.from_numpy(mask).bool(), mstr(mask, B, L, S)
    elif case == "bool_full":
        mask = (rng.random((B, L, S)) < 0.6).astype(np.uint8)
        mask[..., 3] = 1
        kind, bm, ms = 1, torch.from_numpy(mask).bool(), mstr(mask, B, L, S)
    elif case in ("float_b1s", "float_causal"):
        mask = rnd(rng, B, 1, S)
        mask[1, 0, 2] = -np.inf
        kind, fm, ms = 2, torch.from_numpy(mask).double(), mstr(mask, B, L, S)
    dout = rnd(rng, B, L, Ev)
    grads = (False, True, True) if case == "no_dq" else (True, True, True)
    out, probs, (dq, dk, dv) = run_sdpa(lib, q, k, v, scale, int(causal), kind, mask, ms, grads, dout)
    qt, kt, vt = (torch.from_numpy(a).double().requires_grad_() for a in (q, k, v))
    ro, rp = ref_sdpa(qt, kt, vt, scale, causal, bm, fm)
    close(out, ro, rtol=1e-4, atol=1e-5)
    close(probs, rp, rtol=1e-4, atol=1e-6)
    ro.backward(torch.from_numpy(dout).double())
    for got, t in zip((dq, dk, dv), (qt, kt, vt)):
        if got is not None:
            close(got, t.grad, rtol=1e-4, atol=1e-5)
    if case == "no_dq":
        assert dq is None
    if case == "fully_masked":
        assert np.all(out[:, 2] == 0) and np.all(probs[:, 2] == 0) and np.all(dq[:, 2] == 0)
    # tie the reference to PyTorch's own SDPA where PyTorch is defined
    if case in ("none", "causal", "causal_rect", "bool_full", "float_b1s"):
        am = bm if bm is not None else (torch.from_numpy(mask) if kind == 2 else None)
        want = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                              attn_mask=am, is_causal=causal, scale=scale)
        close(out, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ dropout
def test_dropout(lib, rng):
    n, p = 100_000, 0.3
    x, dy = rnd(rng, n), rnd(rng, n)
    y, m = np.empty_like(x), np.empty(n, np.uint8)
    lib.pw_dropout_fwd(P(x), P(y), P(m), n, p, 42)
    assert set(np.unique(m)) <= {0, 1}
    assert abs(m.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(y, np.where(m == 1, x * np.float32(1 / (1 - p)), 0), rtol=1e-6)
    dx = np.empty_like(x)
    lib.pw_dropout_bwd(P(dy), P(m), P(dx), n, p)
    np.testing.assert_allclose(dx, np.where(m == 1, dy * np.float32(1 / (1 - p)), 0), rtol=1e-6)
    # deterministic, counter-based (a prefix is the same), seed-dependent
    y2, m2 = np.empty(1000, np.float32), np.empty(1000, np.uint8)
    lib.pw_dropout_fwd(P(x), P(y2), P(m2), 1000, p, 42)
    np.testing.assert_array_equal(m2, m[:1000])
    lib.pw_dropout_fwd(P(x), P(y2), P(m2), 1000, p, 43)
    assert (m2 != m[:1000]).mean() > 0.3
    # runs are not correlated with neighbours: P(keep_i and keep_{i+1}) ~ (1-p)^2
    assert abs((m[1:] & m[:-1]).mean() - (1 - p) ** 2) < 0.01
    for pp, want in ((0.0, x), (1.0, np.zeros_like(x))):
        lib.pw_dropout_fwd(P(x), P(y), P(m), n, pp, 7)
        np.testing.assert_array_equal(y, want)


# ------------------------------------------------------------------ optimizer
def region(shape, k):
    """UpdateRegion of the first k input channels of a [O, C, ...] weight."""
    rest = math.prod(shape[2:])
    return shape[0], k * rest, shape[1] * rest


SGD_CFGS = [dict(momentum=0.0), dict(momentum=0.9, weight_decay=1e-2), dict(momentum=0.9, dampening=0.1),
            dict(momentum=0.8, weight_decay=1e-3, nesterov=True), dict(momentum=0.0, weight_decay=0.05)]


@pytest.mark.parametrize("cfg", range(len(SGD_CFGS)))
@pytest.mark.parametrize("shape,k", [((37,), None), ((6, 10), 4), ((4, 5, 3, 3), 2)])
def test_sgd(lib, rng, cfg, shape, k):
    c = dict(lr=0.05, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False) | SGD_CFGS[cfg]
    w = rnd(rng, *shape)
    w0 = w.copy()
    sl = (slice(None), slice(0, k)) if k else (slice(None),)
    ref = torch.nn.Parameter(torch.from_numpy(w[sl].copy()))
    opt = torch.optim.SGD([ref], foreach=False, **c)
    outer, inner, stride = region(shape, k) if k else (1, w.size, w.size)
    buf = np.full(ref.shape, np.nan, np.float32) if c["momentum"] else None
    for step in range(3):
        g = rnd(rng, *ref.shape)
        ref.grad = torch.from_numpy(g.copy())
        opt.step()
        lib.pw_sgd(P(w), P(g), P(buf), outer, inner, stride, c["lr"], c["momentum"], c["dampening"],
                   c["weight_decay"], int(c["nesterov"]), int(step == 0))
        close(w[sl], ref.detach(), rtol=1e-5, atol=1e-6)
        if buf is not None:
            close(buf, opt.state[ref]["momentum_buffer"], rtol=1e-5, atol=1e-6)
    if k:
        np.testing.assert_array_equal(w[:, k:], w0[:, k:])  # untouched columns bit-identical


ADAM_CFGS = [dict(), dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, eps=1e-6), dict(weight_decay=0.0)]


@pytest.mark.parametrize("cfg", range(len(ADAM_CFGS)))
@pytest.mark.parametrize("shape,k", [((37,), None), ((6, 10), 4), ((4, 5, 3, 3), 2)])
def test_adamw(lib, rng, cfg, shape, k):
    c = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2) | ADAM_CFGS[cfg]
    w = rnd(rng, *shape)
    w0 = w.copy()
    sl = (slice(None), slice(0, k)) if k else (slice(None),)
    ref = torch.nn.Parameter(torch.from_numpy(w[sl].copy()))
    opt = torch.optim.AdamW([ref], foreach=False, **c)
    outer, inner, stride = region(shape, k) if k else (1, w.size, w.size)
    m, v = np.zeros(ref.shape, np.float32), np.zeros(ref.shape, np.float32)
    for step in range(1, 4):
        g = rnd(rng, *ref.shape)
        ref.grad = torch.from_numpy(g.copy())
        opt.step()
        lib.pw_adamw(P(w), P(g), P(m), P(v), outer, inner, stride, c["lr"], c["betas"][0], c["betas"][1],
                     c["eps"], c["weight_decay"], step)
        st = opt.state[ref]
        close(m, st["exp_avg"], rtol=1e-5, atol=1e-7)
        close(v, st["exp_avg_sq"], rtol=1e-5, atol=1e-9)
        close(w[sl], ref.detach(), rtol=1e-5, atol=1e-7)
        # the update itself (not just the parameter) must match
        close(w[sl] - w0[sl], ref.detach().numpy() - w0[sl], rtol=1e-3, atol=1e-8)
    if k:
        np.testing.assert_array_equal(w[:, k:], w0[:, k:])


# ------------------------------------------------------------------ activation sweep (fast exp/tanh/erf paths)
@pytest.mark.parametrize("op", [2, 3, 4, 5, 6])
def test_activation_dense_sweep(lib, op):
    """x densely over [-20, 20] plus large |x|, subnormal-producing and special values,
    against torch (float32), forward and backward."""
    fn, a, b, uses_out = ACTS[op]
    x = np.concatenate([np.linspace(-20, 20, 400_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 0.6249, 0.625, -0.625, 9.0, -9.0,
                                  30.0, -30.0, 50.0, -50.0, 87.0, -87.0, 89.0, -89.0, 100.0, -100.0, 1e4,
                                  -1e4, 1e30, -1e30], np.float32)])
    dy = np.random.default_rng(op).standard_normal(x.size).astype(np.float32)
    y = np.empty_like(x)
    lib.pw_act_fwd(op, P(x), P(y), x.size, a, b)
    # float64 reference: torch's own float32 vectorized erf/tanh are off by up to ~1e-6 here
    xt = torch.from_numpy(x).double().requires_grad_()
    yt = fn(xt)
    close(y, yt, rtol=1e-5, atol=1e-6)
    yt.backward(torch.from_numpy(dy).double())
    dx = np.empty_like(x)
    lib.pw_act_bwd(op, P(dy), P(y if uses_out else x), P(dx), x.size, a, b)
    ok = np.abs(x) <= 1e4 if op == 6 else slice(None)  # tanh-gelu: torch's x^3 overflows to inf * 0 = NaN
    close(dx[ok], xt.grad[ok], rtol=1e-5, atol=1e-6)
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    if op == 6:
        big = np.abs(x) > 1e4
        np.testing.assert_allclose(dx[big], np.where(x[big] > 0, dy[big], 0), rtol=0, atol=1e-30)


@pytest.mark.parametrize("op", [2, 3, 4, 5, 6])
def test_activation_special_values(lib, op):
    """NaN propagates; +-inf give the limits (where the product is not inf * 0)."""
    fn, a, b, uses_out = ACTS[op]
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -np.nan], np.float32)
    y = np.empty_like(x)
    lib.pw_act_fwd(op, P(x), P(y), x.size, a, b)
    assert np.isnan(y[[0, 4]]).all()
    assert y[1] == {2: 1.0, 3: 1.0}.get(op, np.inf)
    if op in (2, 3):
        assert y[2] == {2: 0.0, 3: -1.0}[op]
    np.testing.assert_allclose(y[3], fn(torch.tensor(1.0)).item(), rtol=1e-6)
    dy = np.ones_like(x)
    dx = np.empty_like(x)
    lib.pw_act_bwd(op, P(dy), P(y if uses_out else x), P(dx), x.size, a, b)
    assert np.isnan(dx[[0, 4]]).all() and np.isfinite(dx[3])
    # dy = NaN propagates too
    dy = np.full(3, np.nan, np.float32)
    xs = np.array([0.5, -3.0, 7.0], np.float32)
    ys = np.empty_like(xs)
    lib.pw_act_fwd(op, P(xs), P(ys), xs.size, a, b)
    dx = np.empty_like(xs)
    lib.pw_act_bwd(op, P(dy), P(ys if uses_out else xs), P(dx), xs.size, a, b)
    assert np.isnan(dx).all()


@pytest.mark.parametrize("op", [2, 3, 4, 5, 6])
def test_activation_in_place(lib, rng, op):
    fn, a, b, uses_out = ACTS[op]
    x = rnd(rng, 70_001, scale=4.0)
    y = np.empty_like(x)
    lib.pw_act_fwd(op, P(x), P(y), x.size, a, b)
    z = x.copy()
    lib.pw_act_fwd(op, P(z), P(z), z.size, a, b)
    np.testing.assert_array_equal(z, y)
    dy = rnd(rng, x.size)
    dx = np.empty_like(x)
    s = y if uses_out else x
    lib.pw_act_bwd(op, P(dy), P(s), P(dx), x.size, a, b)
    g = dy.copy()
    lib.pw_act_bwd(op, P(g), P(s), P(g), x.size, a, b)
    np.testing.assert_array_equal(g, dx)
