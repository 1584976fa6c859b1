"""Frontends: every model format becomes a torch module whose parameters carry the
format's own names, then goes through the PyTorch path (torch_export.py + aten.py).

    as_torch_module(model)  # ONNX (path or ModelProto), .tflite (path), keras.Model, pe.from_jax(...)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch.nn as nn

from ..errors import PockError


def as_torch_module(model) -> nn.Module:
    """`model` in any supported format → a torch.nn.Module (a torch module is returned as is)."""
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, (str, Path)):
        suffix = Path(model).suffix.lower()
        if not Path(model).is_file():
            raise PockError(f"model file {str(model)!r} does not exist")
        if suffix == ".onnx":
            from .onnx import OnnxModule
            return OnnxModule(model)
        if suffix == ".tflite":
            from .tflite import TFLiteModule
            return TFLiteModule(model)
        raise PockError(f"model file {str(model)!r}: PockEngine reads .onnx and .tflite files")
    kind = type(model).__module__ + "." + type(model).__name__
    if kind.startswith("onnx.") and type(model).__name__ == "ModelProto":
        from .onnx import OnnxModule
        return OnnxModule(model)
    from .jax import JaxModel
    if isinstance(model, JaxModel):
        return model.to_torch()
    if "keras" in sys.modules and isinstance(model, sys.modules["keras"].Model):
        from .keras import KerasModule
        return KerasModule(model)
    raise PockError(f"model must be a torch.nn.Module, an ONNX model (path or onnx.ModelProto), a .tflite path, "
                    f"a keras.Model or pe.from_jax(fn, params); got {type(model).__name__}")
