"""LoRA adapters as an update scheme of the compiled step.

`pe.LoRA(rank, alpha, targets)` names Linear modules by fnmatch globs over
their qualified names. Before export, each target `nn.Linear` of a copy of
the model is replaced by `LoRALinear`, which keeps the base `weight`/`bias`
under the same names and adds `lora_A` [rank, in] and `lora_B` [out, rank]:

    y = x W^T + b + scaling * (x A^T) B^T,     scaling = alpha / rank

initialised as PEFT does (A: Kaiming-uniform with a=sqrt(5), B: zeros), so the
first forward equals the base model's. The adapters are ordinary trained
parameters of the exported graph (FULL update, fp32 optimizer state); the
base weights are frozen unless the update dict trains them, so autodiff's
walk from the loss never asks for the frozen weight's gradient (it is dead
code: sparse backpropagation), only for the activation gradient that flows
through it to earlier adapters.
"""
from __future__ import annotations

import copy
import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import PockError


@dataclass(frozen=True)
class LoRA:
    """rank r, alpha (scaling = alpha / r), targets: globs over Linear module names."""
    rank: int = 8
    alpha: float = 16.0
    targets: tuple = field(default=("*.q_proj", "*.v_proj"))
    seed: int = 0  # the adapters' initialisation (torch.Generator seed)

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise PockError(f"LoRA rank must be a positive int, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise PockError(f"LoRA alpha must be a positive number, got {self.alpha!r}")
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise PockError(f"LoRA targets must be a non-empty list of module-name globs, got {self.targets!r}")
        object.__setattr__(self, "targets", targets)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """nn.Linear with a LoRA adapter; parameter names weight, bias, lora_A, lora_B."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float, generator: torch.Generator):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.scaling = float(scaling)
        a = torch.empty(rank, base.in_features, dtype=base.weight.dtype)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)  # PEFT's init; B = 0
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling


def lora_targets(model: nn.Module, lora: LoRA) -> list[str]:
    """The qualified names of the Linear modules the globs select (model order)."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = []
    for glob in lora.targets:
        matches = [n for n in linears if fnmatch.fnmatchcase(n, glob)]
        if not matches:
            others = [n for n, m in model.named_modules() if n and fnmatch.fnmatchcase(n, glob)]
            why = (f"; it matches {others[:3]} which are not nn.Linear" if others else "")
            raise PockError(f"LoRA target {glob!r} matches no nn.Linear module{why}; Linear modules are: "
                            f"{', '.join(linears[:12])}{' ...' if len(linears) > 12 else ''}")
        chosen += [n for n in matches if n not in chosen]
    return [n for n in linears if n in chosen]


def apply_lora(model: nn.Module, lora: LoRA) -> tuple[nn.Module, dict[str, float]]:
    """A deep copy of model with LoRALinear in place of each target; returns
    (copy, {module name: scaling}). The caller's model is not changed."""
    if not isinstance(lora, LoRA):
        raise PockError(f"lora must be pe.LoRA(rank, alpha, targets), got {type(lora).__name__}")
    names = lora_targets(model, lora)
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(lora.seed)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        if isinstance(base, LoRALinear):
            continue
        setattr(parent, child, LoRALinear(base, lora.rank, lora.scaling, gen))
    return model, {n: lora.scaling for n in names}


def merge_lora(state_dict: dict, adapters: dict[str, float]) -> dict:
    """state_dict with W + scaling * B @ A merged into each adapted weight and
    the lora_A / lora_B entries removed (the base model's names, fp32)."""
    out = dict(state_dict)
    for module, scaling in adapters.items():
        a = np.asarray(out.pop(f"{module}.lora_A"), np.float64)
        b = np.asarray(out.pop(f"{module}.lora_B"), np.float64)
        w = np.asarray(out[f"{module}.weight"])
        out[f"{module}.weight"] = (w.astype(np.float64) + scaling * (b @ a)).astype(w.dtype)
    return out
