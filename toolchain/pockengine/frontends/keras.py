"""Keras frontend: a keras.Model's layers → a torch module with Keras' semantics → the torch path.

    prog = pe.compile(keras_model, example_inputs=(x,), example_targets=(y,), ...)
    pe.export_keras(trainer, keras_model)      # trained weights assigned back into the model

`KerasModule` runs the model's layers in order (Sequential, or a functional model that is
one chain) with torch ops in Keras' layout (NHWC, kernels HWIO / (in, out)); each variable
is a parameter (trainable) or buffer (BatchNormalization's moving statistics) named by its
Keras `variable.path` ("mlp/dense1/kernel"). BatchNormalization follows Keras: batch
statistics with the biased variance, moving statistics with momentum 0.99 weighing the old
value. Directly from the layers rather than through tf2onnx: tf2onnx renames variables to
graph tensor names and folds/transposes kernels, so trained tensors would not map back.
A layer type not in `LAYERS` is a PockError naming the layer.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import PockError
from .named import set_named_tensor

ACTIVATIONS = {"linear": lambda x: x, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
               "softmax": lambda x: F.softmax(x, -1), "relu6": F.relu6, "silu": F.silu, "swish": F.silu}


class KerasModule(nn.Module):
    """Runs a keras.Model's layers with torch ops; variables named by their Keras path."""

    def __init__(self, model):
        super().__init__()
        self._layers = []
        self._paths = {}
        for layer in model.layers:
            kind = type(layer).__name__
            if kind not in LAYERS:
                raise PockError(f"Keras layer {layer.name!r}: layer type {kind} is not supported by PockEngine's "
                                f"Keras frontend (supported: {', '.join(sorted(LAYERS))})")
            if len(getattr(layer, "_inbound_nodes", [])) > 1:
                raise PockError(f"Keras layer {layer.name!r} is used more than once; only chains are supported")
            names = {}
            for v in layer.variables:
                arr = np.asarray(v.numpy())
                if not v.trainable and arr.dtype.kind in "iu" and "seed_generator" in v.path:
                    continue  # a dropout layer's RNG state, not a tensor of the model's maths
                if arr.dtype != np.float32:
                    raise PockError(f"Keras variable {v.path!r} is {arr.dtype}; PockEngine trains float32 models")
                set_named_tensor(self, v.path, torch.from_numpy(arr.copy()), parameter=v.trainable)
                names[v.path.rsplit("/", 1)[-1]] = v.path
            self._layers.append((kind, layer, names))

    def _var(self, names, key):
        path = names.get(key)
        if path is None:
            return None
        try:
            return self.get_parameter(path)
        except AttributeError:
            return self.get_buffer(path)

    def forward(self, x):
        for kind, layer, names in self._layers:
            x = LAYERS[kind](self, layer, lambda k, n=names: self._var(n, k), x)
        return x


def _act(layer, x):
    name = getattr(getattr(layer, "activation", None), "__name__", "linear")
    if name not in ACTIVATIONS:
        raise PockError(f"Keras layer {layer.name!r}: activation {name!r} is not supported")
    return ACTIVATIONS[name](x)


def _dense(m, layer, var, x):
    y = torch.matmul(x, var("kernel"))
    if var("bias") is not None:
        y = y + var("bias")
    return _act(layer, y)


def _padding(layer, kernel):
    if layer.padding == "valid":
        return [0, 0]
    if any(k % 2 == 0 for k in kernel) or any(s != 1 for s in layer.strides):
        raise PockError(f"Keras layer {layer.name!r}: padding='same' needs odd kernels and stride 1 here")
    return [k // 2 for k in kernel]


def _conv2d(m, layer, var, x):
    if layer.data_format != "channels_last":
        raise PockError(f"Keras layer {layer.name!r}: only channels_last is supported")
    w = var("kernel")  # (kh, kw, in, out) -> (out, in, kh, kw)
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), None, list(layer.strides),
                 _padding(layer, w.shape[:2]), list(layer.dilation_rate), layer.groups)
    y = y.permute(0, 2, 3, 1)
    if var("bias") is not None:
        y = y + var("bias")
    return _act(layer, y)


def _batch_norm(m, layer, var, x):
    axes = [d for d in range(x.dim()) if d != layer.axis % x.dim()]
    gamma, beta, mean_var, var_var = var("gamma"), var("beta"), var("moving_mean"), var("moving_variance")
    if m.training and layer.trainable:
        mean = x.mean(dim=axes)
        variance = ((x - mean) * (x - mean)).mean(dim=axes)  # Keras: the biased variance
        with torch.no_grad():
            mean_var.copy_(mean_var * layer.momentum + mean.detach() * (1.0 - layer.momentum))
            var_var.copy_(var_var * layer.momentum + variance.detach() * (1.0 - layer.momentum))
    else:
        mean, variance = mean_var, var_var
    y = (x - mean) * torch.rsqrt(variance + layer.epsilon)
    if gamma is not None:
        y = y * gamma
    return y + beta if beta is not None else y


def _pool(m, layer, var, x, fn):
    if layer.padding != "valid":
        raise PockError(f"Keras layer {layer.name!r}: only padding='valid' pooling is supported")
    y = fn(x.permute(0, 3, 1, 2), list(layer.pool_size), list(layer.strides))
    return y.permute(0, 2, 3, 1)


def _recurrent_checks(layer, cell: str):
    for attr, ok in (("go_backwards", False), ("stateful", False), ("return_state", False)):
        if getattr(layer, attr, ok) != ok:
            raise PockError(f"Keras layer {layer.name!r}: {cell} with {attr}={not ok} is not supported")
    acts = (getattr(layer.activation, "__name__", "?"), getattr(layer.recurrent_activation, "__name__", "?"))
    if acts != ("tanh", "sigmoid"):
        raise PockError(f"Keras layer {layer.name!r}: {cell} activations {acts} are not supported "
                        "(tanh and sigmoid are)")
    if getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0):
        if getattr(layer, "recurrent_dropout", 0):
            raise PockError(f"Keras layer {layer.name!r}: recurrent_dropout is not supported")


def _lstm(m, layer, var, x):
    """Keras LSTM (gates i, f, c, o; zero initial state), unrolled over the time axis."""
    _recurrent_checks(layer, "LSTM")
    k, rk, b = var("kernel"), var("recurrent_kernel"), var("bias")
    hidden = rk.shape[0]
    xw = torch.matmul(x, k)  # every time step's input projection at once: (B, T, 4H)
    if b is not None:
        xw = xw + b
    h = c = x.new_zeros(x.shape[0], hidden)
    outs = []
    for t in range(x.shape[1]):
        z = xw[:, t] + torch.matmul(h, rk)
        i, f, g, o = (z[:, j * hidden:(j + 1) * hidden] for j in range(4))
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, 1) if layer.return_sequences else h


def _gru(m, layer, var, x):
    """Keras GRU (gates z, r, h; reset_after as Keras' default, or before), unrolled over time."""
    _recurrent_checks(layer, "GRU")
    k, rk, b = var("kernel"), var("recurrent_kernel"), var("bias")
    hidden = rk.shape[0]
    after = getattr(layer, "reset_after", True)
    bi, bh = (b[0], b[1]) if b is not None and b.dim() == 2 else (b, None)
    xw = torch.matmul(x, k)
    if bi is not None:
        xw = xw + bi
    h = x.new_zeros(x.shape[0], hidden)
    outs = []
    for t in range(x.shape[1]):
        xz, xr, xh = (xw[:, t, j * hidden:(j + 1) * hidden] for j in range(3))
        if after:
            hw = torch.matmul(h, rk)
            if bh is not None:
                hw = hw + bh
            hz, hr, hh = (hw[:, j * hidden:(j + 1) * hidden] for j in range(3))
            z, r = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
            cand = torch.tanh(xh + r * hh)
        else:
            hz = torch.matmul(h, rk[:, :hidden])
            hr = torch.matmul(h, rk[:, hidden:2 * hidden])
            z, r = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
            cand = torch.tanh(xh + torch.matmul(r * h, rk[:, 2 * hidden:]))
        h = z * h + (1.0 - z) * cand
        outs.append(h)
    return torch.stack(outs, 1) if layer.return_sequences else h


LAYERS = {
    "LSTM": _lstm,
    "GRU": _gru,
    "GlobalAveragePooling1D": lambda m, layer, var, x: x.mean(dim=1),
    "InputLayer": lambda m, layer, var, x: x,
    "Dropout": lambda m, layer, var, x: F.dropout(x, layer.rate, m.training),
    "Dense": _dense,
    "Conv2D": _conv2d,
    "BatchNormalization": _batch_norm,
    "Activation": lambda m, layer, var, x: _act(layer, x),
    "ReLU": lambda m, layer, var, x: torch.relu(x),
    "Flatten": lambda m, layer, var, x: x.reshape(x.shape[0], -1),
    "MaxPooling2D": lambda m, layer, var, x: _pool(m, layer, var, x, F.max_pool2d),
    "AveragePooling2D": lambda m, layer, var, x: _pool(m, layer, var, x, F.avg_pool2d),
    "GlobalAveragePooling2D": lambda m, layer, var, x: x.mean(dim=(1, 2)),
    "LayerNormalization": lambda m, layer, var, x: F.layer_norm(x, x.shape[-1:], var("gamma"), var("beta"),
                                                                layer.epsilon),
    "Embedding": lambda m, layer, var, x: F.embedding(x, var("embeddings")),
}


def export_keras(trainer, model):
    """Assign the trainer's weights (and BatchNorm moving statistics) to `model`'s variables by path."""
    state = trainer.state_dict()
    written = 0
    for v in model.variables:
        if v.path in state:
            v.assign(np.asarray(state[v.path], dtype=np.float32).reshape(tuple(v.shape)))
            written += 1
    if not written:
        raise PockError("no variable of this keras model is a tensor of this trainer")
    return model
