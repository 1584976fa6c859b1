"""sdpa_fwd/sdpa_bwd (kernels/attention.cpp, flash-style: the forward saves out and each row's
log-sum-exp, the backward recomputes the probabilities block by block) with the full SdpaParams:
query heads, grouped-query k/v heads, strided operands ([N, T, H, E] as a projection split into
heads leaves them, or [N, H, T, E]), causal, bool (padding) and float masks, lengths that are not
multiples of the kernel's blocks; against PyTorch float64 autograd."""
import math

import numpy as np
import pytest
import torch

from pointwise_lib import P, close, load, rnd, sdpa_args


@pytest.fixture(scope="module")
def lib(shim_builder):
    return load(shim_builder)


def _strides(tmajor, H, T, E):
    return [T * H * E, E, H * E] if tmajor else [H * T * E, T * E, E]


def run(lib, q, k, v, dout, scale, causal, tm, mask=None, kind=1):
    """q/out [N, H, L, E] and k/v [N, Hk, S, E] (logical), stored as the tm flags say; mask
    broadcast to [N, H, L, S] (kind 1 bool, 2 float)."""
    N, H, L, E = q.shape
    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    store = [np.ascontiguousarray(x.transpose(0, 2, 1, 3) if t else x) for x, t in zip((q, k, v, dout), tm)]
    ms = [0, 0, 0]
    if mask is not None:
        m = np.broadcast_to(mask, (N, H, L, S))
        assert m.strides[0] == H * m.strides[1]  # one stride walks (batch, head)
        ms = [s // mask.itemsize for s in m.strides[1:]]
    params = sdpa_args(N * H, L, S, E, Ev, ms, scale, causal, 0 if mask is None else kind, H, H // Hk,
                       [_strides(tm[0], H, L, E), _strides(tm[1], Hk, S, E), _strides(tm[2], Hk, S, Ev),
                        _strides(tm[3], H, L, Ev)])
    out = np.full(store[3].shape, np.nan, np.float32)
    lse = np.full((N * H, L), np.nan, np.float32)
    lib.shim_sdpa_fwd(P(store[0]), P(store[1]), P(store[2]), P(mask), P(out), P(lse), *params)
    grads = [np.full(x.shape, np.nan, np.float32) for x in store[:3]]
    scratch = np.full(N * H * S * (E + Ev), np.nan, np.float32) if Hk != H else None
    lib.shim_sdpa_bwd(P(store[3]), P(store[0]), P(store[1]), P(store[2]), P(out), P(lse), P(mask), *map(P, grads),
                      P(scratch), *params)
    back = lambda x, t: x.transpose(0, 2, 1, 3) if t else x  # noqa: E731
    return back(out, tm[3]), lse.reshape(N, H, L), [back(gr, t) for gr, t in zip(grads, tm)]


def reference(q, k, v, dout, scale, causal, mask, kind):
    """float64 torch autograd: out, lse, dq, dk, dv (k/v heads repeated for the group)."""
    qt, kt, vt = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kr, vr = kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1)
    s = scale * qt @ kr.transpose(-1, -2)
    L, S = s.shape[-2:]
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        m = torch.from_numpy(mask)
        s = s.masked_fill(~m.bool(), -math.inf) if kind == 1 else s + m.double()
    full = (s == -math.inf).all(-1, keepdim=True)  # fully masked rows: zeros (PyTorch would give NaN)
    out = (torch.softmax(s.masked_fill(full, 0.0), -1) * ~full) @ vr
    lse = torch.logsumexp(s, -1)
    out.backward(torch.from_numpy(dout).double())
    return out, lse, (qt.grad, kt.grad, vt.grad)


CASES = {  # N, H, Hk, L, S, E, Ev, causal, mask
    "causal": (2, 6, 2, 5, 5, 16, 8, True, None),
    "causal_long": (2, 6, 2, 70, 70, 16, 8, True, None),  # several query and key blocks
    "causal_rect": (2, 6, 2, 7, 4, 16, 8, True, None),
    "bool_mask": (2, 6, 2, 5, 5, 16, 8, False, "bool"),
    "causal_100_gqa3": (1, 9, 3, 100, 100, 64, 64, True, None),  # SmolLM2's heads, T not a block multiple
    "padding_130": (2, 4, 4, 130, 130, 32, 32, True, "padding"),  # causal + key padding, the HF form
    "float_mask_gqa": (2, 4, 1, 67, 93, 24, 16, False, "float"),  # multi-query, an additive [N, H, L, S] mask
}


def _mask(rng, N, H, L, S, which):
    if which == "bool":
        m = (rng.random((L, S)) < 0.6).astype(np.uint8)
        m[:, 1] = 1
        return m, 1
    if which == "padding":  # [N, H, 1, S]: the second sequence has its last 29 keys padded
        m = np.ones((N, H, 1, S), np.uint8)
        m[1, ..., S - 29:] = 0
        return m, 1
    m = rnd(rng, N, H, L, S)
    m[0, 1, 3, :] = -np.inf  # a fully masked row: out = 0, lse = +inf, no gradient
    return m, 2


@pytest.mark.parametrize("tm", [(0, 0, 0, 0), (1, 1, 1, 1), (1, 0, 1, 0)], ids=["head_major", "tmajor", "mixed"])
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_heads_gqa_strided(lib, tm, case):
    rng = np.random.default_rng(7)
    N, H, Hk, L, S, E, Ev, causal, which = CASES[case]
    q, k, v, dout = rnd(rng, N, H, L, E), rnd(rng, N, Hk, S, E), rnd(rng, N, Hk, S, Ev), rnd(rng, N, H, L, Ev)
    mask, kind = _mask(rng, N, H, L, S, which) if which else (None, 0)
    scale = 1.0 / math.sqrt(E)
    out, lse, grads = run(lib, q, k, v, dout, scale, int(causal), tm, mask, kind)
    ref, rlse, rgrads = reference(q, k, v, dout, scale, causal, mask, kind)
    full = torch.isinf(rlse)  # fully masked rows: the kernel gives zeros (PyTorch NaN) and lse +inf
    close(out, ref, rtol=1e-4, atol=1e-5)
    assert np.all(np.isposinf(lse[full.numpy()]))
    close(np.where(full.numpy(), 0, lse), torch.where(full, 0.0, rlse), rtol=1e-5, atol=1e-5)
    for got, r in zip(grads, rgrads):
        close(got, r, rtol=1e-4, atol=1e-5)
