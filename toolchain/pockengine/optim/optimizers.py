"""Optimizers as graph nodes, with torch.optim semantics on the updated
elements only: state exists just for those elements."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import PockError
from ..ir.graph import Graph, Value


def update_region(param: Value, k: int | None) -> tuple[int, int, int]:
    """(outer, inner, stride) of the elements a (partial) update touches."""
    shape = param.shape
    if k is None or len(shape) < 2 or k == shape[1]:
        return 1, param.numel, param.numel
    rest = math.prod(shape[2:])
    return shape[0], k * rest, shape[1] * rest


def _check_hyper(opt, **values) -> None:
    """Each value must be a finite number >= 0 (NaN compares false to everything,
    so `x < 0` alone would let it through to the generated C++)."""
    for name, x in values.items():
        try:
            ok = not isinstance(x, bool) and math.isfinite(float(x)) and float(x) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise PockError(f"{type(opt).__name__}: {name} must be a finite number >= 0, got {x!r}")


class Optimizer:
    lr: float

    def emit(self, g: Graph, param: Value, grad: Value, k: int | None, source: str):
        raise NotImplementedError

    def _state(self, g: Graph, param: Value, grad: Value, slot: str) -> Value:
        return g.add_state(f"{param.name}:{slot}", grad.shape, "f32", "opt_state",
                           data=np.zeros(grad.shape, np.float32))


@dataclass
class SGD(Optimizer):
    """torch.optim.SGD: lr, momentum, dampening, weight_decay, nesterov."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0

    def __post_init__(self):
        _check_hyper(self, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                     dampening=self.dampening)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise PockError("SGD nesterov momentum requires a momentum and zero dampening")

    def emit(self, g, param, grad, k, source):
        buf = self._state(g, param, grad, "momentum_buffer") if self.momentum else None
        g.add("sgd_update", [param, grad, buf],
              {"region": update_region(param, k), "momentum": self.momentum, "dampening": self.dampening,
               "weight_decay": self.weight_decay, "nesterov": self.nesterov}, source=source, phase="update")


@dataclass
class AdamW(Optimizer):
    """torch.optim.AdamW (amsgrad=False)."""

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self):
        _check_hyper(self, lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        try:
            b1, b2 = (float(b) for b in self.betas)
        except (TypeError, ValueError):
            raise PockError(f"AdamW: betas must be two numbers, got {self.betas!r}") from None
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise PockError(f"AdamW: betas must be in [0, 1), got {self.betas!r}")

    def emit(self, g, param, grad, k, source):
        m = self._state(g, param, grad, "exp_avg")
        v = self._state(g, param, grad, "exp_avg_sq")
        g.add("adamw_update", [param, grad, m, v],
              {"region": update_region(param, k), "beta1": self.betas[0], "beta2": self.betas[1],
               "eps": self.eps, "weight_decay": self.weight_decay}, source=source, phase="update")
