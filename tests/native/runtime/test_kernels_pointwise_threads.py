"""The threaded pointwise kernels: bit-identical results for any thread count, and
their large-input paths against torch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pointwise_lib import ACTS, UNARY, I, P, bview, close, load, rnd, run_reduce, sdpa_args


@pytest.fixture(scope="module")
def lib(shim_builder):
    return load(shim_builder)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------ threads: bit-identical for any thread count
def _thread_cases(rng):
    """(name, fn(lib) -> list of output arrays) for every threaded pointwise kernel, sized to be split."""
    cases = []
    n = 300_007  # several chunks, an unaligned tail
    x = rnd(rng, n, scale=4.0)
    dy = rnd(rng, n)
    xp = np.abs(x) + 0.1
    for op in sorted(ACTS):
        def act(lib, op=op):
            a, b = ACTS[op][1], ACTS[op][2]
            y, dx = np.empty_like(x), np.empty_like(x)
            lib.pw_act_fwd(op, P(x), P(y), n, a, b)
            lib.pw_act_bwd(op, P(dy), P(y if ACTS[op][3] else x), P(dx), n, a, b)
            return [y, dx]
        cases.append((f"act{op}", act))
    for op in range(len(UNARY)):
        def un(lib, op=op):
            y = np.empty_like(x)
            lib.pw_unary(op, P(xp if UNARY[op][1] else x), P(y), n)
            return [y]
        cases.append((f"unary{op}", un))

    def scal(lib):
        outs = []
        for op, c in enumerate([1.5, -0.75, 2.5, 1.7]):
            y = np.empty_like(x)
            lib.pw_scalar(op, P(xp), P(y), n, c)
            outs.append(y)
        dx = np.empty_like(x)
        lib.pw_pow_bwd(P(dy), P(xp), P(dx), n, 1.7)
        return outs + [dx]
    cases.append(("scalar", scal))

    def binary(lib):
        outs = []
        for sa_shape, sb_shape in [((600, 500), (600, 500)), ((600, 500), (500,)), ((600, 500), (600, 1)),
                                   ((1, n), (1,)), ((7, 1, 300), (1, 400, 300))]:
            a, b = rnd(rng, *sa_shape), rnd(rng, *sb_shape) + 3.0
            out_shape = np.broadcast_shapes(a.shape, b.shape)
            (pa, sa), (pb, sb) = bview(a, out_shape), bview(b, out_shape)
            for op in range(4):
                out = np.empty(out_shape, np.float32)
                lib.pw_binary(op, pa, pb, P(out), len(out_shape), P(I(out_shape)), P(sa), P(sb))
                outs.append(out)
            c = np.asarray(rng.random(out_shape) < 0.5).astype(np.uint8)
            out = np.empty(out_shape, np.float32)
            pc, sc = bview(c, out_shape)
            lib.pw_where(pc, pa, pb, P(out), len(out_shape), P(I(out_shape)), P(sc), P(sa), P(sb))
            outs.append(out)
        return outs
    cases.append(("binary", binary))

    def reduce(lib):
        outs = []
        for shape, dims in [((n,), [0]), ((3, 200_000), [1]), ((200_000, 3), [0]), ((400, 300, 4), [0, 2]),
                            ((2, 3000, 70), [1]), ((1000, 600), [0]), ((1000, 600), [1]), ((50, 40, 30, 20), [1, 3])]:
            xx = rnd(rng, *shape)
            outs.append(run_reduce(lib, xx, dims, 0.5))
        return outs
    cases.append(("reduce", reduce))

    def softmax(lib):
        outs = []
        for shape, (outer, d, inner) in [((400, 3000), (400, 3000, 1)), ((8, 300, 200), (8, 300, 200))]:
            xx, g = rnd(rng, *shape, scale=5.0), rnd(rng, *shape)
            for log in (0, 1):
                y, dx = np.empty_like(xx), np.empty_like(xx)
                lib.pw_softmax(log, 0, P(xx), None, P(y), outer, d, inner)
                lib.pw_softmax(log, 1, P(g), P(y), P(dx), outer, d, inner)
                outs += [y, dx]
        return outs
    cases.append(("softmax", softmax))

    def losses(lib):
        N, C = 700, 1000
        logits = rnd(rng, N, C, scale=4.0)
        t = rng.integers(0, C, N).astype(np.int64)
        t[::7] = -100
        outs = []
        for ls in (0.0, 0.2):
            loss, d = np.zeros(1, np.float32), np.empty_like(logits)
            lib.pw_ce_fwd(P(logits), P(t), P(loss), N, C, -100, ls)
            lib.pw_ce_bwd(P(np.array([0.7], np.float32)), P(logits), P(t), P(d), N, C, -100, ls)
            outs += [loss, d]
        a, b = rnd(rng, n), rnd(rng, n)
        loss, da, db = np.zeros(1, np.float32), np.empty_like(a), np.empty_like(b)
        lib.pw_mse_fwd(P(a), P(b), P(loss), n)
        lib.pw_mse_bwd(P(np.array([1.3], np.float32)), P(a), P(b), P(da), P(db), n)
        return outs + [loss, da, db]
    cases.append(("losses", losses))

    def sdpa(lib):
        outs = []
        for B, L, S, E, causal in [(6, 3, 40, 32, 0), (8, 16, 24, 16, 1), (5, 1, 50, 64, 0), (2, 70, 70, 40, 1),
                                   (3, 100, 130, 24, 0)]:
            q, k, v, g = rnd(rng, B, L, E), rnd(rng, B, S, E), rnd(rng, B, S, E), rnd(rng, B, L, E)
            out, lse = np.empty((B, L, E), np.float32), np.empty((B, L), np.float32)
            params = sdpa_args(B, L, S, E, E, (0, 0, 0), 0.3, causal, 0)
            lib.shim_sdpa_fwd(P(q), P(k), P(v), None, P(out), P(lse), *params)
            dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
            lib.shim_sdpa_bwd(P(g), P(q), P(k), P(v), P(out), P(lse), None, P(dq), P(dk), P(dv), None, *params)
            outs += [out, lse, dq, dk, dv]
        return outs
    cases.append(("sdpa", sdpa))

    def dropout(lib):
        y, m, dx = np.empty_like(x), np.empty(n, np.uint8), np.empty_like(x)
        lib.pw_dropout_fwd(P(x), P(y), P(m), n, 0.3, 77)
        lib.pw_dropout_bwd(P(dy), P(m), P(dx), n, 0.3)
        f = np.empty(n, np.float32)
        lib.pw_fill(0, P(f), n, 2.5, 0)
        return [y, m, dx, f]
    cases.append(("dropout_fill", dropout))

    def optim(lib):
        outs = []
        for outer, inner, stride in [(1, n, n), (300, 700, 900)]:
            size = outer * inner
            g = rnd(rng, size)
            w0, m0, v0 = rnd(rng, outer * stride), rnd(rng, size), np.abs(rnd(rng, size))
            w, m, v = w0.copy(), m0.copy(), v0.copy()
            lib.pw_adamw(P(w), P(g), P(m), P(v), outer, inner, stride, 1e-2, 0.9, 0.999, 1e-8, 0.1, 3)
            outs += [w, m, v]
            for nesterov, first in [(0, 1), (1, 0), (0, 0)]:
                w, buf = w0.copy(), m0.copy()
                lib.pw_sgd(P(w), P(g), P(buf), outer, inner, stride, 0.1, 0.9, 0.1, 0.01, nesterov, first)
                outs += [w, buf]
        return outs
    cases.append(("optim", optim))

    def layer_norm(lib):
        outs = []
        for rows, cols in [(700, 300), (40, 5000)]:
            xx, w, b, g = rnd(rng, rows, cols), rnd(rng, cols), rnd(rng, cols), rnd(rng, rows, cols)
            y, mean, rstd = np.empty_like(xx), np.empty(rows, np.float32), np.empty(rows, np.float32)
            lib.pw_layer_norm_fwd(P(xx), P(w), P(b), P(y), P(mean), P(rstd), rows, cols, 1e-5)
            dx, dw, db = np.empty_like(xx), np.empty_like(w), np.empty_like(b)
            lib.pw_layer_norm_bwd(P(g), P(xx), P(mean), P(rstd), P(w), P(dx), P(dw), P(db), rows, cols)
            outs += [y, mean, rstd, dx, dw, db]
        return outs
    cases.append(("layer_norm", layer_norm))

    def rms_norm(lib):
        outs = []
        for rows, cols in [(700, 300), (40, 5000)]:
            xx, w, g = rnd(rng, rows, cols), rnd(rng, cols), rnd(rng, rows, cols)
            y, rstd = np.empty_like(xx), np.empty(rows, np.float32)
            lib.pw_rms_norm_fwd(P(xx), P(w), P(y), P(rstd), rows, cols, 1e-6)
            dx, dw = np.empty_like(xx), np.empty_like(w)
            lib.pw_rms_norm_bwd(P(g), P(xx), P(rstd), P(w), P(dx), P(dw), rows, cols)
            outs += [y, rstd, dx, dw]
        return outs
    cases.append(("rms_norm", rms_norm))

    def bias_bwd(lib):
        outs = []
        for rows, cols in [(700, 300), (37, 5003)]:
            g, db = rnd(rng, rows, cols), np.empty(cols, np.float32)
            lib.pw_bias_bwd(P(g), P(db), rows, cols)
            outs.append(db)
        return outs
    cases.append(("bias_bwd", bias_bwd))
    return cases


@pytest.mark.parametrize("case", range(len(_thread_cases(np.random.default_rng(0)))))
def test_threads_bit_identical(lib, case):
    """Every threaded pointwise kernel gives the same bits with 1, 2 and 3 threads."""
    results = {}
    try:
        for threads in (1, 2, 3):
            name, fn = _thread_cases(np.random.default_rng(0))[case]  # fresh rng: the same inputs
            lib.pw_use_threads(threads)
            assert lib.pw_num_threads() == threads
            results[threads] = fn(lib)
    finally:
        lib.pw_use_threads(1)
    for threads in (2, 3):
        for i, (a, b) in enumerate(zip(results[1], results[threads])):
            assert a.tobytes() == b.tobytes(), f"{name}: output {i} differs with {threads} threads"


def test_threaded_kernels_match_torch(lib, rng):
    """Spot checks of the threaded paths (large inputs, 2 threads) against torch."""
    lib.pw_use_threads(2)
    try:
        N, C = 700, 1000
        logits = rnd(rng, N, C, scale=4.0)
        t = rng.integers(0, C, N).astype(np.int64)
        loss = np.zeros(1, np.float32)
        lib.pw_ce_fwd(P(logits), P(t), P(loss), N, C, -100, 0.1)
        lt = torch.from_numpy(logits).double().requires_grad_()
        want = F.cross_entropy(lt, torch.from_numpy(t), label_smoothing=0.1)
        close(loss[0], want, rtol=1e-6)
        want.backward()
        d = np.empty_like(logits)
        lib.pw_ce_bwd(P(np.array([1.0], np.float32)), P(logits), P(t), P(d), N, C, -100, 0.1)
        close(d, lt.grad, rtol=1e-5, atol=1e-9)
        x = (rng.random(3_000_001) + 1000.0).astype(np.float32)
        got = run_reduce(lib, x, [0])
        np.testing.assert_allclose(got[0], x.astype(np.float64).sum(), rtol=1e-7)
        x = rnd(rng, 400, 3000, scale=5.0)
        y = np.empty_like(x)
        lib.pw_softmax(0, 0, P(x), None, P(y), 400, 3000, 1)
        close(y, torch.softmax(torch.from_numpy(x).double(), 1), rtol=1e-5, atol=1e-7)
    finally:
        lib.pw_use_threads(1)
