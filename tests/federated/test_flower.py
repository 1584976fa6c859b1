"""The Flower client and strategy over a tiny compiled keyboard-like LM: only trained elements
travel, frozen elements stay bit-identical on every client and on the server, and a Flower
round equals FedAvg of the clients' uploads. Also the loopback processes and Ray engines."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.runtime.bundle import write_bundle
from pockengine.federated import sparse
from pockengine.federated.data import User
from pockengine.federated.flower import PockClient, Setup, SparseFedAvg, run_inprocess, run_processes, run_ray
from pockengine.federated.simulate import ClientFactory

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo-apps"))
from keyboard.model.lm import KeyboardLM  # noqa: E402  (the demo's model; the library imports no demo)

VOCAB, B, T = 40, 2, 6
UPDATE = {"lstm.weight_ih_l0": 0.5, "lstm.bias_*": 1.0, "out.weight": 0.5, "out.bias": 1.0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fed")
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (B, T))
    prog = pe.compile(KeyboardLM(VOCAB, emb=8, hidden=12), (x,), (x,), loss="cross_entropy", update=UPDATE,
                      optimizer=pe.AdamW(lr=1e-2, weight_decay=0.0), name="fedtiny")
    trainer = prog.build()
    trainer.save(tmp / "initial.pockckpt")
    bundle = write_bundle(prog, tmp / "initial.pockckpt", tmp / "bundle")
    shapes = sparse.trainer_param_shapes(trainer)
    elements = sparse.program_elements(prog, shapes)
    initial = trainer.state_dict()
    trainer.close()
    setup = Setup(lib=str(trainer.lib_path), bundle=str(bundle), scheme=sparse.encode_scheme(elements),
                  batch=B, seq=T, local_steps=3)
    rng = np.random.default_rng(0)
    users = [User(f"u{i}", rng.integers(0, VOCAB, 60 + 40 * i), rng.integers(0, VOCAB, 30)) for i in range(3)]
    return {"setup": setup, "elements": elements, "initial": initial, "users": users, "tmp": tmp}


def assert_frozen(state, initial, elements):
    """Everything outside `elements` bit-identical to the initial state."""
    trained = {e.name: e for e in elements}
    for name, value in initial.items():
        e = trained.get(name)
        if e is None:
            assert state[name].tobytes() == value.tobytes(), name
        elif e.k is not None:
            assert state[name][:, e.k:].tobytes() == value[:, e.k:].tobytes(), name


def test_elements_are_the_scheme(tiny):
    assert [(e.name, e.k) for e in tiny["elements"]] == [
        ("lstm.weight_ih_l0", 4), ("lstm.bias_ih_l0", None), ("lstm.bias_hh_l0", None),
        ("out.weight", 6), ("out.bias", None)]


def test_fit_uploads_only_trained_slices_and_keeps_frozen_elements(tiny):
    setup, elements, initial = tiny["setup"], tiny["elements"], tiny["initial"]
    client = PockClient(setup, tiny["users"][0], 0)
    start = client.get_parameters({})
    out, n, metrics = client.fit(start, {"round": 1})
    assert n == len(tiny["users"][0].typed) and metrics["scheme"] == setup.scheme
    assert [a.shape for a in out] == [e.shape(initial[e.name].shape) for e in elements]
    assert all(not np.array_equal(a, b) for a, b in zip(out, start))      # every trained element moved
    assert_frozen(client.trainer.state_dict(), initial, elements)
    # a fit is a pure function of (global, user, round): fresh optimizer state each time
    again, _, _ = client.fit(start, {"round": 1})
    assert all(np.array_equal(a, b) for a, b in zip(out, again))


def test_flower_rounds_equal_fedavg_of_uploads_and_frozen_stays_everywhere(tiny):
    setup, elements, initial, users = tiny["setup"], tiny["elements"], tiny["initial"], tiny["users"]
    seen = []

    class Checked(PockClient):
        def fit(self, parameters, config):
            res = super().fit(parameters, config)
            assert_frozen(self.trainer.state_dict(), initial, elements)   # on every client, every round
            seen.append(self.cid)
            return res

    g0 = {e.name: initial[e.name] for e in elements}
    strategy = SparseFedAvg(elements, g0, clients_per_round=3, population=3, local_steps=3, log=lambda *a: None)
    run_inprocess(strategy, lambda i: Checked(setup, users[i], i), 3, rounds=2)
    assert sorted(seen) == [0, 0, 1, 1, 2, 2]
    assert [r.round for r in strategy.rounds] == [1, 2]
    # the same two rounds by hand: each client's fit, then a NumPy example-weighted mean
    ref = {n: v.copy() for n, v in g0.items()}
    for rnd in (1, 2):
        arrays = [np.ascontiguousarray(ref[e.name][e.index()]) for e in elements]
        ups = [PockClient(setup, u, i).fit(arrays, {"round": rnd, "local_steps": 3}) for i, u in enumerate(users)]
        w = np.array([n for _, n, _ in ups], np.float64)
        for j, e in enumerate(elements):
            mean = sum(wi * up[0][j].astype(np.float64) for wi, up in zip(w, ups)) / w.sum()
            ref[e.name][e.index()] = mean.astype(np.float32)
    for e in elements:
        np.testing.assert_allclose(strategy.global_params[e.name], ref[e.name], rtol=1e-6, atol=1e-7)
    assert_frozen(strategy.global_params, {n: initial[n] for n in g0}, elements)   # and on the server
    full = sum(v.nbytes for v in initial.values())
    sliced = sum(4 * int(np.prod(e.shape(initial[e.name].shape))) for e in elements)
    assert strategy.rounds[0].payload_bytes == [sliced] * 3 and sliced < full / 3


def test_loopback_processes_smoke(tiny):
    """A real Flower server (gRPC on 127.0.0.1) and two client processes, one round; the
    processes exit by themselves."""
    setup, elements, initial = tiny["setup"], tiny["elements"], tiny["initial"]
    g0 = {e.name: initial[e.name] for e in elements}
    strategy = SparseFedAvg(elements, g0, clients_per_round=2, population=2, local_steps=2, log=lambda *a: None)
    run_processes(strategy, setup, tiny["users"][:2], rounds=1, run_dir=tiny["tmp"] / "procs", timeout=120,
                  log=lambda *a: None)
    assert strategy.rounds[-1].round == 1 and strategy.rounds[-1].clients == 2
    assert_frozen(strategy.global_params, {n: initial[n] for n in g0}, elements)


@pytest.mark.skipif(not os.environ.get("POCK_TEST_RAY"), reason="Ray's start-up takes ~45 s on 2 cores; "
                    "set POCK_TEST_RAY=1 to run Flower's simulation engine here")
def test_ray_simulation_engine(tiny):
    setup, elements, initial = tiny["setup"], tiny["elements"], tiny["initial"]
    g0 = {e.name: initial[e.name] for e in elements}
    strategy = SparseFedAvg(elements, g0, clients_per_round=2, population=2, local_steps=2, log=lambda *a: None)
    run_ray(strategy, ClientFactory(setup, tiny["users"][:2]), 2, rounds=1)
    assert strategy.rounds[-1].round == 1 and strategy.rounds[-1].clients == 2
    assert_frozen(strategy.global_params, {n: initial[n] for n in g0}, elements)
