"""sdpa_fwd/sdpa_bwd (kernels/attention.cpp) with the full SdpaParams: query heads, grouped-query
k/v heads and strided operands ([N, T, H, E] as a projection split into heads leaves them, or
[N, H, T, E]), against PyTorch float64 autograd; limited scratch gives the same bits."""
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


def run(lib, q, k, v, dout, scale, causal, tm, mask=None, scratch_rows=None):
    """q/out [N, H, L, E] and k/v [N, Hk, S, E] (logical), stored as the tm flags say."""
    N, H, L, E = q.shape
    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    store = [np.ascontiguousarray(x.transpose(0, 2, 1, 3) if t else x) for x, t in zip((q, k, v, dout), tm)]
    ms = [0, 0, 0]
    if mask is not None:
        m = np.broadcast_to(mask, (N * H, L, S))
        ms = [s // mask.itemsize for s in m.strides]
    rows = N * H * L if scratch_rows is None else scratch_rows
    kind = 0 if mask is None else 1
    params = sdpa_args(N * H, L, S, E, Ev, ms, scale, causal, kind, H, H // Hk,
                       [_strides(tm[0], H, L, E), _strides(tm[1], Hk, S, E), _strides(tm[2], Hk, S, Ev),
                        _strides(tm[3], H, L, Ev)], rows)
    out = np.full(store[3].shape, np.nan, np.float32)
    probs = np.full((N * H, L, S), np.nan, np.float32)
    lib.shim_sdpa_fwd(P(store[0]), P(store[1]), P(store[2]), P(mask), P(out), P(probs), *params)
    grads = [np.full(x.shape, np.nan, np.float32) for x in store[:3]]
    scratch = np.full(rows * S, np.nan, np.float32)
    lib.shim_sdpa_bwd(P(store[3]), P(store[0]), P(store[1]), P(store[2]), P(probs), *map(P, grads), P(scratch),
                      *params)
    back = lambda x, t: x.transpose(0, 2, 1, 3) if t else x  # noqa: E731
    return back(out, tm[3]), probs, [back(gr, t) for gr, t in zip(grads, tm)]


@pytest.mark.parametrize("tm", [(0, 0, 0, 0), (1, 1, 1, 1), (1, 0, 1, 0)], ids=["head_major", "tmajor", "mixed"])
@pytest.mark.parametrize("case", ["causal", "causal_long", "bool_mask", "causal_rect"])
def test_sdpa_heads_gqa_strided(lib, tm, case):
    rng = np.random.default_rng(7)
    N, H, Hk, L, S, E, Ev = 2, 6, 2, 5, 5, 16, 8
    if case == "causal_long":
        L = S = 70  # several query and key blocks
    if case == "causal_rect":
        L, S = 7, 4
    q, k, v, dout = rnd(rng, N, H, L, E), rnd(rng, N, Hk, S, E), rnd(rng, N, Hk, S, Ev), rnd(rng, N, H, L, Ev)
    mask = None
    if case == "bool_mask":
        mask = (rng.random((L, S)) < 0.6).astype(np.uint8)
        mask[:, 1] = 1
    causal = case != "bool_mask"
    scale = 1.0 / math.sqrt(E)
    out, probs, grads = run(lib, q, k, v, dout, scale, int(causal), tm, mask)
    qt, kt, vt = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    g = H // Hk
    am = None if mask is None else torch.from_numpy(mask).bool()
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1),
                                                           attn_mask=am, is_causal=causal, scale=scale)
    close(out, ref, rtol=1e-4, atol=1e-5)
    ref.backward(torch.from_numpy(dout).double())
    for got, t in zip(grads, (qt, kt, vt)):
        close(got, t.grad, rtol=1e-4, atol=1e-5)
    if case == "causal_long":  # scratch for one group of heads at a time: the same bits
        out2, probs2, grads2 = run(lib, q, k, v, dout, scale, int(causal), tm, mask, scratch_rows=g * L)
        assert np.array_equal(out, out2) and np.array_equal(probs, probs2)
        for a, b in zip(grads, grads2):
            assert np.array_equal(a, b)
