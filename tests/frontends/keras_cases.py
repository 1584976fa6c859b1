"""Keras frontend: a keras.Model (TensorFlow backend) trains in PockEngine exactly like
GradientTape + keras.optimizers.SGD on the same model, judged against the same Keras run in
float64 as Keras' float32 run is (the idea of tests/numerics.py), sparse updates included;
the trained weights go back into the keras model, which predicts with them."""
import numpy as np
import pytest
import torch

import pockengine as pe
from numerics import assert_fp64_close
from pockengine.ops import FULL
from pockengine.compiler.program import resolve_update

keras = pytest.importorskip("keras")  # TensorFlow backend; importing it takes ~50 s on 2 cores
tf = pytest.importorskip("tensorflow")


def mlp(dtype):
    L = keras.layers
    return keras.Sequential([keras.Input((16,), dtype=dtype), L.Dense(32, activation="relu", name="dense1", dtype=dtype),
                             L.Dense(32, activation="tanh", name="dense2", dtype=dtype),
                             L.Dense(5, name="out", dtype=dtype)], name="mlp")


def cnn(dtype):
    L = keras.layers
    return keras.Sequential([keras.Input((8, 8, 3), dtype=dtype),
                             L.Conv2D(8, 3, padding="same", use_bias=False, name="conv1", dtype=dtype),
                             L.BatchNormalization(name="bn1", dtype=dtype), L.ReLU(name="relu1", dtype=dtype),
                             L.MaxPooling2D(2, name="pool", dtype=dtype),
                             L.Conv2D(16, 3, padding="same", name="conv2", dtype=dtype),
                             L.BatchNormalization(name="bn2", dtype=dtype), L.ReLU(name="relu2", dtype=dtype),
                             L.GlobalAveragePooling2D(name="gap", dtype=dtype),
                             L.Dense(10, name="head", dtype=dtype)], name="cnn")


def lstm(dtype):
    """A next-token LM: Embedding, LSTM (sequences), GRU (sequences), per-token Dense."""
    L = keras.layers
    return keras.Sequential([keras.Input((6,), dtype="int32"), L.Embedding(20, 8, name="emb", dtype=dtype),
                             L.LSTM(12, return_sequences=True, name="lstm", dtype=dtype),
                             L.GRU(10, return_sequences=True, name="gru", dtype=dtype),
                             L.Dense(20, name="head", dtype=dtype)], name="rnn")


MODELS = {"mlp": mlp, "cnn": cnn, "lstm": lstm}
SPARSE = {"mlp": {"mlp/dense2/kernel": 0.5, "mlp/out/*": 1.0},
          "cnn": {"cnn/conv2/kernel": 0.5, "cnn/bn2/*": 1.0, "cnn/head/*": 1.0},
          "lstm": {"rnn/gru/gru_cell/*": 1.0, "rnn/head/*": 1.0}}
SHAPES = {"mlp": (8, 16), "cnn": (4, 8, 8, 3), "lstm": (4, 6)}
CLASSES = {"mlp": 5, "cnn": 10, "lstm": 20}


def batches(name, n=3):
    g = torch.Generator().manual_seed(0)
    if name == "lstm":  # token ids in, the next token out (one class per position)
        return [((torch.randint(0, 20, SHAPES[name], generator=g),),
                 (torch.randint(0, 20, SHAPES[name], generator=g),)) for _ in range(n)]
    return [((torch.randn(*SHAPES[name], generator=g),),
             (torch.randint(0, CLASSES[name], (SHAPES[name][0],), generator=g),)) for _ in range(n)]


def keras_train(model, data, update, lr, momentum, steps, dtype):
    """GradientTape + keras SGD; gradients masked to the updated slices, frozen slices restored."""
    variables = {v.path: v for v in model.trainable_variables}
    trained = resolve_update({p: tuple(v.shape) for p, v in variables.items()}, update)
    opt = keras.optimizers.SGD(learning_rate=lr, momentum=momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_vars = [variables[p] for p in variables if p in trained]
    losses = []
    for i in range(steps):
        (x,), (y,) = data[i % len(data)]
        with tf.GradientTape() as tape:
            inp = tf.constant(x.numpy()) if not x.is_floating_point() else tf.constant(x.numpy(), dtype)
            loss = loss_fn(y.numpy(), model(inp, training=True))
        grads = tape.gradient(loss, train_vars)
        frozen = {}
        for j, v in enumerate(train_vars):
            k = trained[v.path]
            if k is not FULL:
                grads[j] = tf.concat([grads[j][:, :k], tf.zeros_like(grads[j][:, k:])], axis=1)
                frozen[v.path] = v.numpy()[:, k:].copy()
        opt.apply_gradients(zip(grads, train_vars))
        for path, saved in frozen.items():
            arr = variables[path].numpy()
            arr[:, trained[path]:] = saved
            variables[path].assign(arr)
        losses.append(float(loss))
    return losses, {v.path: v.numpy() for v in model.variables if "seed_generator" not in v.path}


CASES = [("mlp", "full"), ("mlp", "sparse"), ("cnn", "full"), ("cnn", "sparse"), ("lstm", "full"),
         ("lstm", "sparse")]


@pytest.mark.parametrize("name,scheme", CASES)
def test_keras_trains_like_gradient_tape_and_sgd(name, scheme):
    keras.utils.set_random_seed(0)
    model = MODELS[name]("float32")
    weights = [w.copy() for w in model.get_weights()]
    original = {v.path: v.numpy().copy() for v in model.variables}
    data = batches(name)
    update = "full" if scheme == "full" else SPARSE[name]
    prog = pe.compile(model, *data[0], loss="cross_entropy", update=update,
                      optimizer=pe.SGD(lr=0.05, momentum=0.9))
    trainer = prog.build()
    losses = [trainer.step(*data[i % 3]) for i in range(3)]

    l32, s32 = keras_train(model, data, update, 0.05, 0.9, 3, "float32")
    model64 = MODELS[name]("float64")
    model64.set_weights([w.astype(np.float64) for w in weights])
    l64, s64 = keras_train(model64, data, update, 0.05, 0.9, 3, "float64")
    for i in range(3):
        assert_fp64_close([losses[i]], [l32[i]], [l64[i]], f"loss of step {i}")
    state = trainer.state_dict()
    assert set(state) == set(s64)  # Keras variable paths, moving statistics included
    trained = resolve_update({p: tuple(v.shape) for p, v in ((v.path, v) for v in model.trainable_variables)},
                             update)
    for path in s64:
        assert_fp64_close(state[path], s32[path], s64[path], path)
        if path not in trained and "moving" not in path:
            assert np.array_equal(state[path], original[path]), f"frozen {path} changed"
        elif path in trained and trained[path] is not FULL:
            k = trained[path]
            assert np.array_equal(state[path][:, k:], original[path][:, k:]), path

    # the round trip: trained weights assigned into a fresh keras model, which predicts with them
    fresh = MODELS[name]("float32")
    fresh.set_weights(weights)
    pe.export_keras(trainer, fresh)
    x = data[1][0][0]
    got = fresh(tf.constant(x.numpy()), training=False).numpy()
    np.testing.assert_allclose(trainer.forward((x,)), got, rtol=1e-4, atol=1e-5)


def test_functional_models_name_variables_without_the_model_name():
    """Keras 3 prefixes a Sequential (or subclassed) model's variable paths with its name
    ("mlp/dense1/kernel") but not a functional model's ("dense1/kernel"): the parameters are the
    paths as Keras gives them, which docs/frontends.md says."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((16,))
    out = keras.layers.Dense(5, name="out")(keras.layers.Dense(32, activation="relu", name="dense1")(inp))
    model = keras.Model(inp, out, name="mlp")
    (x,), (y,) = batches("mlp")[0]
    prog = pe.compile(model, (x.numpy(),), (y.numpy(),), update={"out/*": 1.0})
    assert {v.path for v in model.variables} == {"dense1/kernel", "dense1/bias", "out/kernel", "out/bias"}
    assert set(prog.trained) == {"out/kernel", "out/bias"}


def test_numpy_and_tensorflow_example_inputs():
    """What a Keras user passes (NumPy arrays, tf.Tensor) compiles the same program as torch tensors
    (it was "example_inputs must be a tuple of torch tensors")."""
    keras.utils.set_random_seed(0)
    model = MODELS["mlp"]("float32")
    (x,), (y,) = batches("mlp")[0]
    want = pe.compile(model, (x,), (y,), name="kx").source()
    assert pe.compile(model, (x.numpy(),), (y.numpy(),), name="kx").source() == want
    assert pe.compile(model, (tf.constant(x.numpy()),), (tf.constant(y.numpy()),), name="kx").source() == want
