"""TFLite frontend cases (run in their own process by test_tflite.py: TensorFlow makes the
.tflite files and runs the interpreter, and it cannot share a process with lavapipe).

Each model is built in Keras and converted by TensorFlow's own TFLiteConverter. Two checks:
1. the file's function: PockEngine's reading of the .tflite predicts what the Keras model
   predicts (any batch size, though the file says batch 1);
2. training: 3 PockEngine steps (full and sparse) judged against the same steps run by
   PyTorch autograd in fp64 as PyTorch fp32 is (tests/numerics.py), frozen elements
   bit-identical; then the trained weights written back into the flatbuffer, and the TFLite
   interpreter predicts with them what the trainer predicts."""
import os

import numpy as np
import pytest
import torch

import pockengine as pe
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
from pockengine.frontends.tflite import TFLiteModule
from pockengine.compiler.program import resolve_update

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers


def _randomize(model, seed=0):
    """Non-zero biases and BatchNorm statistics (a converter drops or shares all-zero biases)."""
    rng = np.random.default_rng(seed)
    for v in model.variables:
        if v.path.endswith(("bias", "beta", "moving_mean")):
            v.assign(rng.normal(0, 0.1, v.shape).astype(np.float32))
        elif v.path.endswith(("gamma", "moving_variance")):
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))


def mlp():
    return keras.Sequential([keras.Input((16,)), L.Dense(32, activation="relu"), L.Dense(32, activation="tanh"),
                             L.Dense(5)])


def cnn():
    return keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(),
                             L.ReLU(), L.DepthwiseConv2D(3, padding="same", activation="relu6"),
                             L.MaxPooling2D(2), L.Conv2D(12, 1, strides=2, padding="same"), L.ReLU(),
                             L.GlobalAveragePooling2D(), L.Dense(10)])


def transformer():
    """A pre-norm transformer block (Keras MultiHeadAttention, GELU MLP) and a classifier over 6
    tokens of width 16. The converter writes its batch-dependent reshapes as SHAPE/GATHER/PACK
    arithmetic, which the frontend folds at compile time."""
    x = keras.Input((6, 16))
    h = L.LayerNormalization()(x)
    x2 = x + L.MultiHeadAttention(2, 8)(h, h)
    y = x2 + L.Dense(16)(L.Dense(32, activation="gelu")(L.LayerNormalization()(x2)))
    return keras.Model(x, L.Dense(10)(L.GlobalAveragePooling1D()(y)))


SHAPES = {"mlp": (8, 16), "cnn": (4, 8, 8, 3), "transformer": (4, 6, 16)}
CLASSES = {"mlp": 5, "cnn": 10, "transformer": 10}
MAKERS = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


def convert(name, tmp_path):
    keras.utils.set_random_seed(0)
    model = MAKERS[name]()
    _randomize(model)
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return model, path


def batches(name, n=3):
    g = torch.Generator().manual_seed(0)
    return [((torch.randn(*SHAPES[name], generator=g),),
             (torch.randint(0, CLASSES[name], (SHAPES[name][0],), generator=g),)) for _ in range(n)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_the_file_predicts_what_keras_predicts(name, tmp_path):
    model, path = convert(name, tmp_path)
    x = batches(name)[0][0][0]
    with torch.no_grad():
        got = TFLiteModule(path)(x).numpy()
    want = model(x.numpy(), training=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _sparse(module):
    """The last weight layer at half its input channels and every bias (names from the file)."""
    names = [n for n, p in module.named_parameters()]
    weights = [n for n, p in module.named_parameters() if p.dim() >= 2]
    return {weights[-1]: 0.5, **{n: 1.0 for n, p in module.named_parameters() if p.dim() == 1}}, names


@pytest.mark.parametrize("name,scheme", [("mlp", "full"), ("mlp", "sparse"), ("cnn", "full"), ("cnn", "sparse"),
                                         ("transformer", "full"), ("transformer", "sparse")])
def test_tflite_trains_like_pytorch_and_round_trips(name, scheme, tmp_path):
    _, path = convert(name, tmp_path)
    data = batches(name)
    module = TFLiteModule(path)
    sparse, names = _sparse(module)
    update = "full" if scheme == "full" else sparse
    opt = lambda: pe.SGD(lr=0.05, momentum=0.9)  # noqa: E731
    trainer = pe.compile(str(path), *data[0], loss="cross_entropy", update=update, optimizer=opt()).build()
    losses = [trainer.step(*data[i % 3]) for i in range(3)]
    ref = fp64_reference(module, data, "cross_entropy", update, opt(), 3)
    assert_losses_close(losses, ref)
    state = trainer.state_dict()
    assert set(state) == set(names)  # parameters are the file's tensor names
    trained = resolve_update({n: tuple(p.shape) for n, p in module.named_parameters()}, update)
    original = {n: t.clone() for n, t in module.state_dict().items()}
    assert_state_close_fp64(state, ref, original, trained, names=sorted(state))

    dst = pe.export_tflite(trainer, path, tmp_path / f"{name}_trained.tflite")
    assert dst.stat().st_size == path.stat().st_size
    x = data[1][0][0]
    interp = tf.lite.Interpreter(model_path=str(dst))
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x.numpy())
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, trainer.forward((x,)), rtol=1e-4, atol=1e-5)
    before = tf.lite.Interpreter(model_path=str(path))
    before.resize_tensor_input(inp["index"], list(x.shape))
    before.allocate_tensors()
    before.set_tensor(inp["index"], x.numpy())
    before.invoke()
    assert not np.allclose(before.get_tensor(before.get_output_details()[0]["index"]), got)


def test_unsupported_operator_and_bad_files_are_named(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((8,))
    model = keras.Model(x, L.Dense(4)(L.Lambda(lambda t: tf.math.cumsum(t, axis=-1))(x)))
    path = tmp_path / "cumsum.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    with pytest.raises(pe.PockError, match=r"TFLite operator \d+ \(CUMSUM, output .*\) is not supported"):
        pe.compile(str(path), (torch.randn(2, 8),), (torch.randint(0, 4, (2,)),))
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(pe.PockError, match="not a TFLite flatbuffer"):
        pe.compile(str(bad), (torch.randn(2, 8),), (torch.randint(0, 4, (2,)),))


def test_tensorflow_and_numpy_example_inputs(tmp_path):
    """A TFLite user passes tf.Tensor or NumPy example inputs: the same program as torch tensors."""
    _, path = convert("mlp", tmp_path)
    (x,), (y,) = batches("mlp")[0]
    want = pe.compile(str(path), (x,), (y,), name="tfl").source()
    assert pe.compile(str(path), (tf.constant(x.numpy()),), (tf.constant(y.numpy()),), name="tfl").source() == want
    assert pe.compile(str(path), (x.numpy(),), (y.numpy(),), name="tfl").source() == want
