"""The pointwise-family kernels' test shim (shims/pointwise_shim.cpp) and the helpers
test_kernels_pointwise.py and test_kernels_pointwise_threads.py share."""
import ctypes

import numpy as np
import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6

vp, i64, f32, f64, cint, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_double, ctypes.c_int, ctypes.c_uint64
SIGS = {
    "pw_act_fwd": [cint, vp, vp, i64, f32, f32],
    "pw_act_bwd": [cint, vp, vp, vp, i64, f32, f32],
    "pw_unary": [cint, vp, vp, i64],
    "pw_scalar": [cint, vp, vp, i64, f32],
    "pw_pow_bwd": [vp, vp, vp, i64, f32],
    "pw_binary": [cint, vp, vp, vp, cint, vp, vp, vp],
    "pw_where": [vp, vp, vp, vp, cint, vp, vp, vp, vp],
    "pw_reduce_sum": [vp, vp, cint, vp, vp, f32],
    "pw_strided_copy": [cint, vp, vp, cint, vp, vp, i64, vp, i64],
    "pw_fill": [cint, vp, i64, f64, i64],
    "pw_softmax": [cint, cint, vp, vp, vp, i64, i64, i64],
    "pw_ce_fwd": [vp, vp, vp, i64, i64, i64, f32],
    "pw_ce_bwd": [vp, vp, vp, vp, i64, i64, i64, f32],
    "pw_nll_fwd": [vp, vp, vp, i64, i64, i64],
    "pw_nll_bwd": [vp, vp, vp, i64, i64, i64],
    "pw_mse_fwd": [vp, vp, vp, i64],
    "pw_mse_bwd": [vp, vp, vp, vp, vp, i64],
    "pw_sdpa_fwd": [vp, vp, vp, vp, vp, vp, vp, f32, cint, cint],
    "pw_sdpa_bwd": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f32, cint, cint],
    "pw_sdpa_fwd_ex": [vp, vp, vp, vp, vp, vp, vp, f32, cint, cint],
    "pw_sdpa_bwd_ex": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f32, cint, cint],
    "pw_dropout_fwd": [vp, vp, vp, i64, f32, u64],
    "pw_dropout_bwd": [vp, vp, vp, i64, f32],
    "pw_sgd": [vp, vp, vp, i64, i64, i64, f32, f32, f32, f32, cint, cint],
    "pw_adamw": [vp, vp, vp, vp, i64, i64, i64, f32, f32, f32, f32, f32, i64],
    "pw_use_threads": [cint],
    "pw_layer_norm_fwd": [vp] * 6 + [i64, i64, f32],
    "pw_layer_norm_bwd": [vp] * 8 + [i64, i64],
}


def load(shim_builder):
    """The shim library with every entry point's ctypes signature set."""
    L = shim_builder("pointwise_shim.cpp")
    for name, args in SIGS.items():
        getattr(L, name).argtypes = args
        getattr(L, name).restype = None
    L.pw_num_threads.argtypes, L.pw_num_threads.restype = [], cint
    return L


def P(a):
    """ctypes pointer to an array's first element (views allowed); keeps the array alive."""
    return None if a is None else a.ctypes.data_as(vp)


def I(xs):
    return np.ascontiguousarray(list(xs) if not isinstance(xs, np.ndarray) else xs, dtype=np.int64)


def rnd(rng, *shape, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale).astype(np.float32)


def close(got, want, rtol=RTOL, atol=ATOL):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


ACTS = {  # id: (torch fn, a, b, backward reads the output?)
    0: (torch.relu, 0, 0, True),
    1: (lambda t: F.hardtanh(t, -1.0, 2.0), -1.0, 2.0, False),
    2: (torch.sigmoid, 0, 0, True),
    3: (torch.tanh, 0, 0, True),
    4: (F.silu, 0, 0, False),
    5: (lambda t: F.gelu(t), 0, 0, False),
    6: (lambda t: F.gelu(t, approximate="tanh"), 0, 0, False),
}


UNARY = [(torch.exp, False), (torch.log, True), (torch.sqrt, True), (torch.rsqrt, True),
         (torch.neg, False), (torch.abs, False), (torch.reciprocal, True)]


def bview(a, out_shape):
    """(pointer, element strides) of `a` broadcast to out_shape (stride 0 where broadcast)."""
    v = np.broadcast_to(a, out_shape)
    return P(v), I([s // a.itemsize for s in v.strides])


def run_reduce(lib, x, dims, scale=1.0):
    red = np.array([d in dims for d in range(x.ndim)], np.uint8)
    out_shape = tuple(1 if red[d] else s for d, s in enumerate(x.shape))
    y = np.full(out_shape, np.nan, np.float32)
    lib.pw_reduce_sum(P(x), P(y), x.ndim, P(I(x.shape)), P(red), scale)
    return y
