"""`python -m pockengine.federated simulate --task MODULE:FUNCTION`: N users improve a shared model.

A `Task` says what is trained and how it is measured: the compiled base model, the tokenizer
that turns each user's text into tokens, the evaluation (top-1/top-3 next-token accuracy) and
the batch shape. The keyboard demo's task is keyboard/sim/federated.py of the demo apps
(`--task keyboard.sim.federated:task`, run from their folder): this module imports no demo. Its
bundle is written, and N simulated phones (one licence text each, data.py) run R rounds of
federated averaging through Flower. After the rounds every user personalizes the global
model locally and is measured on their own held-out sentences. It prints a table, writes
a report and a plot, and ends with the one-line summary.
"""
from __future__ import annotations

import importlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import PockError
from . import sparse
from .data import users as make_users, windows
from .flower import PockClient, Setup, SparseFedAvg, run_inprocess, run_processes, run_ray

ENGINES = ("simulation", "processes", "inprocess")


@dataclass
class Result:
    clients: int
    rounds: int
    scheme: str
    engine: str
    rounds_log: list
    users: list = field(default_factory=list)   # (name, typed tokens, base top-3, global top-3, personalized top-3)
    full_upload_bytes: int = 0
    trained_elements: int = 0
    total_elements: int = 0
    wall_seconds: float = 0.0
    epsilon: float | None = None
    delta: float = 1e-5

    @property
    def upload_per_client_round(self) -> float:
        return float(np.mean([b for r in self.rounds_log if r.round > 0 for b in r.upload_bytes]))

    def summary(self) -> str:
        a, b = self.rounds_log[0].top3, self.rounds_log[-1].top3
        return (f"federated: {self.clients} clients, {self.rounds} rounds, global held-out top-3 "
                f"{100 * a:.1f}% -> {100 * b:.1f}%, upload {self.upload_per_client_round:.0f} "
                f"bytes/client/round (full update {self.full_upload_bytes})")


class ClientFactory:
    """make_client(i) for the engines (picklable: Ray ships it to its actors)."""

    def __init__(self, setup: Setup, users):
        self.setup, self.users = setup, users

    def __call__(self, i: int) -> PockClient:
        return PockClient(self.setup, self.users[i], i)


@dataclass(frozen=True)
class Task:
    """What a federated simulation trains and measures."""
    program: object  # the compiled base model (pe.compile), trained with the scheme asked for
    tokenizer: object  # turns a user's text into token ids (data.users)
    evaluate: Callable  # evaluate(trainer, tokenizer, tokens, batch, seq) -> (top-1, top-3)
    batch: int
    seq: int


def load_task(ref: str, scheme: str) -> Task:
    """The Task of `ref` ("module:function", the module importable from here) for `scheme`."""
    module, _, fn = ref.partition(":")
    if not module or not fn:
        raise PockError(f"--task must be MODULE:FUNCTION (e.g. keyboard.sim.federated:task, run from "
                        f"the demo apps' folder), got {ref!r}")
    try:
        make = getattr(importlib.import_module(module), fn)
    except (ImportError, AttributeError) as e:
        raise PockError(f"--task {ref}: {e} (the keyboard demo's task is keyboard.sim.federated:task, "
                        f"importable when run from the demo apps' folder)") from None
    task = make(scheme)
    if not isinstance(task, Task):
        raise PockError(f"--task {ref} returned {type(task).__name__}, not a pockengine.federated.simulate.Task")
    return task


def full_upload_bytes(trainer) -> int:
    """The bytes a full update would upload (every parameter, Flower's serialisation)."""
    from flwr.common import ndarrays_to_parameters

    arrays = [trainer.get_tensor(n) for n in sparse.trainer_param_shapes(trainer)]
    return sum(len(t) for t in ndarrays_to_parameters(arrays).tensors)


def simulate(task: Task | None = None, clients: int = 8, rounds: int = 5, scheme: str = "sparse",
             engine: str = "simulation",
             local_steps: int = 20, personalize_steps: int = 30, clients_per_round: int | None = None,
             clip: float | None = None, noise_multiplier: float = 0.0, delta: float = 1e-5,
             seed: int = 0, work_dir: Path | None = None, held_tokens: int = 1200, log=print) -> Result:
    if engine not in ENGINES:
        raise PockError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if rounds < 1:
        raise PockError(f"--rounds must be >= 1, got {rounds}")
    if not isinstance(task, Task):
        raise PockError(f"simulate needs a Task (what to train and how to measure it), got {type(task).__name__}")
    from ..runtime.bundle import write_bundle

    t_start = time.perf_counter()
    prog, tok, evaluate, batch, seq = task.program, task.tokenizer, task.evaluate, task.batch, task.seq
    t0 = time.perf_counter()
    server = prog.build()                      # cached by content after the first build
    log(f"[{scheme}] compiled step {server.lib_path.name} ready in {time.perf_counter() - t0:.1f}s")
    work = Path(work_dir or tempfile.mkdtemp(prefix="pock-federated-"))
    work.mkdir(parents=True, exist_ok=True)
    server.save(work / "initial.pockckpt")
    bundle = write_bundle(prog, work / "initial.pockckpt", work / f"bundle-{scheme}")
    shapes = sparse.trainer_param_shapes(server)
    elements = sparse.program_elements(prog, shapes)
    stats = prog.stats()
    population = make_users(clients, tok)
    held = np.concatenate([u.held[:held_tokens] for u in population])
    log(f"{clients} users ({', '.join(u.name for u in population)}): {sum(len(u.typed) for u in population)} "
        f"typed tokens; global held-out set {len(held)} tokens")
    setup = Setup(lib=str(server.lib_path), bundle=str(bundle), scheme=sparse.encode_scheme(elements),
                  batch=batch, seq=seq, local_steps=local_steps, seed=seed)
    base_state = {n: server.get_tensor(n) for n in {e.name for e in elements}}

    def evaluate_global(global_params):
        sparse.write_elements(server, elements, [global_params[e.name][e.index()] for e in elements])
        return evaluate(server, tok, held, batch, seq)

    strategy = SparseFedAvg(elements, base_state, evaluate_fn=evaluate_global,
                            clients_per_round=clients_per_round or clients, population=clients,
                            local_steps=local_steps, clip=clip, noise_multiplier=noise_multiplier,
                            delta=delta, seed=seed, log=log)
    make_client = ClientFactory(setup, population)
    t0 = time.perf_counter()
    if engine == "simulation":
        run_ray(strategy, make_client, clients, rounds)
    elif engine == "inprocess":
        run_inprocess(strategy, make_client, clients, rounds)
    else:
        run_processes(strategy, setup, population, rounds, work / "processes", log=log)
    log(f"[{scheme}] {rounds} rounds with Flower ({engine}) in {time.perf_counter() - t0:.1f}s")

    result = Result(clients, rounds, scheme, engine, strategy.rounds, full_upload_bytes=full_upload_bytes(server),
                    trained_elements=stats["trainable_elements"], total_elements=stats["total_parameter_elements"],
                    epsilon=strategy.epsilon(), delta=delta)
    global_arrays = strategy.global_arrays()
    rng = np.random.default_rng(seed + 1)
    for u in population:   # local personalization on top of the global model, on the user's own text
        server.load(work / "initial.pockckpt")
        base3 = evaluate(server, tok, u.held, batch, seq)[1]
        sparse.write_elements(server, elements, global_arrays)
        glob3 = evaluate(server, tok, u.held, batch, seq)[1]
        for _ in range(personalize_steps):
            server.step(*((a,) for a in windows(u.typed, batch, seq, rng)))
        pers3 = evaluate(server, tok, u.held, batch, seq)[1]
        result.users.append((u.name, len(u.typed), base3, glob3, pers3))
    server.close()
    result.wall_seconds = time.perf_counter() - t_start
    return result

