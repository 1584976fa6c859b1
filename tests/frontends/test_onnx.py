"""ONNX frontend: models exported from PyTorch train in PockEngine exactly like the
PyTorch model they came from (judged against its fp64 run), parameters named by
ONNX initializer, and the updated weights written back load in onnxruntime."""
import copy
import warnings

import numpy as np
import pytest
import torch

import pockengine as pe
from models import MODELS, batches
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
from pockengine.compiler.program import resolve_update

onnx = pytest.importorskip("onnx")
import onnx.numpy_helper  # noqa: E402

SPARSE = {"mlp": {"net.0.weight": 0.5, "net.4.*": 1.0},
          "cnn": {"project.weight": 0.5, "bn3.*": 1.0, "fc.*": 1.0},
          "gpt": {"blocks.1.qkv.weight": 0.5, "blocks.1.fc1.*": 1.0, "blocks.1.ln*": 1.0, "ln_f.*": 1.0}}
CASES = [("mlp", "full", "adamw"), ("mlp", "sparse", "sgd"), ("cnn", "full", "sgd"), ("cnn", "sparse", "adamw"),
         ("gpt", "full", "sgd"), ("gpt", "sparse", "adamw")]
OPTIMIZERS = {"sgd": lambda: pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
              "adamw": lambda: pe.AdamW(lr=1e-3, weight_decay=0.01)}


def export(model, x, path):
    """torch.onnx.export of a model in train mode (BatchNorm keeps training_mode=1), weights unfolded.
    Tracing a train-mode model runs it once, which moves BatchNorm's running statistics in the
    file; the model is given the file's statistics so it is exactly the model the file holds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(model), (x,), str(path), dynamo=False, input_names=["x"],
                          output_names=["logits"], training=torch.onnx.TrainingMode.TRAINING
                          if model.training else torch.onnx.TrainingMode.EVAL, do_constant_folding=False)
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for t in onnx.load(str(path)).graph.initializer:
            if t.name in buffers:
                buffers[t.name].copy_(torch.from_numpy(onnx.numpy_helper.to_array(t)))
    return path


@pytest.mark.parametrize("name,scheme,opt", CASES)
def test_onnx_trains_like_the_pytorch_model_it_came_from(name, scheme, opt, tmp_path):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    data = batches(name)
    path = export(model, data[0][0][0], tmp_path / f"{name}.onnx")
    update = "full" if scheme == "full" else SPARSE[name]
    prog = pe.compile(str(path), *data[0], loss="cross_entropy", update=update, optimizer=OPTIMIZERS[opt]())
    trainer = prog.build()
    losses = [trainer.step(*data[i % 3]) for i in range(3)]
    ref = fp64_reference(model, data, "cross_entropy", update, OPTIMIZERS[opt](), 3)
    assert_losses_close(losses, ref)
    state = trainer.state_dict()
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert set(state) <= names, set(state) - names  # ONNX initializer names = the PyTorch names
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
    original = {n: t.clone() for n, t in model.state_dict().items()}
    assert_state_close_fp64(state, ref, original, trained, names=sorted(state))

    # the round trip: the updated initializers (BatchNorm switched to inference), run by onnxruntime
    import onnxruntime as ort
    dst = pe.export_onnx(trainer, path, tmp_path / f"{name}_trained.onnx")
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": data[1][0][0].numpy()})[0]
    ref.model32.eval()
    with torch.no_grad():
        want = ref.model32(data[1][0][0]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class GRULM(torch.nn.Module):
    def __init__(self, vocab=50, emb=16, hidden=20):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.gru = torch.nn.GRU(emb, hidden, batch_first=True, bidirectional=True)
        self.fc = torch.nn.Linear(2 * hidden, vocab)

    def forward(self, idx):
        h, _ = self.gru(self.emb(idx))
        return self.fc(h)


@pytest.mark.parametrize("name,scheme", [("lstm", "full"), ("lstm", "sparse"), ("gru", "sparse")])
def test_onnx_recurrent_nodes_train_like_pytorch(name, scheme, tmp_path):
    """torch.onnx exports nn.LSTM/nn.GRU as ONNX LSTM/GRU nodes with their own initializers (gates
    reordered, biases concatenated), so the names differ from PyTorch's: the training is judged
    by the losses and by the trained model's outputs against the fp64 run."""
    from numerics import assert_outputs_close
    torch.manual_seed(0)
    model = (MODELS["lstm"]() if name == "lstm" else GRULM()).train()
    data = batches("lstm")
    path = export(model, data[0][0][0], tmp_path / f"{name}.onnx")
    graph = onnx.load(str(path)).graph
    assert {"LSTM" if name == "lstm" else "GRU"} <= {n.op_type for n in graph.node}
    fc = [t.name for t in graph.initializer if t.name.startswith("fc.")]
    update = "full" if scheme == "full" else {n: 1.0 for n in fc}
    torch_update = "full" if scheme == "full" else {"fc.*": 1.0}
    opt = lambda: pe.SGD(lr=0.1, momentum=0.9)  # noqa: E731
    trainer = pe.compile(str(path), *data[0], loss="cross_entropy", update=update, optimizer=opt()).build()
    losses = [trainer.step(*data[i % 3]) for i in range(3)]
    ref = fp64_reference(model, data, "cross_entropy", torch_update, opt(), 3)
    assert_losses_close(losses, ref)
    x = data[1][0][0]
    assert_outputs_close(trainer.forward((x,)), ref.model32, ref.model64, (x,), "output after 3 steps")

    import onnxruntime as ort
    dst = pe.export_onnx(trainer, path, tmp_path / f"{name}_trained.onnx")
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, trainer.forward((x,)), rtol=1e-4, atol=1e-5)


def test_numpy_example_inputs(tmp_path):
    """An ONNX user passes NumPy arrays (what onnxruntime takes): the same program as torch tensors."""
    torch.manual_seed(0)
    model = MODELS["mlp"]().train()
    (x,), (y,) = batches("mlp")[0]
    path = export(model, x, tmp_path / "mlp.onnx")
    want = pe.compile(str(path), (x,), (y,), update=SPARSE["mlp"], name="ox").source()
    assert pe.compile(str(path), (x.numpy(),), (y.numpy(),), update=SPARSE["mlp"], name="ox").source() == want
