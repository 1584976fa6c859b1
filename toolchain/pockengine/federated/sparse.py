"""Sparse updates as federated payloads: which elements a scheme trains, reading and writing
them on a trainer, and FedAvg over each element's contributors.

An element is (parameter name, k): k is None for a whole tensor, or the number of leading
input channels (dim 1) a partial update trains, exactly as `pe.compile(update=...)` resolves
its `update` dict. A client uploads one array per element of its scheme (a slice `[:, :k]`
for a partial one), nothing else; elements outside the scheme are frozen on every phone and
the server never writes them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..ops import FULL
from ..errors import PockError
from ..compiler.program import resolve_update


@dataclass(frozen=True)
class Element:
    name: str
    k: int | None = None   # None: the whole tensor; k: its first k input channels (dim 1)

    def index(self):
        return slice(None) if self.k is None else (slice(None), slice(0, self.k))

    def shape(self, full_shape) -> tuple[int, ...]:
        return tuple(full_shape) if self.k is None else (full_shape[0], self.k, *full_shape[2:])


def scheme_elements(param_shapes: dict[str, tuple[int, ...]], update) -> list[Element]:
    """The trained elements of `update` ("full" or pe.compile's dict) in parameter order."""
    trained = resolve_update(param_shapes, update)
    return [Element(n, None if trained[n] == FULL else int(trained[n])) for n in param_shapes if n in trained]


def program_elements(prog, param_shapes: dict[str, tuple[int, ...]]) -> list[Element]:
    """The trained elements of a compiled program (prog.trained), in parameter order."""
    return [Element(n, None if prog.trained[n] == FULL else int(prog.trained[n]))
            for n in param_shapes if n in prog.trained]


def trainer_param_shapes(trainer) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in trainer.tensors if t.kind == "param"}


def encode_scheme(elements: list[Element]) -> str:
    """The scheme as a short string (sent with each upload so the server knows the slices)."""
    return json.dumps([[e.name, e.k] for e in elements], separators=(",", ":"))


def decode_scheme(text: str) -> list[Element]:
    try:
        return [Element(str(n), None if k is None else int(k)) for n, k in json.loads(text)]
    except (ValueError, TypeError) as e:
        raise PockError(f"malformed federated scheme {text[:80]!r}: {e}") from None


def read_elements(trainer, elements: list[Element]) -> list[np.ndarray]:
    """The trainer's current values of `elements` (contiguous copies)."""
    return [np.ascontiguousarray(trainer.get_tensor(e.name)[e.index()]) for e in elements]


def write_elements(trainer, elements: list[Element], arrays: list[np.ndarray]) -> None:
    """Overwrite exactly `elements` on the trainer; everything else (frozen tensors, the frozen
    channels of a partial one) is written back with its own bits or not touched at all."""
    check_payload(elements, arrays, trainer_param_shapes(trainer))
    for e, a in zip(elements, arrays):
        if e.k is None:
            trainer.set_tensor(e.name, a)
        else:
            full = trainer.get_tensor(e.name)
            full[e.index()] = a
            trainer.set_tensor(e.name, full)


def check_payload(elements: list[Element], arrays, param_shapes: dict[str, tuple[int, ...]]) -> None:
    if len(arrays) != len(elements):
        raise PockError(f"federated payload has {len(arrays)} arrays for {len(elements)} elements")
    for e, a in zip(elements, arrays):
        if e.name not in param_shapes:
            raise PockError(f"federated payload names unknown parameter {e.name!r}")
        full = param_shapes[e.name]
        if e.k is not None and not (len(full) >= 2 and 0 < e.k <= full[1]):
            raise PockError(f"federated payload slice {e.name}[:, :{e.k}] does not fit shape {full}")
        if tuple(np.shape(a)) != e.shape(full):
            raise PockError(f"federated payload for {e.name!r}{'' if e.k is None else f'[:, :{e.k}]'} has "
                            f"shape {tuple(np.shape(a))}, expected {e.shape(full)}")


def payload_bytes(arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


# ---------------------------------------------------------------------------------- aggregation
def aggregate(global_params: dict[str, np.ndarray], uploads, *, clip: float | None = None,
              noise_multiplier: float = 0.0, expected_clients: int | None = None,
              rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """New global parameters from sparse uploads.

    uploads: list of (elements, arrays, num_examples). Without clipping, each scalar becomes
    the example-weighted mean of the clients that trained it (FedAvg over its contributors);
    a scalar nobody trained keeps its global value bit-identically.

    With `clip` (user-level DP, DP-FedAvg of McMahan et al. 2018): each client's update
    (its values minus the global ones, over all its elements) is clipped to L2 norm `clip`,
    the clipped updates are summed per scalar, Gaussian noise of std `noise_multiplier * clip`
    is added to every scalar some client could train, and the sum is divided by
    `expected_clients` (a fixed denominator, so one user changes the result by at most
    clip / expected_clients); weights are uniform then.
    """
    new = {n: np.array(v, dtype=np.float32, copy=True) for n, v in global_params.items()}
    shapes = {n: v.shape for n, v in global_params.items()}
    acc: dict[str, np.ndarray] = {}
    weight: dict[str, np.ndarray] = {}   # per scalar: the summed weights of its contributors
    for elements, arrays, n_examples in uploads:
        check_payload(elements, arrays, shapes)
        values = [np.asarray(a, np.float64) for a in arrays]
        if clip is not None:   # DP: sum clipped updates (value - global), uniform weights
            values = [v - global_params[e.name][e.index()] for e, v in zip(elements, values)]
            norm = float(np.sqrt(sum(float(np.sum(v * v)) for v in values)))
            w = min(1.0, clip / max(norm, 1e-12))
            count = 1.0
        else:                  # FedAvg: sum example-weighted values
            w = count = float(n_examples)
            if not w > 0:
                raise PockError(f"a federated upload reports {n_examples} examples; FedAvg needs a positive count")
        for e, v in zip(elements, values):
            a = acc.setdefault(e.name, np.zeros(shapes[e.name], np.float64))
            c = weight.setdefault(e.name, np.zeros(shapes[e.name], np.float64))
            a[e.index()] += w * v
            c[e.index()] += count
    rng = rng or np.random.default_rng()
    for name, a in acc.items():
        touched = weight[name] > 0
        if clip is None:
            value = a / np.where(touched, weight[name], 1.0)
        else:
            if noise_multiplier > 0:
                a = a + np.where(touched, rng.normal(0.0, noise_multiplier * clip, a.shape), 0.0)
            value = global_params[name].astype(np.float64) + a / float(expected_clients or len(uploads))
        new[name] = np.where(touched, value.astype(np.float32), global_params[name])
    return new
