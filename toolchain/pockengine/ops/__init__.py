"""The IR ops: one `OpRecord` per op (ops/record.py), registered by family.

    dense.py      linear, matmul, embedding
    conv.py       conv2d, max/avg/adaptive-avg pooling
    norm.py       layer_norm, rms_norm, batch_norm
    pointwise.py  activations, unary maths, scalar and broadcast binary ops, where, compare,
                  cast, cos/sin, cumsum, swiglu
    reduce.py     sum, mean, sum_to, softmax, log_softmax
    attention.py  sdpa, rope
    layout.py     reshape, permute, expand, slice, cat, full
    rnn.py        lstm, gru
    loss.py       dropout, cross_entropy, nll_loss, mse_loss
    state.py      assign, sgd_update, adamw_update, transfers between backends

Each family module keeps an op's forward and backward records side by side. Adding an op:
its record here, its kernel (native/runtime/kernels + pock_kernels.h) and its test
(docs/adding_an_op.md).
"""
from . import attention, conv, dense, layout, loss, norm, pointwise, reduce, rnn, state  # noqa: F401  (they register)
from .record import FULL, REGISTRY, OpRecord, bwd, flops, infer, register

__all__ = ["FULL", "REGISTRY", "OpRecord", "bwd", "flops", "infer", "register", "get"]


def get(op: str) -> OpRecord:
    """The record of an IR op (KeyError naming it when there is none)."""
    if op not in REGISTRY:
        raise KeyError(f"unknown IR op '{op}'")
    return REGISTRY[op]
