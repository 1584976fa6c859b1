"""The IR verifier accepts what pe.compile produces and rejects graphs that
break one of the IR's invariants, with an IRError naming the problem."""
import copy
import re

import pytest
import torch

import pockengine as pe
from models import SPARSE, MLP, TinyMobileNet, batches
from pockengine.ir.graph import Graph, Node, Value
from pockengine.ir.verify import IRError, verify


@pytest.fixture(scope="module")
def mlp_prog():
    torch.manual_seed(0)
    (x,), (y,) = batches("mlp")[0]
    return pe.compile(MLP(), (x,), (y,), optimizer=pe.SGD(lr=0.1, momentum=0.9))


@pytest.fixture
def g(mlp_prog):
    """A private, still valid copy of the compiled MLP's training graph."""
    g = copy.deepcopy(mlp_prog.graph)
    assert verify(g) is g  # the copy is valid: every rejection below is due to the edit alone
    return g


def nodes(g, op):
    return [n for n in g.nodes if n.op == op]


def reject(g, *fragments, stage=""):
    with pytest.raises(IRError) as info:
        verify(g, stage)
    msg = str(info.value)
    assert msg.startswith("IR verification failed"), msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_irerror_is_an_internal_error_not_a_user_error():
    # a broken IR is a compiler bug: it must not be mistaken for bad user input
    assert issubclass(IRError, AssertionError)
    assert not issubclass(IRError, pe.PockError)


def test_accepts_compiled_training_and_inference_graphs(mlp_prog):
    g = mlp_prog.graph
    assert verify(g, "test") is g
    assert verify(mlp_prog.forward_graph) is mlp_prog.forward_graph
    # a real training graph: all three phases, a scalar loss, optimizer state
    assert {n.phase for n in g.nodes} == {"forward", "backward", "update"}
    assert len(nodes(g, "sgd_update")) == 6
    assert g.loss.shape == () and g.loss.dtype == "f32"
    assert any(v.kind == "opt_state" for v in g.state.values())
    assert [tuple(v.shape) for v in mlp_prog.forward_graph.outputs] == [(8, 5)]


def test_accepts_graph_with_state_writes_and_hoisted_slices():
    torch.manual_seed(0)
    (x,), (y,) = batches("cnn")[0]
    prog = pe.compile(TinyMobileNet().train(), (x,), (y,), update=SPARSE["cnn"],
                      optimizer=pe.AdamW(lr=1e-3))
    g = prog.graph
    assert verify(g) is g
    assert len(nodes(g, "assign")) == 12  # running mean/var/num_batches_tracked of 4 BatchNorms
    assert any(n.attrs.get("hoist") for n in g.nodes)
    assert nodes(g, "adamw_update")


def test_accepts_a_hand_built_graph():
    g = Graph("hand")
    x = g.add_input("x", (4, 3), "f32")
    y = g.add_input("y", (4,), "i64", kind="target")
    w = g.add_state("w", (2, 3), "f32", "param")
    logits = g.add("linear", [x, w, None])
    g.loss = g.add("cross_entropy", [logits, y], {"ignore_index": -100, "label_smoothing": 0.0})
    g.outputs = [logits]
    assert verify(g) is g


def test_rejects_read_before_definition(g):
    first, second = g.nodes[0], g.nodes[1]  # linear(input0, ...) then gelu(linear)
    assert second.inputs[0] is first.out
    g.nodes[0], g.nodes[1] = second, first
    reject(g, f"reads {first.out!r} before it is defined", "gelu(")


def test_rejects_read_of_a_value_never_defined(g):
    ghost = Value("ghost", (8, 32), "f32")
    nodes(g, "relu_bwd")[0].inputs[0] = ghost
    reject(g, "reads %ghost:f32[8, 32] before it is defined")


def test_rejects_value_defined_twice(g):
    gelu = nodes(g, "gelu")[0]
    g.nodes.insert(g.nodes.index(gelu) + 1, gelu)
    reject(g, f"{gelu.out!r} is defined twice")


def test_rejects_second_node_defining_an_existing_value(g):
    gelu = nodes(g, "gelu")[0]
    clone = Node("gelu", list(gelu.inputs), [gelu.out], dict(gelu.attrs), gelu.source, "forward")
    g.nodes.insert(g.nodes.index(gelu) + 1, clone)
    reject(g, "%gelu:f32[8, 32] is defined twice")


def test_rejects_output_shape_that_disagrees_with_inference(g):
    lin = nodes(g, "linear")[1]
    lin.out.shape = (8, 31)
    reject(g, f"output %{lin.out.name}:f32[8, 31] should be f32[8, 32]")


def test_rejects_output_dtype_that_disagrees_with_inference(g):
    gelu = nodes(g, "gelu")[0]
    gelu.out.dtype = "i64"
    reject(g, "output %gelu:i64[8, 32] should be f32[8, 32]")


def test_rejects_unknown_op(g):
    nodes(g, "gelu")[0].op = "frobnicate"
    reject(g, "unknown op frobnicate")


def test_rejects_mutating_node_writing_an_activation(g):
    upd = nodes(g, "sgd_update")[0]
    upd.inputs[0] = upd.inputs[1]  # "update" the gradient (a temporary) instead of the parameter
    reject(g, "sgd_update(", f"writes {upd.inputs[1]!r}, which is not a state tensor")


def test_rejects_assign_to_a_user_input(g):
    x = g.inputs[0]
    src = nodes(g, "linear")[0].inputs[0]
    g.nodes.append(Node("assign", [x, src], [], {}, "", "forward"))
    reject(g, "writes %input0:f32[8, 16], which is not a state tensor")


def test_rejects_non_scalar_loss(g):
    logits = nodes(g, "cross_entropy")[0].inputs[0]
    assert logits.shape == (8, 5)
    g.loss = logits
    reject(g, "loss %linear_2:f32[8, 5] is not a defined f32 scalar")


def test_rejects_undefined_scalar_loss(g):
    g.loss = Value("floating", (), "f32")
    reject(g, "loss %floating:f32[] is not a defined f32 scalar")


def test_rejects_undefined_user_output(mlp_prog):
    fg = copy.deepcopy(mlp_prog.forward_graph)
    fg.outputs.append(Value("nowhere", (8, 5), "f32"))
    reject(fg, "output %nowhere:f32[8, 5] is not defined")


def test_message_names_the_stage(g):
    nodes(g, "gelu")[0].op = "frobnicate"
    msg = reject(g, stage="my-pass")
    assert re.match(r"IR verification failed after my-pass: unknown op frobnicate", msg), msg
