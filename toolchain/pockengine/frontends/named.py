"""Holding another framework's tensors in a torch module under that framework's names.

torch forbids "." in a parameter's own name, so a dotted name ("fc1.weight",
"params.dense.kernel") becomes nested container modules; every other character
is kept, so `named_parameters()` and PockEngine's state names are exactly the
source format's names.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import PockError


def set_named_tensor(root: nn.Module, name: str, tensor: torch.Tensor, parameter: bool = True):
    *path, leaf = name.split(".")
    if not leaf or any(not p for p in path):
        raise PockError(f"tensor name {name!r} has an empty component")
    module = root
    for part in path:
        child = module._modules.get(part)
        if child is None:
            if hasattr(module, part):
                raise PockError(f"tensor name {name!r} clashes with another tensor of the same prefix")
            child = nn.Module()
            module.add_module(part, child)
        module = child
    if leaf in module._modules or leaf in module._parameters or leaf in module._buffers:
        raise PockError(f"tensor name {name!r} clashes with another tensor or prefix")
    if parameter:
        module.register_parameter(leaf, nn.Parameter(tensor))
    else:
        module.register_buffer(leaf, tensor)
