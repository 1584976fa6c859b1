"""Frontends reject what they cannot train at compile time, with a PockError naming the node."""
import pytest
import torch

import pockengine as pe

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def test_onnx_unsupported_op_names_the_node_and_op():
    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], name="my_hardmax")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(pe.PockError, match="my_hardmax.*Hardmax"):
        pe.compile(model, (torch.randn(2, 3),), (torch.randn(2, 3),), loss="mse")


def test_missing_model_file_and_unknown_types_are_pock_errors(tmp_path):
    with pytest.raises(pe.PockError, match="does not exist"):
        pe.compile(str(tmp_path / "nope.onnx"), (torch.randn(2, 3),), (torch.randn(2, 3),), loss="mse")
    with pytest.raises(pe.PockError, match="model must be"):
        pe.compile(42, (torch.randn(2, 3),), (torch.randn(2, 3),), loss="mse")


def test_jax_unsupported_primitive_names_the_equation():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def apply(p, x):
        return jnp.sort(x @ p["w"], axis=-1)

    params = {"w": jnp.ones((3, 3), jnp.float32)}
    with pytest.raises(pe.PockError, match="primitive 'sort'"):
        pe.compile(pe.from_jax(apply, params), (torch.randn(2, 3),), (torch.randn(2, 3),), loss="mse")
