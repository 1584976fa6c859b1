"""Sparse FedAvg (pockengine/federated/sparse.py) against a NumPy reference written per scalar."""
import math

import numpy as np
import pytest

import pockengine as pe
from pockengine.federated import sparse
from pockengine.federated.sparse import Element

SHAPES = {"a.weight": (4, 6), "a.bias": (4,), "b.weight": (3, 5, 2), "frozen.weight": (2, 3)}


def global_params(seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def upload(elements, seed, n):
    rng = np.random.default_rng(seed)
    return elements, [rng.standard_normal(e.shape(SHAPES[e.name])).astype(np.float32) for e in elements], n


# three phones with different schemes: whole tensors, slices of 2 and 4 input channels, one skips a.bias
UPLOADS = [upload([Element("a.weight", 2), Element("a.bias"), Element("b.weight", 3)], 1, 100),
           upload([Element("a.weight", 4), Element("b.weight")], 2, 30),
           upload([Element("a.weight"), Element("a.bias"), Element("b.weight", 1)], 3, 7)]


def reference(g, uploads):
    """Per scalar: sum(w_i * x_i) / sum(w_i) over the clients whose upload covers it, in order."""
    out = {}
    for name, value in g.items():
        new = value.copy()
        for idx in np.ndindex(value.shape):
            num = den = 0.0
            for elements, arrays, w in uploads:
                for e, a in zip(elements, arrays):
                    if e.name == name and (e.k is None or idx[1] < e.k):
                        num += float(w) * float(a[idx])
                        den += float(w)
            if den > 0:
                new[idx] = np.float32(num / den)
        out[name] = new
    return out


def test_fedavg_matches_numpy_reference_per_scalar_with_slices():
    g = global_params()
    got = sparse.aggregate(g, UPLOADS)
    want = reference(g, UPLOADS)
    for name in SHAPES:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # scalars nobody trained are bit-identical: the frozen tensor, a.weight is covered by client 3 in full
    assert got["frozen.weight"].tobytes() == g["frozen.weight"].tobytes()
    only_first = sparse.aggregate(g, UPLOADS[:1])
    assert only_first["a.weight"][:, 2:].tobytes() == g["a.weight"][:, 2:].tobytes()
    assert only_first["b.weight"][:, 3:].tobytes() == g["b.weight"][:, 3:].tobytes()
    np.testing.assert_array_equal(only_first["a.weight"][:, :2], UPLOADS[0][1][0])   # one contributor: its values


def test_dp_fedavg_clips_each_update_and_uses_a_fixed_denominator():
    g = global_params()
    clip, m = 0.5, 4
    got = sparse.aggregate(g, UPLOADS, clip=clip, noise_multiplier=0.0, expected_clients=m)
    acc = {n: np.zeros(s) for n, s in SHAPES.items()}
    for elements, arrays, _ in UPLOADS:
        deltas = [a.astype(np.float64) - g[e.name][e.index()] for e, a in zip(elements, arrays)]
        norm = math.sqrt(sum(float((d ** 2).sum()) for d in deltas))
        assert norm > clip
        for e, d in zip(elements, deltas):
            acc[e.name][e.index()] += d * (clip / norm)
    for name in ("a.weight", "a.bias", "b.weight"):
        np.testing.assert_allclose(got[name], g[name] + acc[name] / m, rtol=1e-6, atol=1e-7)
    assert got["frozen.weight"].tobytes() == g["frozen.weight"].tobytes()
    # one user moves the result by at most clip / m in L2 (the sensitivity the accountant assumes)
    without = sparse.aggregate(g, UPLOADS[1:], clip=clip, expected_clients=m)
    diff = math.sqrt(sum(float(((got[n].astype(np.float64) - without[n]) ** 2).sum()) for n in SHAPES))
    assert diff <= clip / m * (1 + 1e-5)


def test_dp_noise_has_the_stated_scale_and_spares_untrained_scalars():
    g = {"w": np.zeros((200, 100), np.float32), "frozen": np.ones((3,), np.float32)}
    ups = [([Element("w", 50)], [np.zeros((200, 50), np.float32)], 1)]
    got = sparse.aggregate(g, ups, clip=1.0, noise_multiplier=2.0, expected_clients=4,
                           rng=np.random.default_rng(0))
    assert abs(got["w"][:, :50].std() - 2.0 * 1.0 / 4) < 0.02
    assert not got["w"][:, 50:].any() and got["frozen"].tobytes() == g["frozen"].tobytes()


def test_bad_payloads_raise_pock_error():
    g = global_params()
    with pytest.raises(pe.PockError, match="shape"):
        sparse.aggregate(g, [([Element("a.weight", 2)], [np.zeros((4, 3), np.float32)], 1)])
    with pytest.raises(pe.PockError, match="unknown parameter"):
        sparse.aggregate(g, [([Element("nope")], [np.zeros(3, np.float32)], 1)])
    with pytest.raises(pe.PockError, match="2 arrays for 1 elements"):
        sparse.aggregate(g, [([Element("a.bias")], [np.zeros(4), np.zeros(4)], 1)])
    with pytest.raises(pe.PockError, match="positive count"):
        sparse.aggregate(g, [([Element("a.bias")], [np.zeros(4, np.float32)], 0)])
    with pytest.raises(pe.PockError, match="malformed"):
        sparse.decode_scheme("{not json")


def test_scheme_elements_follow_the_update_semantics():
    shapes = {"emb.weight": (10, 4), "out.weight": (10, 7), "out.bias": (10,)}
    els = sparse.scheme_elements(shapes, {"out.*": 1.0, "out.weight": 0.5})
    assert els == [Element("out.weight", 4), Element("out.bias")]       # ceil(0.5 * 7), exact name beats glob
    assert sparse.scheme_elements(shapes, "full") == [Element(n) for n in shapes]
    assert sparse.decode_scheme(sparse.encode_scheme(els)) == els
