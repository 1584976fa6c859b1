"""pe.compile takes example inputs/targets of any array type (NumPy, JAX, TensorFlow: what
has __array__), converted to torch; an element of another type is named by its index."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.frontends.torch_export import check_example

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import MLP, batches  # noqa: E402


class ArrayLike:
    """An array type PockEngine does not know (as a JAX or TensorFlow tensor): only __array__."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


def test_numpy_examples_compile_the_same_program():
    (x,), (y,) = batches("mlp")[0]
    torch.manual_seed(0)
    model = MLP()
    want = pe.compile(model, (x,), (y,), name="arr").source()
    assert pe.compile(model, (x.numpy(),), (y.numpy(),), name="arr").source() == want
    assert pe.compile(model, x.numpy().astype(np.float64), ArrayLike(y.numpy()), name="arr").source() == want


def test_array_types_are_converted():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    (t,) = check_example((a,), "example_inputs")
    assert t.dtype == torch.float32 and t.tolist() == a.tolist()  # float64 arrays become float32
    (t,) = check_example(ArrayLike(np.array([1, 2], dtype=np.int64)), "example_targets")
    assert t.dtype == torch.int64
    assert list(check_example({"idx": np.zeros((1, 4), np.int64)}, "example_inputs")[0].shape) == [1, 4]


def test_int32_arrays_become_int64():
    """JAX's and TensorFlow's default integers (int32) are PyTorch's index type, int64: every
    value kept; a torch tensor keeps its own dtype (as PyTorch, which rejects int32 targets)."""
    a = np.array([[0, 2**31 - 1, -2**31]], np.int32)
    (t,) = check_example(ArrayLike(a), "example_targets")
    assert t.dtype == torch.int64 and t.tolist() == a.tolist()
    assert check_example((np.zeros(2, np.uint8),), "example_inputs")[0].dtype == torch.uint8
    assert check_example((torch.zeros(2, dtype=torch.int32),), "example_inputs")[0].dtype == torch.int32
    (x,), (y,) = batches("mlp")[0]
    torch.manual_seed(0)
    model = MLP()
    want = pe.compile(model, (x,), (y,), name="arr").source()
    assert pe.compile(model, (x.numpy(),), (y.numpy().astype(np.int32),), name="arr").source() == want


@pytest.mark.parametrize("bad, message", [
    ((np.zeros(3, np.float32), "text"), r"example_inputs\[1\] is a str"),
    ([torch.zeros(2), [1.0, 2.0]], r"example_inputs\[1\] is a list"),
    ((np.array(["a", "b"]),), r"example_inputs\[0\] is a ndarray of dtype <U1"),
    ((np.zeros(2, np.complex64),), r"example_inputs\[0\].*complex"),
    (3, "got int"),
])
def test_a_wrong_element_is_named(bad, message):
    with pytest.raises(pe.PockError, match=message):
        check_example(bad, "example_inputs")
