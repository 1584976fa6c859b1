"""The pointwise-family kernels' test library and the helpers test_kernels_pointwise.py,
test_kernels_pointwise_threads.py and test_kernels_attention.py share.

Every kernel's `shim_<kernel>` is generated (pockengine.ops.kernels: a struct's members in its
place, an array member as a pointer, a template per instance: shim_strided_copy_float); the
`pw_*` helpers below only pick one of them by the tests' op / dtype ids."""
import ctypes

import numpy as np
import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6

vp, i64, f32, f64, cint, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_double, ctypes.c_int, ctypes.c_uint64
ACT_KERNELS = ["relu", "hardtanh", "sigmoid", "tanh", "silu", "gelu", "gelu"]  # ACTS' ids
SCALAR_KERNELS = ["add_scalar", "mul_scalar", "rsub_scalar", "pow_scalar"]
DTYPE_NAMES = ["float", "int64_t", "int32_t", "uint8_t"]  # the copy tests' dtype ids


def sdpa_args(B, L, S, E, Ev, mask_strides, scale, causal, mask_kind, H=1, group=1, layouts=((0, 0, 0),) * 4):
    """pk::SdpaParams as shim_sdpa_fwd/bwd take it (its members in order; layouts: {sb, sh, sr}
    of q, k, v, out, all 0 for dense operands)."""
    return (B, L, S, E, Ev, scale, int(causal), mask_kind, *mask_strides, H, group,
            *(s for lay in layouts for s in lay))


def load(shim_builder):
    """The kernels with their generated shims (argtypes set) and shims/threads_shim.cpp, plus
    the `pw_*` helpers the pointwise tests call."""
    L = shim_builder("threads_shim.cpp", ("-pthread",))

    def act_args(op, a, b):
        return (a, b) if op == 1 else (op == 6,) if op in (5, 6) else ()

    helpers = {
        "pw_act_fwd": lambda op, x, y, n, a, b: getattr(L, f"shim_{ACT_KERNELS[op]}_fwd")(x, y, n, *act_args(op, a, b)),
        "pw_act_bwd": lambda op, dy, saved, dx, n, a, b: getattr(L, f"shim_{ACT_KERNELS[op]}_bwd")(
            dy, saved, dx, n, *act_args(op, a, b)),
        "pw_scalar": lambda op, x, y, n, c: getattr(L, f"shim_{SCALAR_KERNELS[op]}")(x, y, n, c),
        "pw_strided_copy": lambda dt, *args: getattr(L, f"shim_strided_copy_{DTYPE_NAMES[dt]}")(*args),
        "pw_fill": lambda dt, y, n, fv, iv: getattr(L, f"shim_fill_{DTYPE_NAMES[dt]}")(y, n, iv if dt else fv),
        "pw_softmax": lambda log, bwd, a, b, out, *size: (
            getattr(L, f"shim_{'log_' if log else ''}softmax_{'bwd' if bwd else 'fwd'}")(
                *((a, b) if bwd else (a,)), out, *size)),
        "pw_sgd": lambda *args: L.shim_sgd_update(*args, 0),  # check_finite off
        "pw_adamw": lambda *args: L.shim_adamw_update(*args, 0),
        "pw_use_threads": L.shim_use_threads,
        "pw_num_threads": L.shim_num_threads,
    }
    for kernel in ["unary", "pow_scalar_bwd", "binary", "where", "reduce_sum", "cross_entropy_fwd",
                   "cross_entropy_bwd", "nll_loss_fwd", "nll_loss_bwd", "mse_loss_fwd", "mse_loss_bwd", "dropout_fwd",
                   "dropout_bwd", "layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd", "bias_bwd"]:  # the same arguments as the kernel's shim
        short = kernel.replace("cross_entropy", "ce").replace("_loss", "").replace("pow_scalar_bwd", "pow_bwd")
        helpers[f"pw_{short}"] = getattr(L, f"shim_{kernel}")
    L.shim_use_threads.argtypes, L.shim_use_threads.restype = [cint], None
    L.shim_num_threads.argtypes, L.shim_num_threads.restype = [], cint
    for name, fn in helpers.items():
        setattr(L, name, fn)
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
