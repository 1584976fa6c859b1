"""LSTM / GRU kernels (kernels/lstm.cpp, kernels/gru.cpp) against torch.nn.LSTM / nn.GRU.

The float32 kernels are compared with a float64 torch reference built from the
same float32 inputs (so the tolerance measures the kernel's own rounding).
Every output buffer and the scratch buffer are pre-filled with NaN (catches
elements never written / scratch read before written) and followed by a guard
region that must stay untouched (catches out-of-bounds writes)."""
import ctypes

import numpy as np
import pytest
import torch

RTOL, ATOL = 1e-4, 2e-5
GUARD = 32
SENTINEL = np.float32(-12345.0)

i64, cint, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p


def _p(a):
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"] and a.dtype == np.float32
    return a.ctypes.data_as(vp)


@pytest.fixture(scope="module")
def lib(shim_builder):
    L = shim_builder("rnn_shim.cpp")  # + shim_lstm_fwd/bwd, shim_gru_fwd/bwd generated from the op records
    L.shim_rnn_set_threads.restype = None
    L.shim_rnn_set_threads.argtypes = [cint]
    L.shim_lstm_bwd_scratch_floats.restype = i64
    L.shim_lstm_bwd_scratch_floats.argtypes = [i64] * 5 + [cint, cint]
    L.shim_gru_bwd_scratch_floats.restype = i64
    L.shim_gru_bwd_scratch_floats.argtypes = [i64] * 4 + [cint]
    return L


@pytest.fixture(scope="module", autouse=True)
def _torch_one_thread():
    # the references are tiny; thread start-up costs more than it saves
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Buffers:
    """Output buffers: NaN-filled, each followed by a guard region."""

    def __init__(self):
        self.raw = []

    def __call__(self, *shape):
        n = int(np.prod(shape))
        raw = np.full(n + GUARD, np.nan, dtype=np.float32)
        raw[n:] = SENTINEL
        self.raw.append((raw, n))
        return raw[:n].reshape(shape)

    def check_guards(self):
        for raw, n in self.raw:
            assert np.all(raw[n:] == SENTINEL), "kernel wrote past the end of a buffer"


def close(got, want, name):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    assert got.shape == want.shape, (name, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def wscale(fan_in):
    # large enough for non-trivial gates, small enough that long sequences stay
    # out of the chaotic regime where float32 rounding is amplified exponentially
    return min(0.4, 1.2 / np.sqrt(fan_in))


def t64(a, grad=False):
    return None if a is None else torch.tensor(a, dtype=torch.float64, requires_grad=grad)


# ============================================================================ LSTM


def lstm_case(B, T, I, H, P, bias, use_h0, use_c0, use_dhn, use_dcn, seed):
    rng = np.random.default_rng(seed)
    proj = P > 0
    P = P if proj else H
    c = dict(B=B, T=T, I=I, H=H, P=P, bias=bias, proj=proj)
    c["x"] = rand(rng, B, T, I)
    c["w_ih"] = rand(rng, 4 * H, I, scale=wscale(I))
    c["w_hh"] = rand(rng, 4 * H, P, scale=wscale(P))
    c["b_ih"] = rand(rng, 4 * H, scale=0.3) if bias else None
    c["b_hh"] = rand(rng, 4 * H, scale=0.3) if bias else None
    c["w_hr"] = rand(rng, P, H, scale=wscale(H)) if proj else None
    c["h0"] = rand(rng, B, P) if use_h0 else None
    c["c0"] = rand(rng, B, H) if use_c0 else None
    c["dy"] = rand(rng, B, T, P)
    c["dhn"] = rand(rng, B, P) if use_dhn else None
    c["dcn"] = rand(rng, B, H) if use_dcn else None
    return c


def lstm_torch(c):
    """float64 torch reference: outputs and every gradient (full width)."""
    H, P, B = c["H"], c["P"], c["B"]
    m = torch.nn.LSTM(c["I"], H, num_layers=1, bias=c["bias"], batch_first=True,
                      proj_size=P if c["proj"] else 0).double()
    with torch.no_grad():
        m.weight_ih_l0.copy_(t64(c["w_ih"]))
        m.weight_hh_l0.copy_(t64(c["w_hh"]))
        if c["bias"]:
            m.bias_ih_l0.copy_(t64(c["b_ih"]))
            m.bias_hh_l0.copy_(t64(c["b_hh"]))
        if c["proj"]:
            m.weight_hr_l0.copy_(t64(c["w_hr"]))
    x = t64(c["x"], True)
    h0 = t64(c["h0"], True) if c["h0"] is not None else torch.zeros(B, P, dtype=torch.float64, requires_grad=True)
    c0 = t64(c["c0"], True) if c["c0"] is not None else torch.zeros(B, H, dtype=torch.float64, requires_grad=True)
    y, (hn, cn) = m(x, (h0.unsqueeze(0), c0.unsqueeze(0)))
    loss = (y * t64(c["dy"])).sum()
    if c["dhn"] is not None:
        loss = loss + (hn[0] * t64(c["dhn"])).sum()
    if c["dcn"] is not None:
        loss = loss + (cn[0] * t64(c["dcn"])).sum()
    loss.backward()
    r = dict(y=y, hn=hn[0], cn=cn[0], dx=x.grad, dh0=h0.grad, dc0=c0.grad,
             dw_ih=m.weight_ih_l0.grad, dw_hh=m.weight_hh_l0.grad)
    if c["bias"]:
        r["db_ih"], r["db_hh"] = m.bias_ih_l0.grad, m.bias_hh_l0.grad
    if c["proj"]:
        r["dw_hr"] = m.weight_hr_l0.grad
    return {k: v.detach().numpy() for k, v in r.items()}


def lstm_saved_ref(c):
    """float64 step-by-step reference of the saved tensors (gates, cells, hraw)."""
    B, T, H, P = c["B"], c["T"], c["H"], c["P"]
    f64 = lambda a: None if a is None else a.astype(np.float64)
    x, w_ih, w_hh, w_hr = f64(c["x"]), f64(c["w_ih"]), f64(c["w_hh"]), f64(c["w_hr"])
    b = f64(c["b_ih"]) + f64(c["b_hh"]) if c["bias"] else 0.0
    h = f64(c["h0"]) if c["h0"] is not None else np.zeros((B, P))
    cc = f64(c["c0"]) if c["c0"] is not None else np.zeros((B, H))
    sig = lambda v: 1 / (1 + np.exp(-v))
    gates, cells, hraw = [], [], []
    for t in range(T):
        g = x[:, t] @ w_ih.T + b + h @ w_hh.T
        i, f, gg, o = sig(g[:, :H]), sig(g[:, H:2 * H]), np.tanh(g[:, 2 * H:3 * H]), sig(g[:, 3 * H:])
        cc = f * cc + i * gg
        r = o * np.tanh(cc)
        h = r @ w_hr.T if c["proj"] else r
        gates.append(np.concatenate([i, f, gg, o], 1))
        cells.append(cc)
        hraw.append(r)
    return np.stack(gates), np.stack(cells), np.stack(hraw)


def lstm_run_fwd(lib, c):
    B, T, I, H, P = c["B"], c["T"], c["I"], c["H"], c["P"]
    buf = Buffers()
    o = dict(y=buf(B, T, P), hn=buf(B, P), cn=buf(B, H), gates=buf(T, B, 4 * H), cells=buf(T, B, H),
             hraw=buf(T, B, H) if c["proj"] else None)
    lib.shim_lstm_fwd(_p(c["x"]), _p(c["h0"]), _p(c["c0"]), _p(c["w_ih"]), _p(c["w_hh"]), _p(c["b_ih"]),
                      _p(c["b_hh"]), _p(c["w_hr"]), _p(o["y"]), _p(o["hn"]), _p(o["cn"]), _p(o["gates"]),
                      _p(o["cells"]), _p(o["hraw"]), B, T, I, H, P, int(c["bias"]), int(c["proj"]))
    buf.check_guards()
    return o


LSTM_GRADS = ("dx", "dh0", "dc0", "dw_ih", "dw_hh", "db_ih", "db_hh", "dw_hr")


def lstm_run_bwd(lib, c, fwd, k_ih, k_hh, k_hr, want=LSTM_GRADS):
    B, T, I, H, P = c["B"], c["T"], c["I"], c["H"], c["P"]
    buf = Buffers()
    shapes = dict(dx=(B, T, I), dh0=(B, P), dc0=(B, H), dw_ih=(4 * H, k_ih), dw_hh=(4 * H, k_hh),
                  db_ih=(4 * H,), db_hh=(4 * H,), dw_hr=(P, k_hr))
    if not c["bias"]:
        want = [w for w in want if w not in ("db_ih", "db_hh")]
    if not c["proj"]:
        want = [w for w in want if w != "dw_hr"]
    g = {k: (buf(*shapes[k]) if k in want else None) for k in LSTM_GRADS}
    n = lib.shim_lstm_bwd_scratch_floats(B, T, I, H, P, int(c["bias"]), int(c["proj"]))
    scratch = buf(n)
    lib.shim_lstm_bwd(_p(c["dy"]), _p(c["dhn"]), _p(c["dcn"]), _p(c["x"]), _p(c["h0"]), _p(c["c0"]),
                      _p(c["w_ih"]), _p(c["w_hh"]), _p(c["w_hr"]), _p(fwd["y"]), _p(fwd["gates"]),
                      _p(fwd["cells"]), _p(fwd["hraw"]), *[_p(g[k]) for k in LSTM_GRADS], _p(scratch),
                      B, T, I, H, P, int(c["bias"]), int(c["proj"]), k_ih, k_hh, k_hr)
    buf.check_guards()
    return {k: v for k, v in g.items() if v is not None}


# (B, T, I, H, P (0 = no proj), bias, h0, c0, dhn, dcn, k_ih, k_hh, k_hr)
LSTM_CASES = [
    (1, 1, 1, 1, 0, True, False, False, False, False, 1, 1, 0),
    (2, 3, 5, 4, 0, True, True, True, True, True, 5, 4, 0),
    (3, 7, 6, 5, 3, True, True, True, True, True, 4, 2, 5),
    (4, 5, 7, 3, 0, False, False, False, False, False, 7, 3, 0),
    (2, 4, 9, 6, 2, False, True, False, True, False, 3, 1, 4),
    (1, 7, 17, 11, 0, True, False, True, False, True, 17, 11, 0),
    (3, 2, 10, 9, 0, True, True, True, False, True, 2, 5, 0),
    (4, 6, 33, 20, 9, True, True, True, True, True, 33, 9, 20),
    (1, 3, 4, 7, 1, True, False, False, True, True, 1, 1, 3),
    (2, 3, 515, 5, 0, True, True, True, True, False, 514, 5, 0),  # wide input: W panels, column tails
    (4, 70, 3, 65, 0, True, True, True, True, True, 3, 64, 0),  # 4H and T*B > 256: depth blocking
    (3, 90, 5, 66, 7, True, True, True, True, True, 5, 7, 65),
    (1, 16, 24, 67, 24, True, False, False, False, False, 24, 24, 67),  # batch 1 (the keyboard LM's shape class)
    (2, 5, 20, 40, 17, True, True, True, True, True, 20, 17, 40),
]


@pytest.mark.parametrize("case", LSTM_CASES, ids=lambda cs: "B{}T{}I{}H{}P{}-b{:d}h{:d}c{:d}dh{:d}dc{:d}".format(*cs[:10]))
def test_lstm_matches_torch(lib, case):
    B, T, I, H, P, bias, uh, uc, udh, udc, k_ih, k_hh, k_hr = case
    c = lstm_case(B, T, I, H, P, bias, uh, uc, udh, udc, seed=hash(case) % 2**32)
    ref = lstm_torch(c)
    fwd = lstm_run_fwd(lib, c)
    for k in ("y", "hn", "cn"):
        close(fwd[k], ref[k], k)
    gates, cells, hraw = lstm_saved_ref(c)
    close(fwd["gates"], gates, "saved gates")
    close(fwd["cells"], cells, "saved cells")
    if c["proj"]:
        close(fwd["hraw"], hraw, "saved hraw")

    got = lstm_run_bwd(lib, c, fwd, k_ih, k_hh, k_hr)
    close(got["dx"], ref["dx"], "dx")
    close(got["dh0"], ref["dh0"], "dh0")
    close(got["dc0"], ref["dc0"], "dc0")
    close(got["dw_ih"], np.ascontiguousarray(ref["dw_ih"][:, :k_ih]), "dw_ih")
    close(got["dw_hh"], np.ascontiguousarray(ref["dw_hh"][:, :k_hh]), "dw_hh")
    if bias:
        close(got["db_ih"], ref["db_ih"], "db_ih")
        close(got["db_hh"], ref["db_hh"], "db_hh")
    if c["proj"]:
        close(got["dw_hr"], np.ascontiguousarray(ref["dw_hr"][:, :k_hr]), "dw_hr")
    assert np.abs(got["dw_ih"]).max() > 1e-3  # not trivially zero


def two_threads_agree(lib, fwd, bwd, keys):
    """fwd() and bwd(its outputs) on one thread and on a 2-thread pool agree (forward `keys` and every
    gradient); returns the 2-thread forward outputs and gradients."""
    one = fwd()
    g1 = bwd(one)
    lib.shim_rnn_set_threads(2)
    try:
        two = fwd()
        g2 = bwd(two)
    finally:
        lib.shim_rnn_set_threads(0)
    for k in keys:
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for k, v in g1.items():
        np.testing.assert_allclose(g2[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    return two, g2


@pytest.mark.parametrize("case", [LSTM_CASES[i] for i in (0, 2, 5, 8, 12, 13)] + [
    # large enough that each step really splits into several chunks (>= 2^15 weights each)
    (1, 5, 16, 300, 64, True, True, True, True, True, 16, 64, 300),
    (1, 4, 8, 200, 0, True, False, True, True, False, 8, 200, 0),
    (2, 3, 8, 150, 40, False, True, False, False, True, 8, 40, 150)],
                         ids=lambda cs: "B{}T{}I{}H{}P{}".format(*cs[:5]))
def test_lstm_two_threads_split_steps(lib, case):
    """On a pool of 2 threads, small batches split every step's GEMVs and cells over the
    threads (lstm.cpp's per-step split): the same values as on one thread (each output's
    arithmetic is the unsplit one's), up to the GEMV kernel's order of summation."""
    B, T, I, H, P, bias, uh, uc, udh, udc, k_ih, k_hh, k_hr = case
    c = lstm_case(B, T, I, H, P, bias, uh, uc, udh, udc, seed=hash(case) % 2**32)
    two, g2 = two_threads_agree(lib, lambda: lstm_run_fwd(lib, c),
                                lambda f: lstm_run_bwd(lib, c, f, k_ih, k_hh, k_hr), ("y", "hn", "cn", "gates", "cells"))
    ref = lstm_torch(c)
    close(two["y"], ref["y"], "y")
    close(g2["dx"], ref["dx"], "dx")


@pytest.mark.parametrize("proj", [False, True])
@pytest.mark.parametrize("want", [(), ("dx",), ("dh0", "dc0"), ("dw_ih",), ("dw_hh", "db_hh"), ("db_ih",),
                                  ("dw_hr",), ("dx", "dw_hr", "dc0")])
def test_lstm_nullable_grads(lib, proj, want):
    """Asking for a subset of the gradients gives exactly the same values."""
    c = lstm_case(3, 4, 6, 5, 3 if proj else 0, True, True, True, True, True, seed=7)
    fwd = lstm_run_fwd(lib, c)
    full = lstm_run_bwd(lib, c, fwd, 4, 2, 3)
    part = lstm_run_bwd(lib, c, fwd, 4, 2, 3, want=want)
    assert set(part) == {w for w in want if proj or w != "dw_hr"}
    for k, v in part.items():
        np.testing.assert_array_equal(v, full[k], err_msg=k)


def test_lstm_scratch_size(lib):
    # dG[T,B,4H] | dc[B,H] | proj: dh[T,B,P] dr[B,H]  /  no proj: dh[B,P]
    assert lib.shim_lstm_bwd_scratch_floats(3, 5, 7, 4, 4, 1, 0) == 5 * 3 * 16 + 3 * 4 + 3 * 4
    assert lib.shim_lstm_bwd_scratch_floats(3, 5, 7, 4, 2, 1, 1) == 5 * 3 * 16 + 3 * 4 + 5 * 3 * 2 + 3 * 4


# ============================================================================ GRU


def gru_case(B, T, I, H, bias, use_h0, use_dhn, seed):
    rng = np.random.default_rng(seed)
    c = dict(B=B, T=T, I=I, H=H, bias=bias)
    c["x"] = rand(rng, B, T, I)
    c["w_ih"] = rand(rng, 3 * H, I, scale=wscale(I))
    c["w_hh"] = rand(rng, 3 * H, H, scale=wscale(H))
    c["b_ih"] = rand(rng, 3 * H, scale=0.3) if bias else None
    c["b_hh"] = rand(rng, 3 * H, scale=0.3) if bias else None
    c["h0"] = rand(rng, B, H) if use_h0 else None
    c["dy"] = rand(rng, B, T, H)
    c["dhn"] = rand(rng, B, H) if use_dhn else None
    return c


def gru_torch(c):
    B, H = c["B"], c["H"]
    m = torch.nn.GRU(c["I"], H, num_layers=1, bias=c["bias"], batch_first=True).double()
    with torch.no_grad():
        m.weight_ih_l0.copy_(t64(c["w_ih"]))
        m.weight_hh_l0.copy_(t64(c["w_hh"]))
        if c["bias"]:
            m.bias_ih_l0.copy_(t64(c["b_ih"]))
            m.bias_hh_l0.copy_(t64(c["b_hh"]))
    x = t64(c["x"], True)
    h0 = t64(c["h0"], True) if c["h0"] is not None else torch.zeros(B, H, dtype=torch.float64, requires_grad=True)
    y, hn = m(x, h0.unsqueeze(0))
    loss = (y * t64(c["dy"])).sum()
    if c["dhn"] is not None:
        loss = loss + (hn[0] * t64(c["dhn"])).sum()
    loss.backward()
    r = dict(y=y, hn=hn[0], dx=x.grad, dh0=h0.grad, dw_ih=m.weight_ih_l0.grad, dw_hh=m.weight_hh_l0.grad)
    if c["bias"]:
        r["db_ih"], r["db_hh"] = m.bias_ih_l0.grad, m.bias_hh_l0.grad
    return {k: v.detach().numpy() for k, v in r.items()}


def gru_saved_ref(c):
    """float64 reference of saved[T,B,4H] = (r, z, n, W_hn h + b_hn)."""
    B, T, H = c["B"], c["T"], c["H"]
    x, w_ih, w_hh = (c[k].astype(np.float64) for k in ("x", "w_ih", "w_hh"))
    b_ih = c["b_ih"].astype(np.float64) if c["bias"] else np.zeros(3 * H)
    b_hh = c["b_hh"].astype(np.float64) if c["bias"] else np.zeros(3 * H)
    h = c["h0"].astype(np.float64) if c["h0"] is not None else np.zeros((B, H))
    sig = lambda v: 1 / (1 + np.exp(-v))
    out = []
    for t in range(T):
        gi = x[:, t] @ w_ih.T + b_ih
        gh = h @ w_hh.T + b_hh
        r = sig(gi[:, :H] + gh[:, :H])
        z = sig(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1 - z) * n + z * h
        out.append(np.concatenate([r, z, n, gh[:, 2 * H:]], 1))
    return np.stack(out)


def gru_run_fwd(lib, c):
    B, T, I, H = c["B"], c["T"], c["I"], c["H"]
    buf = Buffers()
    o = dict(y=buf(B, T, H), hn=buf(B, H), saved=buf(T, B, 4 * H))
    lib.shim_gru_fwd(_p(c["x"]), _p(c["h0"]), _p(c["w_ih"]), _p(c["w_hh"]), _p(c["b_ih"]), _p(c["b_hh"]),
                     _p(o["y"]), _p(o["hn"]), _p(o["saved"]), B, T, I, H, int(c["bias"]))
    buf.check_guards()
    return o


GRU_GRADS = ("dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")


def gru_run_bwd(lib, c, fwd, k_ih, k_hh, want=GRU_GRADS):
    B, T, I, H = c["B"], c["T"], c["I"], c["H"]
    buf = Buffers()
    shapes = dict(dx=(B, T, I), dh0=(B, H), dw_ih=(3 * H, k_ih), dw_hh=(3 * H, k_hh), db_ih=(3 * H,),
                  db_hh=(3 * H,))
    if not c["bias"]:
        want = [w for w in want if w not in ("db_ih", "db_hh")]
    g = {k: (buf(*shapes[k]) if k in want else None) for k in GRU_GRADS}
    scratch = buf(lib.shim_gru_bwd_scratch_floats(B, T, I, H, int(c["bias"])))
    lib.shim_gru_bwd(_p(c["dy"]), _p(c["dhn"]), _p(c["x"]), _p(c["h0"]), _p(c["w_ih"]), _p(c["w_hh"]),
                     _p(fwd["y"]), _p(fwd["saved"]), *[_p(g[k]) for k in GRU_GRADS], _p(scratch),
                     B, T, I, H, int(c["bias"]), k_ih, k_hh)
    buf.check_guards()
    return {k: v for k, v in g.items() if v is not None}


# (B, T, I, H, bias, h0, dhn, k_ih, k_hh)
GRU_CASES = [
    (1, 1, 1, 1, True, False, False, 1, 1),
    (2, 3, 5, 4, True, True, True, 5, 4),
    (3, 7, 6, 5, True, True, False, 4, 2),
    (4, 5, 7, 3, False, False, False, 7, 3),
    (2, 4, 9, 6, False, True, True, 3, 1),
    (1, 7, 17, 11, True, False, True, 17, 11),
    (4, 6, 33, 20, True, True, True, 20, 19),
    (3, 2, 10, 9, True, False, False, 2, 9),
    (2, 3, 515, 5, True, True, True, 513, 5),  # wide input: W panels, column tails
    (4, 65, 4, 86, True, True, True, 4, 85),  # 3H and T*B > 256: depth blocking
]


@pytest.mark.parametrize("case", GRU_CASES, ids=lambda cs: "B{}T{}I{}H{}-b{:d}h{:d}dh{:d}".format(*cs[:7]))
def test_gru_matches_torch(lib, case):
    B, T, I, H, bias, uh, udh, k_ih, k_hh = case
    c = gru_case(B, T, I, H, bias, uh, udh, seed=hash(case) % 2**32)
    ref = gru_torch(c)
    fwd = gru_run_fwd(lib, c)
    close(fwd["y"], ref["y"], "y")
    close(fwd["hn"], ref["hn"], "hn")
    close(fwd["saved"], gru_saved_ref(c), "saved")

    got = gru_run_bwd(lib, c, fwd, k_ih, k_hh)
    close(got["dx"], ref["dx"], "dx")
    close(got["dh0"], ref["dh0"], "dh0")
    close(got["dw_ih"], np.ascontiguousarray(ref["dw_ih"][:, :k_ih]), "dw_ih")
    close(got["dw_hh"], np.ascontiguousarray(ref["dw_hh"][:, :k_hh]), "dw_hh")
    if bias:
        close(got["db_ih"], ref["db_ih"], "db_ih")
        close(got["db_hh"], ref["db_hh"], "db_hh")
        assert not np.allclose(got["db_ih"], got["db_hh"])  # b_hn sits inside r*(...)
    assert np.abs(got["dw_ih"]).max() > 1e-3


@pytest.mark.parametrize("case", [GRU_CASES[i] for i in (0, 1, 2)] + [
    # each step really splits into several chunks (>= 2^15 weights each)
    (1, 5, 16, 200, True, True, True, 16, 200),
    (2, 3, 8, 130, False, False, True, 8, 100)], ids=lambda cs: "B{}T{}I{}H{}".format(*cs[:4]))
def test_gru_two_threads_split_steps(lib, case):
    """On a pool of 2 threads, small batches split every step's GEMVs and cells over the
    threads (gru.cpp's per-step split): the same values as on one thread, up to the GEMV
    kernel's order of summation, and torch's."""
    B, T, I, H, bias, uh, udh, k_ih, k_hh = case
    c = gru_case(B, T, I, H, bias, uh, udh, seed=hash(case) % 2**32)
    two, g2 = two_threads_agree(lib, lambda: gru_run_fwd(lib, c), lambda f: gru_run_bwd(lib, c, f, k_ih, k_hh),
                                ("y", "hn", "saved"))
    ref = gru_torch(c)
    close(two["y"], ref["y"], "y")
    close(g2["dx"], ref["dx"], "dx")


@pytest.mark.parametrize("want", [(), ("dx",), ("dh0",), ("dw_ih",), ("dw_hh", "db_hh"), ("db_ih",),
                                  ("dx", "dw_hh")])
def test_gru_nullable_grads(lib, want):
    c = gru_case(3, 4, 6, 5, True, True, True, seed=11)
    fwd = gru_run_fwd(lib, c)
    full = gru_run_bwd(lib, c, fwd, 4, 3)
    part = gru_run_bwd(lib, c, fwd, 4, 3, want=want)
    assert set(part) == set(want)
    for k, v in part.items():
        np.testing.assert_array_equal(v, full[k], err_msg=k)


def test_gru_scratch_size(lib):
    # dG[T,B,4H] | dh[B,H]
    assert lib.shim_gru_bwd_scratch_floats(3, 5, 7, 4, 1) == 5 * 3 * 16 + 3 * 4
