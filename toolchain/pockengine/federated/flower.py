"""Flower client over a PockEngine trainer and a server strategy for sparse updates, and the
three ways to run them: Flower's simulation engine (Ray), Flower's own server loop with the
clients in this process (fast, for tests), and real Flower server/client processes over gRPC
on 127.0.0.1.

The client opens the same compiled step library and model bundle (model.json +
weights.pockckpt) the SDKs load. Each `fit` restores the bundle's checkpoint (fresh
optimizer state), writes the global values of its scheme's trained elements, runs compiled
training steps on the user's own text and uploads only those elements (a partial update
uploads only the first k input channels). The strategy averages each scalar over the clients
that trained it (SparseFedAvg), optionally with clipping and Gaussian noise (DP-FedAvg).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PockError
from . import sparse
from .data import User, windows
from .privacy import epsilon
from .sparse import Element

try:
    import flwr  # noqa: F401
    from flwr.client import NumPyClient
    from flwr.common import FitIns, FitRes, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy
except ImportError as e:   # a clear message instead of a NameError later
    raise PockError("pockengine.federated needs Flower: pip install 'flwr[simulation]==1.41.0' "
                    f"(the dev extras pin it): {e}") from None


@dataclass
class Setup:
    """What every client needs besides its own data (JSON-serialisable for client processes)."""
    lib: str                      # the compiled step library (host build)
    bundle: str                   # the model bundle directory
    scheme: str                   # sparse.encode_scheme(elements)
    batch: int = 8
    seq: int = 16
    local_steps: int = 20
    seed: int = 0
    threads: int = 1

    @property
    def elements(self) -> list[Element]:
        return sparse.decode_scheme(self.scheme)

    @property
    def checkpoint(self) -> str:
        return str(Path(self.bundle) / "weights.pockckpt")


_local = threading.local()


def open_trainer(setup: Setup):
    """One trainer per (thread, library): clients that run one after another in a process
    (Ray actors, the in-process loop's threads) share it; every fit restores the checkpoint."""
    from ..runtime.trainer import Trainer

    cache = getattr(_local, "trainers", None)
    if cache is None:
        cache = _local.trainers = {}
    key = (setup.lib, setup.checkpoint)
    if key not in cache:
        t = Trainer(setup.lib, setup.checkpoint)
        t.set_num_threads(setup.threads)
        cache[key] = t
    return cache[key]


class PockClient(NumPyClient):
    """A phone: a PockEngine trainer and one user's typed text."""

    def __init__(self, setup: Setup, user: User, cid: int):
        self.setup, self.user, self.cid = setup, user, cid
        self.elements = setup.elements
        self.trainer = open_trainer(setup)

    def get_parameters(self, config):
        self.trainer.load(self.setup.checkpoint)
        return sparse.read_elements(self.trainer, self.elements)

    def fit(self, parameters, config):
        s, t = self.setup, self.trainer
        t0 = time.perf_counter()
        t.load(s.checkpoint)                              # fresh optimizer state every round
        sparse.write_elements(t, self.elements, parameters)
        rnd = int(config.get("round", 0))
        rng = np.random.default_rng([s.seed, self.cid, rnd])
        losses = [t.step(*((a,) for a in windows(self.user.typed, s.batch, s.seq, rng)))
                  for _ in range(int(config.get("local_steps", s.local_steps)))]
        out = sparse.read_elements(t, self.elements)
        metrics = {"scheme": s.scheme, "loss": float(np.mean(losses)) if losses else 0.0,
                   "cid": self.cid, "seconds": time.perf_counter() - t0}
        return out, int(len(self.user.typed)), metrics

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


@dataclass
class RoundLog:
    round: int
    clients: int = 0
    upload_bytes: list = field(default_factory=list)   # serialized payload per client
    payload_bytes: list = field(default_factory=list)  # raw array bytes per client
    loss: float = float("nan")
    top1: float = float("nan")
    top3: float = float("nan")
    seconds: float = 0.0


class SparseFedAvg(Strategy):
    """FedAvg over each element's contributors (example-weighted), optional DP-FedAvg.

    global_params: {name: full array} of every parameter some scheme may train (a partly
    trained tensor is kept whole; its frozen channels are never written).
    evaluate_fn(global_params) -> (top1, top3) runs after every round (and before round 1).
    """

    def __init__(self, elements: list[Element], global_params: dict[str, np.ndarray], *,
                 evaluate_fn=None, clients_per_round: int, population: int, local_steps: int = 20,
                 clip: float | None = None, noise_multiplier: float = 0.0, delta: float = 1e-5,
                 seed: int = 0, wait_timeout: int = 120, log=print):
        super().__init__()
        self.elements = elements
        self.global_params = {n: np.array(v, np.float32) for n, v in global_params.items()}
        self.evaluate_fn, self.log = evaluate_fn, log
        self.clients_per_round, self.population = clients_per_round, population
        self.local_steps = local_steps
        self.clip, self.noise_multiplier, self.delta = clip, noise_multiplier, delta
        self.rng = np.random.default_rng(seed)
        self.wait_timeout = wait_timeout
        self.rounds: list[RoundLog] = []
        self._t0 = time.perf_counter()

    def __repr__(self) -> str:
        return f"SparseFedAvg({len(self.elements)} elements, clip={self.clip})"

    def global_arrays(self) -> list[np.ndarray]:
        return [np.ascontiguousarray(self.global_params[e.name][e.index()]) for e in self.elements]

    def epsilon(self) -> float | None:
        """The user-level epsilon spent so far (None without clipping and noise)."""
        if self.clip is None or self.noise_multiplier <= 0:
            return None
        q = self.clients_per_round / self.population
        return epsilon(q, self.noise_multiplier, len([r for r in self.rounds if r.round > 0]), self.delta)[0]

    # ------------------------------------------------------------------ Flower Strategy
    def initialize_parameters(self, client_manager):
        self._t0 = time.perf_counter()
        return ndarrays_to_parameters(self.global_arrays())

    def configure_fit(self, server_round, parameters, client_manager):
        if not client_manager.wait_for(self.clients_per_round, timeout=self.wait_timeout):
            raise PockError(f"only {client_manager.num_available()} of {self.clients_per_round} "
                            f"clients connected within {self.wait_timeout}s")
        clients = client_manager.sample(num_clients=self.clients_per_round, min_num_clients=self.clients_per_round)
        ins = FitIns(parameters, {"round": server_round, "local_steps": self.local_steps})
        return [(c, ins) for c in clients]

    def aggregate_fit(self, server_round, results, failures):
        if failures:
            raise PockError(f"round {server_round}: {len(failures)} clients failed: {failures[0]!r}")
        log = RoundLog(server_round, clients=len(results))
        uploads, losses = [], []
        for _, res in results:
            arrays = parameters_to_ndarrays(res.parameters)
            uploads.append((sparse.decode_scheme(str(res.metrics["scheme"])), arrays, res.num_examples))
            log.upload_bytes.append(sum(len(t) for t in res.parameters.tensors))
            log.payload_bytes.append(sparse.payload_bytes(arrays))
            losses.append(float(res.metrics.get("loss", np.nan)))
        self.global_params = sparse.aggregate(
            self.global_params, uploads, clip=self.clip, noise_multiplier=self.noise_multiplier,
            expected_clients=self.clients_per_round, rng=self.rng)
        log.loss = float(np.mean(losses))
        self.rounds.append(log)
        return ndarrays_to_parameters(self.global_arrays()), {"loss": log.loss}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []   # evaluation is centralised: the server's held-out set (evaluate below)

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        if self.evaluate_fn is None:
            return None
        top1, top3 = self.evaluate_fn(self.global_params)
        if server_round == 0:
            self.rounds.append(RoundLog(0))
        log = self.rounds[-1]
        log.top1, log.top3, log.seconds = top1, top3, time.perf_counter() - self._t0
        eps = self.epsilon()
        self.log(f"round {server_round}: global held-out top-1 {top1:.1%}, top-3 {top3:.1%}"
                 + (f", train loss {log.loss:.3f}, upload {np.mean(log.upload_bytes):,.0f} B/client"
                    if server_round else "")
                 + (f", DP epsilon {eps:.2f} (delta {self.delta:g})" if eps is not None and server_round else ""))
        return 1.0 - top3, {"top1": top1, "top3": top3}


# ---------------------------------------------------------------------------------- engines
def run_inprocess(strategy: SparseFedAvg, make_client, n_clients: int, rounds: int) -> None:
    """Flower's own server loop (flwr.server.Server) with the clients in this process: the
    same Strategy/NumPyClient calls and the same parameter serialisation, no Ray or gRPC."""
    from flwr.server import Server, SimpleClientManager
    from flwr.server.client_proxy import ClientProxy

    class Proxy(ClientProxy):
        def __init__(self, cid):
            super().__init__(str(cid))
            self.index = cid

        def _client(self):
            return make_client(self.index).to_client()

        def get_properties(self, ins, timeout, group_id):
            return self._client().get_properties(ins)

        def get_parameters(self, ins, timeout, group_id):
            return self._client().get_parameters(ins)

        def fit(self, ins, timeout, group_id):
            return self._client().fit(ins)

        def evaluate(self, ins, timeout, group_id):
            return self._client().evaluate(ins)

        def reconnect(self, ins, timeout, group_id):
            from flwr.common import DisconnectRes
            return DisconnectRes(reason="")

    manager = SimpleClientManager()
    for i in range(n_clients):
        manager.register(Proxy(i))
    server = Server(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)   # one client at a time: they share this thread's trainer
    server.fit(num_rounds=rounds, timeout=None)


def run_ray(strategy: SparseFedAvg, make_client, n_clients: int, rounds: int, num_cpus: int | None = None) -> None:
    """Flower's simulation engine (flwr.simulation.run_simulation on its Ray backend): the
    ServerApp runs in this process, each virtual client in a Ray actor process."""
    from flwr.clientapp import ClientApp
    from flwr.server import ServerAppComponents, ServerConfig
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    def client_fn(context):
        return make_client(int(context.node_config["partition-id"])).to_client()

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    cpus = num_cpus or min(os.cpu_count() or 1, n_clients)
    run_simulation(ServerApp(server_fn=server_fn), ClientApp(client_fn=client_fn), num_supernodes=n_clients,
                   backend_config={"client_resources": {"num_cpus": 1},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False,
                                                 "logging_level": "error", "log_to_driver": False}})
    if len([r for r in strategy.rounds if r.round > 0]) != rounds:
        raise PockError(f"Flower's simulation finished {len(strategy.rounds) - 1} of {rounds} rounds "
                        "(see its log above)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(strategy: SparseFedAvg, setup: Setup, users: list[User], rounds: int, run_dir: Path,
                  timeout: float = 600.0, log=print) -> None:
    """A real Flower server (this process, gRPC on 127.0.0.1) and one client process per user
    (`python -m pockengine.federated client`). Clients exit when the server disconnects them.
    `timeout` bounds the clients' start-up and each round; the whole run is bounded by
    timeout * (rounds + 1), after which the client processes started here are killed (and
    each client process ends itself)."""
    from flwr.server import ServerConfig, start_server

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "setup.json").write_text(json.dumps(asdict(setup)))
    np.savez(run_dir / "users.npz", **{f"typed{i}": u.typed for i, u in enumerate(users)},
             **{f"held{i}": u.held for i, u in enumerate(users)})
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2]),
                                                                 os.environ.get("PYTHONPATH", "")] if p))
    procs = []
    bound = timeout * (rounds + 1)
    deadline = time.monotonic() + bound
    try:
        for i in range(len(users)):
            with open(run_dir / f"client{i}.log", "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "pockengine.federated", "client", "--run-dir", str(run_dir),
                     "--user", str(i), "--server", address, "--timeout", str(int(bound))],
                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run_dir))
        log(f"started {len(procs)} client processes against the Flower server on {address}")
        strategy.wait_timeout = max(strategy.wait_timeout, int(timeout))   # N fresh Pythons import torch
        start_server(server_address=address, strategy=strategy,
                     config=ServerConfig(num_rounds=rounds, round_timeout=timeout))
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        tail = (run_dir / f"client{bad[0]}.log").read_text(errors="replace")[-2000:]
        raise PockError(f"client processes {bad} exited with {[procs[i].returncode for i in bad]}; "
                        f"client{bad[0]}.log ends:\n{tail}")
    if len([r for r in strategy.rounds if r.round > 0]) != rounds:
        raise PockError(f"the Flower server finished {len(strategy.rounds) - 1} of {rounds} rounds")


def client_main(run_dir: str, user: int, server: str, timeout: float) -> None:
    """Entry of one client process: connect to the server, serve fits until disconnected."""
    from flwr.compat.client.app import start_client

    run_dir = Path(run_dir)
    setup = Setup(**json.loads((run_dir / "setup.json").read_text()))
    with np.load(run_dir / "users.npz") as z:
        u = User(f"user{user}", z[f"typed{user}"], z[f"held{user}"])
    client = PockClient(setup, u, user)
    timer = threading.Timer(timeout, lambda: os._exit(3))   # bounded whatever the server does
    timer.daemon = True
    timer.start()
    start_client(server_address=server, client=client.to_client(), insecure=True,
                 max_retries=50, max_wait_time=timeout)
    timer.cancel()
