"""The frozen-prefix split: which ops form the prefix, the prefix as a torch
module, and the suffix step fed by it matching the unsplit step."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from models import MODELS, SPARSE, batches
from pockengine.backends.prefix_torch import PrefixModule, torch_runner
from pockengine.build.prefix_stage import PrefixTrainer
from pockengine.passes.prefix import split_prefix

ROOT = Path(__file__).resolve().parents[2]


def conv_bn(cin, cout, k=3, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(conv_bn(cin, hidden, 1), conv_bn(hidden, hidden, 3, stride, groups=hidden),
                                  conv_bn(hidden, cout, 1, act=False))

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class SmallMobileNetV2(nn.Module):
    """MobileNetV2's structure at toy width: stem, inverted residuals, 1x1 head, classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(conv_bn(3, 8, 3, 2), InvertedResidual(8, 8, 1, 2),
                                      InvertedResidual(8, 12, 2, 2), InvertedResidual(12, 12, 1, 2),
                                      conv_bn(12, 32, 1))
        self.classifier = nn.Linear(32, classes)

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


MBV2_UPDATE = {"features.3.*": 1.0, "features.4.*": 1.0, "classifier.*": 1.0}


def mobilenet_spec(seed=0):
    """The sparse MobileNetV2 case: blocks 0-2 frozen with their BatchNorms in eval(), the rest trained."""
    torch.manual_seed(seed)
    model = SmallMobileNetV2().train()
    for m in model.features[:3]:
        m.eval()
    g = torch.Generator().manual_seed(seed)
    data = [((torch.randn(2, 3, 32, 32, generator=g),), (torch.randint(0, 10, (2,), generator=g),))
            for _ in range(3)]
    return model, data


def keyboard_spec():
    sys.path.insert(0, str(ROOT / "demo-apps" / "keyboard" / "model"))
    try:
        import spec
    finally:
        sys.path.pop(0)
    s = spec.make_sparse()
    data = [((x,), (y,)) for x, y in (spec.example_batch(i) for i in range(3))]
    return s, data


def _case(name):
    if name == "keyboard":
        s, data = keyboard_spec()
        prog = pe.compile(**s)
        return s["model"], prog, data
    if name == "mbv2":
        model, data = mobilenet_spec()
        prog = pe.compile(model, *data[0], update=MBV2_UPDATE, optimizer=pe.SGD(lr=0.05, momentum=0.9))
        return model, prog, data
    torch.manual_seed(0)
    model = MODELS[name]()
    if name == "cnn":
        model.eval()  # the frozen stem's BatchNorms use running statistics
    data = batches(name)
    prog = pe.compile(model, *data[0], update=SPARSE[name], optimizer=pe.AdamW(lr=1e-3))
    return model, prog, data


@pytest.fixture(scope="module", params=["keyboard", "mbv2", "cnn", "lstm"])
def case(request):
    model, prog, data = _case(request.param)
    prefix, suffix = split_prefix(prog)
    return request.param, model, prog, data, prefix, suffix


EXPECTED_OPS = {
    "keyboard": ["embedding"],
    "lstm": ["embedding"],
    "cnn": ["conv2d", "batch_norm_eval"] * 3,
}


def test_prefix_is_the_frozen_forward_work(case):
    name, model, prog, data, prefix, suffix = case
    assert prefix is not None
    if name in EXPECTED_OPS:
        assert [n.op for n in prefix.nodes] == EXPECTED_OPS[name]
    # no prefix node is trained, and the suffix has no prefix work left
    assert not any(v.name in prog.trained for n in prefix.nodes for v in n.inputs if v is not None)
    assert len(suffix.graph.nodes) < len(prog.graph.nodes)
    assert [v.name for v in suffix.graph.inputs] == [v.name for v in suffix.forward_graph.inputs]
    assert [o["name"] for o in prefix.outputs] == [v.name for v in suffix.graph.inputs][len(prefix.kept_inputs):]
    # the frozen state only the prefix reads leaves the compiled step
    for s in prefix.state_names():
        assert s in prog.state
    if name in ("keyboard", "lstm"):
        assert "emb.weight" not in suffix.state and prefix.kept_inputs == []
    assert suffix.stats()["state_bytes"] < prog.stats()["state_bytes"]


def test_prefix_module_computes_the_models_values(case):
    """The module equals the PyTorch model's own layers (eval semantics), and traces."""
    name, model, prog, data, prefix, suffix = case
    x = data[0][0][0]
    with torch.no_grad():
        got = PrefixModule(prefix)(x)
        if name in ("keyboard", "lstm"):
            np.testing.assert_array_equal(got.numpy(), model.emb(x).numpy())
        if name == "mbv2":  # the frozen blocks 0-2 in eval mode; block 3 reads their output twice
            model.features[:3].eval()  # (pe.compile's model.train(was_training) put them back in train mode)
            torch.testing.assert_close(got, model.features[:3](x), rtol=1e-5, atol=1e-6)
        traced = torch.jit.trace(PrefixModule(prefix), prefix.example_inputs)
        torch.testing.assert_close(traced(*prefix.example_inputs), PrefixModule(prefix)(*prefix.example_inputs))
    m = prefix.manifest(files={"onnx": "prefix.onnx"}, soc=None, precision="fp32")
    assert m["inputs"] == prefix.inputs and m["outputs"] == prefix.outputs and m["files"]["onnx"] == "prefix.onnx"


def test_suffix_step_with_torch_prefix_matches_the_unsplit_step(case):
    name, model, prog, data, prefix, suffix = case
    full = prog.build_cpu()
    split = PrefixTrainer(prog, prefix, suffix.build_cpu(), torch_runner(prefix))
    before = full.state_dict()
    for i in range(3):
        a, b = full.step(*data[i]), split.step(*data[i])
        np.testing.assert_allclose(b, a, rtol=1e-5)
    got, want = split.state_dict(), full.state_dict()
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        if k not in prog.trained and k in dict(model.named_parameters()):
            assert np.array_equal(got[k], before[k]), f"frozen {k} changed"
    np.testing.assert_allclose(split.forward(data[1][0]), full.forward(data[1][0]), rtol=1e-5, atol=1e-5)
    assert split.step_count == 3
    # the prefix weights are baked in: loading them unchanged is fine, changing them is an error
    split.load_state_dict(got)
    frozen = prefix.state_names()[0]
    bad = dict(got)
    bad[frozen] = got[frozen] + 1
    with pytest.raises(pe.PockError, match="frozen in the prefix"):
        split.load_state_dict(bad)
    split.close()
    full.close()


def test_no_prefix_when_nothing_frozen_comes_first():
    for name in ("mlp", "gpt"):  # the first layer is (partly) trained
        model, prog, data = _case(name)
        prefix, same = split_prefix(prog)
        assert prefix is None and same is prog
    torch.manual_seed(0)
    data = batches("lstm")
    prog = pe.compile(MODELS["lstm"](), *data[0], update="full")
    assert split_prefix(prog) == (None, prog)


def test_train_mode_batchnorm_stays_in_the_step():
    """A frozen BatchNorm left in train() updates its running statistics: it is not prefix work."""
    torch.manual_seed(0)
    model = MODELS["cnn"]().train()
    data = batches("cnn")
    prog = pe.compile(model, *data[0], update=SPARSE["cnn"])
    prefix, suffix = split_prefix(prog)
    assert [n.op for n in prefix.nodes] == ["conv2d"]


def test_train_and_eval_prefixes_that_differ_are_an_error():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 16), nn.Linear(16, 4)).train()
    prog = pe.compile(model, (torch.randn(4, 8),), (torch.randint(0, 4, (4,)),), update={"4.*": 1.0})
    with pytest.raises(pe.PockError, match=r"dropout in 2 \(Dropout\).*eval\(\)"):
        split_prefix(prog)
    model[2].eval()
    prefix, _ = split_prefix(pe.compile(model, (torch.randn(4, 8),), (torch.randint(0, 4, (4,)),),
                                        update={"4.*": 1.0}))
    assert [n.op for n in prefix.nodes] == ["linear", "linear"]


def test_the_cut_pairs_nodes_by_origin(case):
    """Each inference node carries the training-graph node it was derived from (passes/inference.py);
    the prefix is those nodes in both graphs: no structural matching."""
    name, model, prog, data, prefix, suffix = case
    train = {n.origin: n for n in prog.graph.nodes if n.origin is not None}
    assert all(n.origin is not None for n in prog.forward_graph.nodes)
    for n in prefix.nodes:
        t = train[n.origin]
        assert (t.op, t.attrs, t.source) == (n.op, n.attrs, n.source)
    import pockengine.passes.prefix as mod
    assert not any(hasattr(mod, f) for f in ("_node_sig", "_signatures", "_match"))


class TrainingScale(nn.Module):
    """Branches on self.training other than for dropout: the model is exported twice."""

    def forward(self, x):
        return x * 2.0 if self.training else x


def test_a_model_exported_twice_is_cut_at_the_same_nodes():
    """Two exports (the model reads self.training): the eval export's nodes are numbered as the
    training export's that compute the same (passes/inference.share_origins), so the split is the same cut."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), TrainingScale(), nn.Linear(16, 4)).train()
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    prog = pe.compile(model, (x,), (y,), update={"3.*": 1.0})
    assert not any(n.op == "mul_scalar" for n in prog.forward_graph.nodes)  # the eval export's own graph
    prefix, suffix = split_prefix(prog)
    assert [(n.op, n.attrs.get("act")) for n in prefix.nodes] == [("linear", "relu")]
    with torch.no_grad():
        torch.testing.assert_close(PrefixModule(prefix)(x), model[1](model[0](x)))
    assert "0.weight" not in suffix.state and "0.weight" not in suffix.forward_graph.state
