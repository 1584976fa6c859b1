"""passes/lm_head.py: the LM head and its cross_entropy fused into linear_cross_entropy in the
training graph (kernels/linear_ce.cpp over tiles, no logits): the step holds no tokens x vocabulary
buffer, trains like PyTorch fp64 (tied GPT-2 with ignored targets, untied Llama, a frozen head)
and forward() still returns the logits."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontends"))

import hf_zoo  # noqa: E402
import pockengine as pe  # noqa: E402
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference  # noqa: E402
from pockengine.compiler.program import resolve_update  # noqa: E402
from pockengine.passes import lm_head as lm_head_pass  # noqa: E402


@pytest.fixture(autouse=True)
def fuse_tiny_heads(monkeypatch):
    """Tiny models' logits fit in one tile, where the pass leaves them: fuse them here."""
    from pockengine.passes import lm_head
    monkeypatch.setattr(lm_head, "MIN_LOGITS", 0)


def _no_logits(prog, tokens, vocab):
    """The fused op in the training graph, and nothing there computes logits or their gradient:
    no cross_entropy(_bwd), and the head's weight is read by no other product."""
    ops = [n.op for n in prog.graph.nodes]
    assert "linear_cross_entropy" in ops and "linear_cross_entropy_bwd" in ops, ops
    assert "cross_entropy" not in ops and "cross_entropy_bwd" not in ops, ops
    (fused,) = [n for n in prog.graph.nodes if n.op == "linear_cross_entropy"]
    head = fused.inputs[1]
    readers = {n.op for n in prog.graph.nodes if head in n.inputs}
    assert readers <= {"linear_cross_entropy", "linear_cross_entropy_bwd", "embedding", "reshape", "sgd_update"}, readers
    assert fused.outputs[2].numel < tokens * vocab or tokens * vocab <= 256 * 64  # one tile at most
    assert "linear" in [n.op for n in prog.forward_graph.nodes]  # inference keeps the logits


def _targets(y):
    t = y.clone()
    t[0, :3] = -100  # ignored positions: the mean runs over the others
    return t


@pytest.mark.parametrize("family,update", [
    ("gpt2", "full"),                                                      # tied head: dW onto the embedding's
    ("llama", "full"),                                                     # untied head with its own dW
    ("llama", {"model.layers.1.*": 1.0, "model.norm.weight": 1.0}),        # a frozen head: dx only
])
def test_fused_head_trains_like_fp64(family, update):
    torch.manual_seed(0)
    model, x, y, loss, output = getattr(hf_zoo, family)()
    original = copy.deepcopy(model.state_dict())
    data = [(x, (_targets(y[0]),)), (((x[0] + 1) % hf_zoo.V,), ((y[0] + 1) % hf_zoo.V,))]
    opt = lambda: pe.SGD(lr=0.05, momentum=0.9)  # noqa: E731
    ref = fp64_reference(model, data, loss, update, opt(), len(data))
    prog = pe.compile(model, x, data[0][1], loss=loss, update=update, optimizer=opt(), output=output)
    _no_logits(prog, hf_zoo.B * hf_zoo.T, hf_zoo.V)
    trainer = prog.build()
    logits = trainer.forward(*x)
    assert tuple(np.asarray(logits).shape) == (hf_zoo.B, hf_zoo.T, hf_zoo.V)
    losses = [trainer.step(*d[0], *d[1]) for d in data]
    trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)


def test_label_smoothing_keeps_the_logits():
    from pockengine.ir.graph import Graph
    from pockengine.passes.lm_head import fuse_lm_head
    g = Graph("t")
    x = g.add_input("x", (2, 3, 8), "f32")
    w = g.add_state("w", (10, 8), "f32", "param")
    t = g.add_input("t", (6,), "i64", kind="target")
    z = g.add("reshape", [g.add("linear", [x, w, None])], {"shape": (6, 10)})
    g.loss = g.add("cross_entropy", [z, t], {"ignore_index": -100, "label_smoothing": 0.1})
    assert [n.op for n in fuse_lm_head(g).nodes] == ["linear", "reshape", "cross_entropy"]
    g.nodes[2].attrs["label_smoothing"] = 0.0
    assert [n.op for n in fuse_lm_head(g).nodes] == ["linear_cross_entropy"]


@pytest.mark.parametrize("frozen_dtype", ["q4"])  # bf16 and int8 pass too (the same emitter path; kept fast)
def test_a_low_precision_frozen_head_is_read_in_place(monkeypatch, frozen_dtype):
    """A frozen head stored in q4 (its scale beside it) feeds the fused op in place: the fused
    step trains like the unfused one over the same stored weights."""
    from pockengine.passes import lm_head
    torch.manual_seed(0)
    model, x, y, loss, output = hf_zoo.llama()
    update = {"model.layers.1.*": 1.0}
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(lm_head, "MIN_LOGITS", 0 if fused else 1 << 40)
        prog = pe.compile(model, x, y, loss=loss, update=update, optimizer=pe.SGD(lr=0.05), output=output,
                          frozen_dtype=frozen_dtype, name=f"lce_{frozen_dtype}_{fused}")
        assert ("linear_cross_entropy" in [n.op for n in prog.graph.nodes]) == fused
        head = prog.state["lm_head.weight"]
        assert head.dtype == {"bf16": "bf16", "int8": "i8", "q4": "q4"}[frozen_dtype]
        trainer = prog.build()
        runs.append(([trainer.step(*x, *y) for _ in range(2)], trainer.state_dict()))
    (l0, s0), (l1, s1) = runs
    np.testing.assert_allclose(l0, l1, rtol=1e-5)
    for k in s0:
        np.testing.assert_allclose(np.asarray(s0[k], np.float64), np.asarray(s1[k], np.float64), rtol=1e-4, atol=1e-6,
                                   err_msg=k)


DEFAULT_MIN_LOGITS = lm_head_pass.MIN_LOGITS  # read at import, before fuse_tiny_heads sets 0


class _TinyLM(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, idx):
        return self.head(self.emb(idx))


@pytest.mark.parametrize("vocab,fused", [(8000, False), (8256, True)])
def test_default_threshold_keeps_a_mid_sized_heads_logits(monkeypatch, vocab, fused):
    """At the default MIN_LOGITS (16 MiB) the keyboard transformer of `make bench` (8 x 64 tokens,
    vocab 8000: 15.6 MiB of logits) keeps its plain head and cross_entropy (no recompute of the
    logits in the backward: 21% less CPU per step, issue 39); just over 16 MiB fuses."""
    monkeypatch.setattr(lm_head_pass, "MIN_LOGITS", DEFAULT_MIN_LOGITS)
    torch.manual_seed(0)
    x, y = (torch.randint(0, vocab, (8, 64)) for _ in range(2))
    prog = pe.compile(_TinyLM(vocab), (x,), (y,), loss="cross_entropy", update="full", optimizer=pe.SGD(lr=0.1))
    ops = [n.op for n in prog.graph.nodes]
    assert ("linear_cross_entropy" in ops) == fused, ops
    assert ("cross_entropy" in ops) != fused, ops


@pytest.mark.parametrize("update,in_forward", [
    ({"model.layers.1.*": 1.0}, True),   # a frozen head: its dx comes from the forward's pass
    ("full", False),                     # a trained head: dW needs the backward's recomputed logits
])
def test_a_frozen_heads_input_gradient_is_computed_in_the_forward(update, in_forward):
    """passes/lm_head.head_dx_in_forward: with no dW and no db wanted, the forward node also gives
    dx of the unit loss gradient (a 4th output) and the backward node only scales it; the head's
    products per step drop from three to two."""
    torch.manual_seed(0)
    model, x, y, loss, output = hf_zoo.llama()
    prog = pe.compile(model, x, y, loss=loss, update=update, optimizer=pe.SGD(lr=0.05), output=output)
    (fwd,) = [n for n in prog.graph.nodes if n.op == "linear_cross_entropy"]
    (bwd,) = [n for n in prog.graph.nodes if n.op == "linear_cross_entropy_bwd"]
    assert ("dx" in fwd.attrs) == in_forward == bool(bwd.attrs.get("dx_in_forward"))
    if in_forward:
        assert len(fwd.outputs) == 4 and bwd.inputs[6] is fwd.outputs[3]
        assert fwd.outputs[3].shape == fwd.inputs[0].shape
        assert bwd.outputs[1:] == [None, None, bwd.outputs[3]] and bwd.outputs[3].shape == (1,)
