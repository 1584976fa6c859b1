"""Scheduling (when each node runs) and dead-code elimination."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from models import MODELS, SPARSE, TinyMobileNet, batches
from pockengine.frontends.torch_export import export_graph
from pockengine.ir.graph import Graph
from pockengine.ir.verify import verify
from pockengine.passes.dce import eliminate_dead_code
from pockengine.passes.schedule import schedule

UPDATES = ("sgd_update", "adamw_update")


class ConvBNConv(nn.Module):
    """A 1x1 conv whose input is a BatchNorm output: the hoisted slice's producer also feeds state writes."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.c2(self.bn(self.c1(x))).mean((2, 3)))


CASES = {
    "mlp-full-sgd": (lambda: MODELS["mlp"](), "mlp", "full", lambda: pe.SGD(lr=0.1, momentum=0.9)),
    "mlp-sparse": (lambda: MODELS["mlp"](), "mlp", {"net.2.weight": 0.5, "net.0.weight": 0.25},
                   lambda: pe.SGD(lr=0.1)),
    "gpt-full-adamw": (lambda: MODELS["gpt"](), "gpt", "full", lambda: pe.AdamW(lr=1e-3)),
    "cnn-full": (lambda: TinyMobileNet().train(), "cnn", "full", lambda: pe.SGD(lr=0.1, momentum=0.9)),
    "cnn-sparse": (lambda: TinyMobileNet().train(), "cnn", SPARSE["cnn"], lambda: pe.AdamW(lr=1e-3)),
    "lstm-sparse": (lambda: MODELS["lstm"](), "lstm", SPARSE["lstm"], lambda: pe.SGD(lr=0.1, momentum=0.9)),
    "convbn-sparse": (ConvBNConv, "cnn", {"c2.weight": 0.5, "fc.*": 1.0}, lambda: pe.SGD(lr=0.1)),
}
_CACHE = {}


def prog(case):
    if case not in _CACHE:
        make, data, update, opt = CASES[case]
        torch.manual_seed(0)
        inputs, targets = batches(data)[0]
        _CACHE[case] = pe.compile(make(), inputs, targets, update=update, optimizer=opt(), exact_skip=False)
    return _CACHE[case]


def check_valid(g, order):
    """order is a permutation of g's nodes in which every value is defined before it is read
    and every state tensor is written only after all its other readers."""
    assert len(order) == len(g.nodes) and {id(n) for n in order} == {id(n) for n in g.nodes}
    pos = {id(n): i for i, n in enumerate(order)}
    for i, n in enumerate(order):
        for v in n.inputs:
            if v is not None and v.producer is not None:
                assert pos[id(v.producer)] < i, f"{n!r} reads {v!r} before it is produced"
    for w in order:
        for m in w.mutates:
            for r in order:
                if r is not w and any(v is m for v in r.inputs):
                    assert pos[id(r)] < pos[id(w)], f"{r!r} reads {m!r} after {w!r} writes it"


def deps_of_update(order, u):
    """Index of the last node u must wait for: its gradient's producer and every other reader of what it writes."""
    pos = {id(n): i for i, n in enumerate(order)}
    deps = [-1]
    for v in u.inputs:
        if v is not None and v.producer is not None:
            deps.append(pos[id(v.producer)])
    for m in u.mutates:
        deps += [pos[id(r)] for r in order if r is not u and any(v is m for v in r.inputs)]
    return max(deps)


@pytest.mark.parametrize("reorder", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_is_a_valid_order(case, reorder):
    g = prog(case).graph
    check_valid(g, schedule(g, reorder=reorder))


@pytest.mark.parametrize("case", sorted(CASES))
def test_program_uses_the_reordered_schedule(case):
    p = prog(case)
    assert [id(n) for n in p.order] == [id(n) for n in schedule(p.graph, reorder=True)]


def test_exact_skip_program_runs_updates_after_the_backward():
    """pe.compile's default exact_skip=True: the unreordered schedule (updates last)."""
    make, data, update, opt = CASES["mlp-full-sgd"]
    torch.manual_seed(0)
    p = pe.compile(make(), *batches(data)[0], update=update, optimizer=opt())
    assert [id(n) for n in p.order] == [id(n) for n in schedule(p.graph, reorder=False)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_reorder_runs_each_update_right_after_its_gradient(case):
    g = prog(case).graph
    order = schedule(g, reorder=True)
    updates = [n for n in order if n.op in UPDATES]
    assert updates
    for u in updates:
        p = order.index(u)
        d = deps_of_update(order, u)
        assert d < p
        between = order[d + 1:p]
        assert all(n.mutates for n in between), \
            f"{u!r} waits behind {[n.op for n in between if not n.mutates]}"
        param = u.inputs[0]
        assert all(order.index(r) < p for r in order if r is not u and param in r.inputs)


def test_reorder_interleaves_updates_with_the_backward():
    order = schedule(prog("mlp-full-sgd").graph, reorder=True)
    last_bwd = max(i for i, n in enumerate(order) if n.phase == "backward")
    early = [n for n in order[:last_bwd] if n.op in UPDATES]
    # net.4 and net.2 are updated before the backward reaches net.0
    assert {n.inputs[0].name for n in early} >= {"net.4.weight", "net.4.bias", "net.2.weight", "net.2.bias"}
    # net.4.weight is read by the backward (to propagate to net.2): its update waits for that read
    w4 = next(n for n in order if n.op in UPDATES and n.inputs[0].name == "net.4.weight")
    reader = next(n for n in order if n.phase == "backward" and w4.inputs[0] in n.inputs)
    assert order.index(reader) < order.index(w4)


def test_reorder_waits_for_every_use_of_a_tied_parameter():
    g = prog("gpt-full-adamw").graph
    order = schedule(g, reorder=True)
    tok = g.state["tok.weight"]
    (u,) = [n for n in order if n.op == "adamw_update" and n.inputs[0] is tok]
    readers = [n for n in order if n is not u and tok in n.inputs]
    assert {n.op for n in readers} >= {"embedding", "linear"} and any(n.phase == "backward" for n in readers)
    assert order.index(u) > max(order.index(n) for n in readers)
    # the sum of both uses' gradients: the embedding's rows summed onto the head's (autodiff sum_grads)
    total = u.inputs[1].producer
    assert total.op == "embedding_bwd" and total.inputs[2].producer.op == "linear_bwd_weight"


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_reorder_runs_updates_after_the_whole_backward(case):
    g = prog(case).graph
    order = schedule(g, reorder=False)
    last_bwd = max(i for i, n in enumerate(order) if n.phase == "backward")
    ups = [i for i, n in enumerate(order) if n.op in UPDATES]
    assert ups and min(ups) > last_bwd
    assert len(ups) == sum(n.op in UPDATES for n in g.nodes)
    # the updates keep the order the optimizer emitted them in
    assert [order[i] for i in ups] == [n for n in g.nodes if n.op in UPDATES]


@pytest.mark.parametrize("reorder", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_other_nodes_keep_program_order(case, reorder):
    g = prog(case).graph
    order = schedule(g, reorder=reorder)
    plain = lambda nodes: [id(n) for n in nodes if not n.mutates and not n.attrs.get("hoist")]  # noqa: E731
    assert plain(order) == plain(g.nodes)


@pytest.mark.parametrize("reorder", [True, False])
@pytest.mark.parametrize("case", ["mlp-sparse", "cnn-sparse", "lstm-sparse", "convbn-sparse"])
def test_hoisted_slices_run_right_after_their_input_is_produced(case, reorder):
    g = prog(case).graph
    order = schedule(g, reorder=reorder)
    hoisted = [n for n in order if n.attrs.get("hoist")]
    assert hoisted
    for h in hoisted:
        assert h.op == "slice" and h.phase == "forward"
        i = order.index(h)
        producer = h.inputs[0].producer
        start = 0 if producer is None else order.index(producer) + 1
        # only other hoisted slices or state writes may sit in between
        assert all(n.attrs.get("hoist") or n.mutates for n in order[start:i]), \
            [n.op for n in order[start:i]]
        # so the slice is taken before any other forward computation
        assert i < min(j for j, n in enumerate(order) if j >= start and not n.attrs.get("hoist") and not n.mutates)


def test_hoisted_slice_of_an_activation_follows_its_producer():
    g = prog("mlp-sparse").graph
    order = schedule(g, reorder=True)
    by_input = {n.inputs[0].name: n for n in order if n.attrs.get("hoist")}
    assert set(by_input) == {"input0", "gelu"}
    assert order[0] is by_input["input0"]
    gelu = by_input["gelu"].inputs[0].producer
    assert gelu.op == "gelu"
    assert order[order.index(gelu) + 1] is by_input["gelu"]
    assert by_input["gelu"].out.shape == (8, 16)  # ceil(0.5 * 32) of gelu's 32 channels
    # in program order the slice was emitted by autodiff, after the whole forward
    assert g.nodes.index(by_input["gelu"]) > g.nodes.index(g.loss.producer)


# ---- dead-code elimination ---------------------------------------------------------


def test_dce_removes_an_unused_branch_and_keeps_state_writes():
    g = Graph("hand")
    x = g.add_input("x", (4, 3), "f32")
    y = g.add_input("y", (4,), "i64", kind="target")
    w = g.add_state("w", (2, 3), "f32", "param")
    stat = g.add_state("stat", (4, 3), "f32", "buffer")
    logits = g.add("linear", [x, w, None], source="fc")
    dead1 = g.add("relu", [x], source="unused")
    g.add("mul", [dead1, dead1], source="unused")
    kept = g.add("tanh", [x], source="stat")
    g.add("assign", [stat, kept], source="stat")
    g.loss = g.add("cross_entropy", [logits, y], {"ignore_index": -100, "label_smoothing": 0.0}, source="loss")
    g.add("exp", [g.loss], source="after-loss")  # computed from the loss but used by nothing
    assert len(g.nodes) == 7
    eliminate_dead_code(g)
    verify(g)
    assert [n.op for n in g.nodes] == ["linear", "tanh", "assign", "cross_entropy"]


def test_dce_removes_an_unused_output_of_a_real_model():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 5)
            self.aux = nn.Linear(16, 3)

        def forward(self, x):
            return self.fc(x), torch.tanh(self.aux(x))

    torch.manual_seed(0)
    (x,), (y,) = batches("mlp")[0]
    model = TwoHeads().eval()
    g = export_graph(model, (x,))
    assert {n.source.split(" ")[0] for n in g.nodes} >= {"fc", "aux"}
    before = len(g.nodes)
    g.outputs = g.outputs[:1]  # nobody wants the auxiliary head any more
    eliminate_dead_code(g)
    verify(g)
    assert len(g.nodes) == before - 2
    assert [n.op for n in g.nodes] == ["linear"] and g.nodes[0].source.startswith("fc")

    # compiled: the loss reads only the first output, so no aux node is trained; inference keeps both
    prog = pe.compile(model, (x,), (y,), optimizer=pe.SGD(lr=0.1))
    assert not any(n.source.startswith("aux") for n in prog.graph.nodes)
    assert not any(n.op in UPDATES and n.inputs[0].name.startswith("aux.") for n in prog.graph.nodes)
    assert any(n.source.startswith("aux") for n in prog.forward_graph.nodes)
    assert [v.shape for v in prog.forward_graph.outputs] == [(8, 5), (8, 3)]


def test_dce_keeps_batchnorm_running_stat_writes():
    torch.manual_seed(0)
    (x,), (y,) = batches("cnn")[0]
    model = TinyMobileNet().train()
    g = export_graph(model, (x,), (y,), "cross_entropy")
    assigns = [n for n in g.nodes if n.op == "assign"]
    eliminate_dead_code(g)
    assert [n for n in g.nodes if n.op == "assign"] == assigns
    written = sorted(n.inputs[0].name for n in assigns)
    assert written == sorted(f"bn{i}.{s}" for i in range(4)
                             for s in ("running_mean", "running_var", "num_batches_tracked"))
    # also after autodiff, even when nothing that reads the statistics is trained
    prog = pe.compile(model, (x,), (y,), update={"fc.*": 1.0})
    assert len([n for n in prog.graph.nodes if n.op == "assign"]) == 12


class SideBN(nn.Module):
    """Calls a BatchNorm only for its running statistics; its output is unused."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        self.bn(x)
        return self.fc(x)


def test_dce_keeps_a_batchnorm_whose_output_is_unused():
    torch.manual_seed(0)
    data = batches("mlp")
    model = SideBN().train()
    ref = SideBN().train()
    ref.load_state_dict(model.state_dict())
    prog = pe.compile(model, *data[0], optimizer=pe.SGD(lr=0.1))
    ops = [n.op for n in prog.graph.nodes]
    assert "batch_norm_train" in ops and ops.count("assign") == 3
    trainer = prog.build()
    for inputs, targets in data:
        trainer.step(inputs, targets)
        with torch.no_grad():
            ref(*inputs)
    sd = trainer.state_dict()
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        want = ref.state_dict()[name].numpy()
        assert not np.array_equal(want, model.state_dict()[name].numpy())  # they did move
        np.testing.assert_allclose(sd[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
