"""aarch64: the kernels and whole training steps, cross-compiled and run under
qemu-aarch64, against torch and against this machine's build.

* test_kernels: kernel_check.cpp with every runtime kernel, one qemu run over
  all cases; each output is checked against a float64 torch reference.  Each
  case calls one kernel (or a fwd+bwd pair) by name through the dispatch table
  generated from pock_kernels.h (pockengine.ops.kernels.driver_source), its
  arguments by parameter name.
* test_train_end_to_end: a compiled model's TU + the runtime + train_driver.c
  (plain C over pock.h) starts from a checkpoint the host trainer wrote, trains
  5 steps and saves; its losses and its checkpoint, loaded by a host Trainer,
  are judged against a PyTorch fp64 run as PyTorch fp32 is (tests/numerics.py),
  like the host's own 5 steps, and with SGD also match the host's elementwise
  (so checkpoints are portable too).

Needs aarch64-linux-gnu-g++ and qemu-aarch64 (`make test` installs them);
the cross-compiled runtime is cached (scripts/cross_build.py).
"""
from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pockengine as pe
from models import MODELS, SPARSE, batches
from numerics import assert_losses_close, assert_state_close_fp64, fp64_reference
from pockengine.ops.kernels import driver_kernels, driver_source
from pockengine.compiler.program import resolve_update

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
_spec = importlib.util.spec_from_file_location("cross_build", ROOT / "scripts" / "cross_build.py")
cross = importlib.util.module_from_spec(_spec)
sys.modules["cross_build"] = cross
_spec.loader.exec_module(cross)

pytestmark = pytest.mark.skipif(bool(cross.missing_tools()),
                                reason=f"aarch64 cross tools missing: {', '.join(cross.missing_tools())} "
                                       "(apt-get install g++-aarch64-linux-gnu qemu-user)")
RTOL = 1e-4


# ----------------------------------------------------------------------------- file format
def write_tensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """name, shape, float32 data per tensor (kernel_check.cpp's format)."""
    with open(path, "wb") as f:
        for name, a in tensors.items():
            a = np.ascontiguousarray(a, dtype="<f4")
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<I", a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape) + a.tobytes())


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    buf, out, pos = Path(path).read_bytes(), {}, 0
    while pos < len(buf):
        (n,) = struct.unpack_from("<I", buf, pos)
        name = buf[pos + 4:pos + 4 + n].decode()
        (ndim,) = struct.unpack_from("<I", buf, pos + 4 + n)
        pos += 8 + n
        shape = struct.unpack_from(f"<{ndim}q", buf, pos)
        pos += 8 * ndim
        count = math.prod(shape)
        out[name] = np.frombuffer(buf, "<f4", count, pos).reshape(shape)
        pos += 4 * count
    return out


# ----------------------------------------------------------------------------- kernel cases
# Each generator yields (family, params, inputs, expected) (call()): inputs are float32 arrays
# (integers travel as floats), expected are float64 torch references computed
# from exactly those float32 inputs.  The family is a kernel's name: the case calls that kernel
# ("k1+k2": those, in order over the same buffers) through the driver generated from pock_kernels.h
# (pockengine.ops.kernels.driver_source): params are its scalars by parameter
# name, inputs its buffers by parameter name (a struct's array member too: "shape").
_g = torch.Generator().manual_seed(1234)


def rnd(*shape, scale=1.0, lo=None, shift=0.0):
    """scale * randn (|.| + lo when lo is given) + shift, as float64 values exactly
    representable in float32, so that the kernel sees the reference's inputs."""
    t = torch.randn(*shape, generator=_g, dtype=torch.float64) * scale
    return ((t.abs() + lo if lo is not None else t) + shift).float().double()


def call(kernel, ins, exp, scratch=(), **scalars):
    """A case calling pk::<kernel>: ins its input buffers (and the initial values of
    in-place ones), exp the expected outputs; a writable buffer of exp not in ins starts
    as zeros, the `scratch` buffers (name: shape) are given and not checked."""
    ins = {**{k: torch.zeros(v.shape, dtype=torch.float64) for k, v in exp.items()},
           **{k: torch.zeros(shape, dtype=torch.float64) for k, shape in dict(scratch).items()}, **ins}
    return kernel, scalars, ins, exp


def grads(loss, *ts):
    """torch.autograd.grad with zeros for inputs that do not reach the loss."""
    return [g if g is not None else torch.zeros_like(t)
            for g, t in zip(torch.autograd.grad(loss, ts, allow_unused=True), ts)]


def gemm_cases():
    # odd sizes around the micro-tile, the dot / direct-B / packed paths and the KC, NC blocks
    for M, N, K, beta in [(7, 5, 3, 1.0), (1, 1, 1, 0.0), (17, 25, 9, 0.0), (33, 110, 131, 1.0), (20, 70, 300, 0.0)]:
        for ta in (0, 1):
            for tb in (0, 1):
                yield gemm_case(1, M, N, K, ta, tb, beta)
    yield gemm_case(3, 9, 14, 11, 0, 1, 0.0, broadcast_a=True)
    yield gemm_case(2, 13, 30, 20, 1, 0, 1.0)
    yield gemm_case(8, 24, 24, 256, 0, 1, 0.0)                  # small batched products: parallel over the batch
    yield gemm_case(3, 5, 6, 7, 1, 1, 1.0, sum_batches=True)    # sc = 0: every product summed into one C


def gemm_case(batch, M, N, K, ta, tb, beta, broadcast_a=False, sum_batches=False):
    A = rnd(1 if broadcast_a else batch, *((K, M) if ta else (M, K)))
    B = rnd(batch, *((N, K) if tb else (K, N)))
    C0 = rnd(1 if sum_batches else batch, M, N)
    prod = (A.transpose(-1, -2) if ta else A) @ (B.transpose(-1, -2) if tb else B)
    C = C0 + prod.sum(0, keepdim=True) if sum_batches else prod + beta * C0
    return call("gemm", {"A": A, "B": B, "C": C0}, {"C": C}, batch=batch, M=M, N=N, K=K, ta=ta, tb=tb,
                sa=0 if broadcast_a else M * K, sb=K * N, sc=0 if sum_batches else M * N, beta=beta)


def linear_cases():
    for M, N, K, k, bias in [(5, 7, 9, 9, True), (16, 32, 16, 8, True), (3, 13, 29, 11, False), (1, 40, 3, 3, True),
                                (37, 50, 70, 33, True)]:
        x, w, dy = rnd(M, K, scale=1.0).requires_grad_(), rnd(N, K, scale=0.3).requires_grad_(), rnd(M, N)
        b = rnd(N) if bias else None
        y = F.linear(x, w, b)
        dx, dw = grads((y * dy).sum(), x, w)
        yield call("linear_fwd", {"x": x, "w": w, **({"b": b} if bias else {})}, {"y": y}, M=M, N=N, K=K)
        yield call("linear_bwd_input", {"dy": dy, "w": w}, {"dx": dx}, M=M, N=N, K=K)
        yield call("linear_bwd_weight", {"dy": dy, "x": x}, {"dw": dw[:, :k]}, M=M, N=N, k=k, ldx=K)
        yield call("bias_bwd", {"dy": dy}, {"db": dy.sum(0)}, M=M, N=N)
    for M, N, K, act in [(6, 11, 13, 1), (9, 26, 17, 2), (40, 30, 20, 1), (19, 7, 3, 2)]:
        x, w, b = rnd(M, K, scale=2.0), rnd(N, K), rnd(N)
        y = F.linear(x, w, b)
        y = y.relu() if act == 1 else y.clamp(0, 6)
        yield call("linear_fwd_act", {"x": x, "w": w, "b": b}, {"y": y}, M=M, N=N, K=K, act=act)


def lowp_cases():
    """Low-precision frozen weights (lowp.cpp): panels of 12 columns on NEON cut q4's 32-blocks."""
    from pockengine.passes.compute_dtype import fmla_linear, fmla_linear_bwd_input, round_operand, round_to
    from pockengine.schemes.quant import dequantize, quantize
    rng = np.random.default_rng(5)
    for (M, N, K), dt in itertools.product([(5, 17, 64), (13, 30, 96), (1, 3, 288)], ["bf16", "f16", "i8", "q4"]):
        w = (rng.standard_normal((N, K)) * K**-0.5).astype(np.float32)
        q, scale = quantize(w, dt)
        wd = dequantize(q, dt, scale).astype(np.float64)
        codes = q.view(np.uint16) if dt == "f16" else q
        x, dy, b = rng.standard_normal((M, K)), rng.standard_normal((M, N)), rng.standard_normal(N)
        x, dy, b = (a.astype(np.float32).astype(np.float64) for a in (x, dy, b))
        # the const void* weight as its codes: bf16/f16 bit patterns, int8 values, q4 bytes
        w = {f"w:{ {'bf16': 'uint16_t', 'f16': 'uint16_t', 'i8': 'int8_t', 'q4': 'uint8_t'}[dt]}": codes.astype(np.float64),
             **({"scale": np.asarray(scale, np.float64).reshape(-1)} if scale is not None else {})}
        p = dict(dt={"bf16": 0, "f16": 1, "i8": 2, "q4": 3}[dt], M=M, N=N, K=K)  # pk::LowpDtype
        yield call("linear_fwd_lowp", {"x": x, "b": b, **w}, {"y": x @ wd.T + b}, act=0, **p)
        yield call("linear_bwd_input_lowp", {"dy": dy, **w}, {"dx": dy @ wd}, **p)
        # generation's one-row product (gemv.cpp's portable path: NEON)
        yield call("gemv_lowp", {"x": x[0], "b": b, **w}, {"y": wd @ x[0] + b}, dt=p["dt"], N=N, K=K)
        # compute_dtype: the products in bf16 / fp16 (fcvt's rounding on aarch64); bf16 with fp32
        # accumulation, fp16 on FMLA (this build's armv8.2-a+fp16, every qemu CPU used here has it):
        # fp16 sums over chunks of 16 depth steps, added in fp32 (kernels/lowp_fmla.cpp), emulated exactly
        for cd in ("bf16", "f16"):
            wr = round_to(wd.astype(np.float32), cd).astype(np.float64)
            y = fmla_linear(x, wd, b) if cd == "f16" else round_operand(x, cd) @ wr.T + b
            dx = fmla_linear_bwd_input(dy, wd) if cd == "f16" else round_operand(dy, cd) @ wr
            yield call("linear_fwd_lowp_cd", {"x": x, "b": b, **w}, {"y": y}, act=0, cd={"bf16": 0, "f16": 1}[cd], **p)
            yield call("linear_bwd_input_lowp_cd", {"dy": dy, **w}, {"dx": dx}, cd={"bf16": 0, "f16": 1}[cd], **p)


CONV = [  # N C H W O KH KW stride pad dil groups k xc bias
    (2, 3, 9, 7, 5, 3, 3, (2, 2), (1, 1), (1, 1), 1, 3, 3, True),       # stem: few output channels (plane sums)
    (1, 4, 8, 8, 6, 3, 2, (1, 2), (2, 1), (2, 1), 2, 2, 4, False),      # generic: grouped, dilated, uneven
    (2, 8, 7, 7, 8, 3, 3, (1, 1), (1, 1), (1, 1), 8, 1, 8, False),      # depthwise
    (1, 6, 6, 19, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6, 1, 6, True),      # depthwise, rows of several vectors
    (1, 5, 9, 22, 5, 3, 3, (2, 2), (1, 1), (1, 1), 5, 1, 5, False),     # depthwise stride 2, row form
    (1, 2, 7, 9, 2, 3, 3, (2, 2), (2, 2), (1, 1), 2, 1, 2, False),      # depthwise stride 2, pad 2
    (2, 3, 5, 6, 3, 3, 3, (1, 1), (0, 0), (1, 1), 3, 1, 3, True),       # depthwise, no padding
    (1, 4, 9, 9, 8, 3, 3, (2, 2), (1, 1), (1, 1), 4, 1, 4, True),       # channel multiplier 2
    (2, 6, 8, 9, 16, 3, 3, (1, 1), (1, 1), (1, 1), 1, 4, 6, True),      # implicit GEMM, partial weight grad
    (1, 16, 6, 5, 16, 3, 3, (2, 2), (1, 1), (1, 1), 2, 5, 16, False),   # implicit GEMM, grouped, stride 2
    (1, 3, 10, 10, 8, 5, 5, (2, 2), (2, 2), (1, 1), 1, 3, 3, True),     # 5x5
    (2, 16, 5, 5, 12, 1, 1, (1, 1), (0, 0), (1, 1), 1, 8, 16, True),    # 1x1 GEMM, partial weight grad
    (2, 10, 4, 6, 7, 1, 1, (1, 1), (0, 0), (1, 1), 1, 5, 5, False),     # 1x1, input pre-sliced to k channels
    (1, 12, 7, 7, 9, 1, 1, (2, 2), (0, 0), (1, 1), 3, 4, 12, True),     # 1x1 stride 2, grouped
    # depthwise 3x3 pad 1 on small planes: conv2d_dw_small.cpp's channel-vectorized form
    # (blocks of 4 channels and a partial block; stride 2 takes the scatter input gradient)
    (3, 6, 4, 4, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6, 1, 6, True),
    (2, 9, 8, 8, 9, 3, 3, (2, 2), (1, 1), (1, 1), 9, 1, 9, True),
    (1, 7, 3, 5, 7, 3, 3, (2, 2), (1, 1), (1, 1), 7, 1, 7, False),
    # depthwise stride 2 on a larger plane: the forward on split rows (conv2d_plane3x3.cpp)
    (1, 3, 20, 41, 3, 3, 3, (2, 2), (1, 1), (1, 1), 3, 1, 3, True),
    # 1x1 on small planes, more than 64 input channels: the input gradient's images side by side
    (3, 80, 4, 4, 24, 1, 1, (1, 1), (0, 0), (1, 1), 1, 80, 80, True),
    # few taps per output (C*KH*KW <= 32, >= 8 output channels): conv2d_small_k.cpp's forward over
    # conv_common.h's im2col (stride-2 rows deinterleaved a vector at a time; a partial last block)
    (2, 3, 11, 21, 10, 3, 3, (2, 2), (1, 1), (1, 1), 1, 3, 3, True),
    (1, 2, 6, 17, 9, 3, 3, (1, 1), (1, 1), (1, 1), 1, 2, 2, False),
]
CONV_FIELDS = ("N", "C", "H", "W", "O", "KH", "KW", "OH", "OW", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h",
               "dil_w", "groups")  # pk::Conv2dParams
CONV_ACT = [(0, 1), (2, 2), (3, 1), (4, 2), (8, 2), (11, 1), (14, 2), (15, 1), (17, 2)]  # (CONV index, act) for conv2d_fwd_act


def conv_case(N, C, H, W, O, KH, KW, stride, pad, dil, groups, bias=True):
    x = rnd(N, C, H, W).requires_grad_()
    w = rnd(O, C // groups, KH, KW, scale=0.5).requires_grad_()
    b = rnd(O)
    y = F.conv2d(x, w, b if bias else None, stride, pad, dil, groups)
    conv = [N, C, H, W, O, KH, KW, y.shape[2], y.shape[3], *stride, *pad, *dil, groups]
    return x, w, b, y, conv


def conv2d_cases():
    for N, C, H, W, O, KH, KW, stride, pad, dil, groups, k, xc, bias in CONV:
        x, w, b, y, conv = conv_case(N, C, H, W, O, KH, KW, stride, pad, dil, groups, bias)
        dy = rnd(*y.shape)
        dx, dw = grads((y * dy).sum(), x, w)
        p = dict(zip(CONV_FIELDS, conv))
        yield call("conv2d_fwd", {"x": x, "w": w, **({"b": b} if bias else {})}, {"y": y}, **p)
        yield call("conv2d_bwd_input", {"dy": dy, "w": w}, {"dx": dx}, **p)
        yield call("conv2d_bwd_weight", {"dy": dy, "x": x if xc == C else x[:, :k]}, {"dw": dw[:, :k]}, k=k, xc=xc, **p)
        yield call("conv2d_bwd_bias", {"dy": dy}, {"db": dy.sum((0, 2, 3))}, **p)
    for i, act in CONV_ACT:
        N, C, H, W, O, KH, KW, stride, pad, dil, groups = CONV[i][:11]
        x, w, b, y, conv = conv_case(N, C, H, W, O, KH, KW, stride, pad, dil, groups)
        y = y.relu() if act == 1 else y.clamp(0, 6)
        yield call("conv2d_fwd_act", {"x": x, "w": w, "b": b}, {"y": y}, act=act, **dict(zip(CONV_FIELDS, conv)))


def norm_cases():
    eps = 1e-5
    for R, C, affine in [(6, 32, True), (5, 37, True), (4, 7, False)]:
        x, dy = rnd(R, C, scale=2.0).requires_grad_(), rnd(R, C)
        w, b = rnd(C).requires_grad_(), rnd(C).requires_grad_()
        y = F.layer_norm(x, (C,), w if affine else None, b if affine else None, eps)
        dx, dw, db = grads((y * dy).sum(), x, w, b)
        var, mean = torch.var_mean(x, -1, unbiased=False)
        rstd, wb = (var + eps).rsqrt(), ({"w": w, "b": b} if affine else {})
        yield call("layer_norm_fwd", {"x": x, **wb}, {"y": y, "mean": mean, "rstd": rstd}, rows=R, cols=C, eps=eps)
        yield call("layer_norm_bwd", {"dy": dy, "x": x, "mean": mean, "rstd": rstd, **({"w": w} if affine else {})},
                   {"dx": dx, **({"dw": dw, "db": db} if affine else {})}, rows=R, cols=C)
    for N, C, S in [(4, 8, 25), (8, 5, 1), (2, 3, 37)]:
        x, dy = rnd(N, C, S, scale=2.0, shift=0.5).requires_grad_(), rnd(N, C, S)
        w, b = rnd(C).requires_grad_(), rnd(C).requires_grad_()
        rm, rv = rnd(C), rnd(C, lo=0.5)
        new_rm, new_rv = rm.clone(), rv.clone()
        y = F.batch_norm(x, new_rm, new_rv, w, b, True, 0.1, eps)
        act = 1 if S == 25 else 2
        yact = F.relu(y) if act == 1 else F.relu6(y)
        dxa, dwa, dba = torch.autograd.grad((yact * dy).sum(), (x, w, b), retain_graph=True)
        dx, dw, db = grads((y * dy).sum(), x, w, b)
        var, mean = torch.var_mean(x, (0, 2), unbiased=False)
        ins, invstd = {"x": x, "w": w, "b": b, "rm": rm, "rv": rv}, (var + eps).rsqrt()
        yield call("batch_norm_train_fwd", ins, {"y": y, "save_mean": mean, "save_invstd": invstd, "new_rm": new_rm,
                                                 "new_rv": new_rv}, N=N, C=C, S=S, momentum=0.1, eps=eps)
        yield call("batch_norm_train_bwd", {"dy": dy, "x": x, "save_mean": mean, "save_invstd": invstd, "w": w},
                   {"dx": dx, "dw": dw, "db": db}, N=N, C=C, S=S)
        yield call("batch_norm_train_fwd_act", ins, {"y": yact}, {k: (C,) for k in ("save_mean", "save_invstd",
                   "new_rm", "new_rv")}, N=N, C=C, S=S, momentum=0.1, eps=eps, act=act)
        yield call("batch_norm_train_bwd_act", {"dy": dy, "y": yact, "x": x, "save_mean": mean, "save_invstd": invstd,
                                                "w": w}, {"dx": dxa, "dw": dwa, "db": dba}, N=N, C=C, S=S, act=act)
    N, C, S = 2, 6, 10
    x, dy = rnd(N, C, S).requires_grad_(), rnd(N, C, S)
    w, b, rm, rv = rnd(C).requires_grad_(), rnd(C), rnd(C), rnd(C, lo=0.5)
    y = F.batch_norm(x, rm, rv, w, b, False, 0.1, eps)
    dx, dw = grads((y * dy).sum(), x, w)
    yield call("batch_norm_eval_fwd", {"x": x, "w": w, "b": b, "rm": rm, "rv": rv}, {"y": y}, N=N, C=C, S=S, eps=eps)
    yield call("batch_norm_eval_bwd", {"dy": dy, "x": x, "rm": rm, "rv": rv, "w": w},
               {"dx": dx, "dw": dw, "db": dy.sum((0, 2))}, N=N, C=C, S=S, eps=eps)


def softmax_loss_cases():
    for outer, dim, inner, log in [(4, 10, 1, 0), (3, 17, 5, 0), (4, 33, 1, 1), (2, 9, 3, 1), (1, 130, 1, 0)]:
        x, dy = rnd(outer, dim, inner, scale=3.0).requires_grad_(), rnd(outer, dim, inner)
        y = (torch.log_softmax if log else torch.softmax)(x, 1)
        (dx,) = grads((y * dy).sum(), x)
        name, size = "log_softmax" if log else "softmax", dict(outer=outer, dim=dim, inner=inner)
        yield call(f"{name}_fwd", {"x": x}, {"y": y}, **size)
        yield call(f"{name}_bwd", {"dy": dy, "y": y}, {"dx": dx}, **size)
    for N, C, ignore, smoothing in [(8, 5, -100, 0.0), (12, 37, 3, 0.0), (6, 10, -100, 0.1), (7, 11, 1, 0.2)]:
        logits = rnd(N, C, scale=2.0).requires_grad_()
        target = torch.randint(0, C, (N,), generator=_g)
        target[0], target[1] = ignore if ignore >= 0 else 0, (ignore + 1) % C if ignore >= 0 else 1
        dloss = torch.tensor([0.7], dtype=torch.float64)
        loss = F.cross_entropy(logits, target, ignore_index=ignore, label_smoothing=smoothing)
        (dlogits,) = grads(loss * dloss[0], logits)
        p = dict(N=N, C=C, ignore_index=ignore, label_smoothing=smoothing)
        yield call("cross_entropy_fwd", {"logits": logits, "target": target}, {"loss": loss.reshape(1)}, **p)
        yield call("cross_entropy_bwd", {"dloss": dloss, "logits": logits, "target": target}, {"dlogits": dlogits}, **p)
    # the LM head fused with cross_entropy, dx in the forward's pass (linear_ce.cpp): tiles that cut the
    # rows and the classes unevenly, logits growing with the class (later tiles raise the running max)
    for M, V, K, rows, cols, bias in [(7, 50, 16, 3, 16, True), (9, 70, 21, 9, 32, False)]:
        x, w = rnd(M, K).requires_grad_(), rnd(V, K, scale=0.3) + torch.linspace(0, 0.2, V)[:, None]
        b = rnd(V) if bias else None
        target = torch.randint(0, V, (M,), generator=_g)
        target[1] = -100
        z = F.linear(x, w, b)
        loss = F.cross_entropy(z, target)
        (dx,) = grads(loss, x)
        p = dict(M=M, V=V, K=K, k=K, ignore_index=-100, rows=rows, cols=cols)  # pk::LinearCeParams
        ins = {"x": x, "w:float": w, "target": target, **({"b": b} if bias else {})}  # the const void* head
        yield call("linear_ce_fwd_dx", ins, {"loss": loss.reshape(1), "lse": torch.logsumexp(z, -1), "dx": dx},
                   {"scratch": (rows * (cols + K),)}, dscale=1.0, **p)
        dloss = torch.tensor([0.7], dtype=torch.float64)
        yield call("linear_ce_bwd_scale", {"dloss": dloss, "dx1": dx}, {"dx": dx * 0.7}, n=M * K)


MASK_STRIDES = ("mask_sb", "mask_sl", "mask_ss")  # pk::SdpaParams; its heads and layouts keep their defaults


def sdpa_cases():
    for B, L, S, E, Ev, causal, mask_kind, scale in [
        (2, 5, 5, 8, 8, True, 0, None), (3, 4, 7, 6, 5, False, 0, None), (1, 4, 6, 4, 4, True, 0, 0.3),
        (2, 6, 6, 4, 4, False, 1, None), (2, 5, 7, 8, 3, False, 2, None), (1, 9, 9, 16, 16, True, 0, None),
        (1, 70, 75, 8, 8, True, 0, None),  # several query and key blocks, lengths not a block multiple
    ]:
        q, k, v = (rnd(B, L, E).requires_grad_(), rnd(B, S, E).requires_grad_(), rnd(B, S, Ev).requires_grad_())
        scale = float(np.float32(scale or 1 / math.sqrt(E)))  # the kernel gets a float
        scores = q @ k.transpose(1, 2) * scale
        mask, strides = None, (0, 0, 0)
        if causal:
            scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
        if mask_kind == 1:  # bool [L, S] broadcast over the batch, the diagonal always attended
            mask = torch.rand(L, S, generator=_g) > 0.4
            mask |= torch.eye(L, S, dtype=torch.bool)
            scores, strides = scores.masked_fill(~mask, -math.inf), (0, S, 1)
        elif mask_kind == 2:  # float [B, L, S]
            mask = rnd(B, L, S)
            scores, strides = scores + mask, (L * S, S, 1)
        out = scores.softmax(-1) @ v
        lse = scores.logsumexp(-1)  # what the flash-style forward saves for its backward
        dout = rnd(B, L, Ev)
        dq, dk, dv = grads((out * dout).sum(), q, k, v)
        mask = {} if mask is None else {f"mask:{'uint8_t' if mask_kind == 1 else 'float'}": mask}  # the const void*
        yield call("sdpa_fwd+sdpa_bwd", {"q": q, "k": k, "v": v, "dout": dout, **mask},
                   {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}, B=B, L=L, S=S,
                   E=E, Ev=Ev, scale=scale, causal=causal, mask_kind=mask_kind, **dict(zip(MASK_STRIDES, strides)))


def rnn_cases():
    for B, T, I, H, P, bias, k_ih, k_hh, k_hr in [
        (3, 5, 6, 8, 0, True, 6, 8, 0), (2, 4, 5, 7, 4, True, 3, 2, 5), (2, 3, 4, 5, 0, False, 4, 5, 0),
    ]:
        lstm = nn.LSTM(I, H, batch_first=True, bias=bias, proj_size=P).double()
        with torch.no_grad():
            for prm in lstm.parameters():
                prm.copy_(rnd(*prm.shape, scale=0.4))
        Pn = P or H
        x, h0, c0 = rnd(B, T, I).requires_grad_(), rnd(B, Pn).requires_grad_(), rnd(B, H).requires_grad_()
        dy, dhn, dcn = rnd(B, T, Pn), rnd(B, Pn), rnd(B, H)
        y, (hn, cn) = lstm(x, (h0[None], c0[None]))
        weights = dict(lstm.named_parameters())
        names = ["weight_ih_l0", "weight_hh_l0"] + (["bias_ih_l0", "bias_hh_l0"] if bias else []) + (
            ["weight_hr_l0"] if P else [])
        loss = (y * dy).sum() + (hn[0] * dhn).sum() + (cn[0] * dcn).sum()
        dx, dh0, dc0, *dws = grads(loss, x, h0, c0, *(weights[n] for n in names))
        dw = dict(zip(names, dws))
        ins = {"x": x, "h0": h0, "c0": c0, "w_ih": weights["weight_ih_l0"], "w_hh": weights["weight_hh_l0"],
               "dy": dy, "dhn": dhn, "dcn": dcn}
        exp = {"y": y, "hn": hn[0], "cn": cn[0], "dx": dx, "dh0": dh0, "dc0": dc0,
               "dw_ih": dw["weight_ih_l0"][:, :k_ih], "dw_hh": dw["weight_hh_l0"][:, :k_hh]}
        if bias:
            ins.update(b_ih=weights["bias_ih_l0"], b_hh=weights["bias_hh_l0"])
            exp.update(db_ih=dw["bias_ih_l0"], db_hh=dw["bias_hh_l0"])
        if P:
            ins["w_hr"] = weights["weight_hr_l0"]
            exp["dw_hr"] = dw["weight_hr_l0"][:, :k_hr]
        scratch = {"gates": (T * B * 4 * H,), "cells": (T * B * H,), **({"hraw": (T * B * H,)} if P else {}),
                   "scratch": (T * B * 4 * H + B * H + (T * B * P + B * H if P else B * Pn),)}  # lstm_bwd_scratch_floats
        yield call("lstm_fwd+lstm_bwd", ins, exp, scratch, B=B, T=T, I=I, H=H, P=Pn, has_bias=bias, has_proj=bool(P),
                   k_ih=k_ih, k_hh=k_hh, k_hr=k_hr)
    for B, T, I, H, bias, k_ih, k_hh in [(3, 4, 5, 6, True, 5, 6), (2, 3, 4, 5, True, 2, 3), (2, 3, 3, 4, False, 3, 4)]:
        gru = nn.GRU(I, H, batch_first=True, bias=bias).double()
        with torch.no_grad():
            for prm in gru.parameters():
                prm.copy_(rnd(*prm.shape, scale=0.4))
        x, h0, dy, dhn = rnd(B, T, I).requires_grad_(), rnd(B, H).requires_grad_(), rnd(B, T, H), rnd(B, H)
        y, hn = gru(x, h0[None])
        weights = dict(gru.named_parameters())
        names = ["weight_ih_l0", "weight_hh_l0"] + (["bias_ih_l0", "bias_hh_l0"] if bias else [])
        dx, dh0, *dws = grads((y * dy).sum() + (hn[0] * dhn).sum(), x, h0, *(weights[n] for n in names))
        dw = dict(zip(names, dws))
        ins = {"x": x, "h0": h0, "w_ih": weights["weight_ih_l0"], "w_hh": weights["weight_hh_l0"], "dy": dy,
               "dhn": dhn}
        exp = {"y": y, "hn": hn[0], "dx": dx, "dh0": dh0, "dw_ih": dw["weight_ih_l0"][:, :k_ih],
               "dw_hh": dw["weight_hh_l0"][:, :k_hh]}
        if bias:
            ins.update(b_ih=weights["bias_ih_l0"], b_hh=weights["bias_hh_l0"])
            exp.update(db_ih=dw["bias_ih_l0"], db_hh=dw["bias_hh_l0"])
        scratch = {"saved": (T * B * 4 * H,), "scratch": (T * B * 4 * H + B * H,)}  # gru_bwd_scratch_floats
        yield call("gru_fwd+gru_bwd", ins, exp, scratch, B=B, T=T, I=I, H=H, has_bias=bias, k_ih=k_ih, k_hh=k_hh)


def optimizer_cases():
    def region(shape, k):
        """(outer, inner, stride) of the updated elements of a [O, C, ...] parameter (all of
        it, or its first k input channels), a getter of them as [outer, inner], and a setter."""
        n, rest = math.prod(shape), math.prod(shape[2:])
        if k is None:
            return (1, n, n), lambda p: p.reshape(1, n), lambda p, sub: sub.reshape(shape)

        def put(p, sub):
            p = p.clone()
            p[:, :k] = sub.reshape(p[:, :k].shape)
            return p
        return (shape[0], k * rest, shape[1] * rest), lambda p: p[:, :k].reshape(shape[0], -1), put

    for shape, k, step, wd in [((37,), None, 1, 0.01), ((4, 6, 3), 2, 7, 0.1), ((5, 9), None, 3, 0.0)]:
        (outer, inner, stride), get, put = region(shape, k)
        param, g, m, v = rnd(*shape), rnd(outer, inner), rnd(outer, inner, scale=0.1), rnd(outer, inner, scale=0.01, lo=0.0)
        if step == 1:
            m, v = torch.zeros_like(m), torch.zeros_like(v)
        sub = get(param).clone().requires_grad_()
        opt = torch.optim.AdamW([sub], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
        if step > 1:  # resume at step t-1 with the given moments
            opt.state[sub] = {"step": torch.tensor(float(step - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        sub.grad = g.clone()
        opt.step()
        st = opt.state[sub]
        yield call("adamw_update", {"p": param, "g": g, "m": m, "v": v}, {
            "p": put(param, sub.detach()), "m": st["exp_avg"], "v": st["exp_avg_sq"]}, outer=outer, inner=inner,
                   stride=stride, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=wd, step=step, check_finite=0)
    for shape, k, momentum, damp, wd, nesterov, first in [
        ((29,), None, 0.0, 0.0, 0.0, False, True), ((6, 7), None, 0.9, 0.1, 1e-3, False, False),
        ((5, 8), None, 0.9, 0.0, 1e-2, True, True), ((3, 5, 4), 3, 0.8, 0.0, 0.0, True, False),
    ]:
        (outer, inner, stride), get, put = region(shape, k)
        param, g, buf = rnd(*shape), rnd(outer, inner), rnd(outer, inner)
        sub = get(param).clone().requires_grad_()
        opt = torch.optim.SGD([sub], lr=0.05, momentum=momentum, dampening=damp, weight_decay=wd, nesterov=nesterov)
        if momentum and not first:
            opt.state[sub] = {"momentum_buffer": buf.clone()}
        sub.grad = g.clone()
        opt.step()
        ins = {"p": param, "g": g, **({"buf": buf} if momentum else {})}
        exp = {"p": put(param, sub.detach()), **({"buf": opt.state[sub]["momentum_buffer"]} if momentum else {})}
        yield call("sgd_update", ins, exp, outer=outer, inner=inner, stride=stride, lr=0.05, momentum=momentum,
                   dampening=damp, weight_decay=wd, nesterov=nesterov, first_step=first, check_finite=0)


def data_cases():
    for shape, dims, scale in [((3, 4, 5, 6), (0, 2), 1.0), ((3, 4, 5, 6), (3,), 1 / 6), ((3, 4, 5, 6), (0, 1, 2, 3), 0.5),
                               ((3, 4, 5, 6), (), 2.0), ((37, 19), (0,), 1.0), ((37, 19), (1,), 1.0)]:
        x = rnd(*shape)
        y = x.sum(dims, keepdim=True) * scale if dims else x * scale
        flags = np.array([d in dims for d in range(len(shape))], np.float64)  # pk::Reduce's arrays as buffers
        yield call("reduce_sum", {"x": x, "shape": np.array(shape, np.float64), "reduce": flags}, {"y": y},
                   ndim=len(shape), scale=scale)
    # (x shape, y shape, copy shape, in strides, in offset, out strides, out offset)
    for xs, ys, shape, ist, ioff, ost, ooff in [
        ((3, 4, 5), (5, 3, 4), (5, 3, 4), (1, 20, 5), 0, (12, 4, 1), 0),       # permute
        ((10, 12), (6, 10), (4, 8), (24, 1), 15, (10, 1), 11),                 # strided slice into a slice
        ((1, 5), (4, 5), (4, 5), (0, 1), 0, (5, 1), 0),                        # expand
        ((2, 3, 4, 5), (2, 5, 3, 4), (2, 5, 3, 4), (60, 1, 20, 5), 0, (60, 12, 4, 1), 0),
    ]:
        x, y0 = rnd(*xs), rnd(*ys)
        y = y0.numpy().copy()
        src = np.lib.stride_tricks.as_strided(x.numpy().reshape(-1)[ioff:], shape, [8 * s for s in ist])
        np.lib.stride_tricks.as_strided(y.reshape(-1)[ooff:], shape, [8 * s for s in ost])[...] = src
        arrays = {k: np.array(v, np.float64) for k, v in [("shape", shape), ("in_strides", ist), ("out_strides", ost)]}
        yield call("strided_copy_float", {"x": x, "y": y0, **arrays}, {"y": torch.from_numpy(y)}, ndim=len(shape),
                   in_offset=ioff, out_offset=ooff)
    # (kernel, torch function, scalars, whether the backward reads y (else x)); relu6 as the codegen emits it
    acts = [("relu", torch.relu, {}, True), ("hardtanh", lambda t: F.hardtanh(t, -1.0, 1.0), dict(lo=-1.0, hi=1.0), False),
            ("sigmoid", torch.sigmoid, {}, True), ("tanh", torch.tanh, {}, True), ("silu", F.silu, {}, False),
            ("gelu", F.gelu, dict(approximate=0), False),
            ("gelu", lambda t: F.gelu(t, approximate="tanh"), dict(approximate=1), False),
            ("hardtanh", lambda t: F.hardtanh(t, 0.0, 6.0), dict(lo=0.0, hi=6.0), False)]
    for name, fn, scalars, from_y in acts:
        shape, scale = ((4, 33), 4.0) if scalars.get("hi") == 6.0 else ((67,), 3.0)
        x, dy = rnd(*shape, scale=scale).requires_grad_(), rnd(*shape)
        y = fn(x)
        (dx,) = grads((y * dy).sum(), x)
        n = math.prod(shape)
        yield call(f"{name}_fwd", {"x": x}, {"y": y}, n=n, **scalars)
        yield call(f"{name}_bwd", {"dy": dy, **({"y": y} if from_y else {"x": x})}, {"dx": dx}, n=n, **scalars)
    for op, (fn, x) in enumerate([(torch.exp, rnd(67, scale=2.0)), (torch.log, rnd(67, lo=0.1)),
                                  (torch.sqrt, rnd(67, lo=0.0)), (torch.rsqrt, rnd(67, lo=0.1)), (torch.neg, rnd(67)),
                                  (torch.abs, rnd(67)), (torch.reciprocal, rnd(67, lo=0.2))]):
        yield call("unary", {"x": x}, {"y": fn(x)}, op=op, n=x.numel())
    for op, fn in enumerate([torch.add, torch.sub, torch.mul, torch.div]):
        for sa, sb in [((3, 1, 5), (4, 5)), ((6, 19), (6, 19)), ((2, 3, 4), (1,)), ((7, 1), (1, 9))]:
            a, b = rnd(*sa), (rnd(*sb, lo=0.5) if op == 3 else rnd(*sb))
            out = np.broadcast_shapes(sa, sb)  # pk::Broadcast: element strides, 0 where broadcast
            st = {k: np.array(np.broadcast_to(np.zeros(s, np.float32), out).strides, np.float64) / 4
                  for k, s in [("sa", sa), ("sb", sb)]}
            yield call("binary", {"a": a, "b": b, "shape": np.array(out, np.float64), **st}, {"out": fn(a, b)},
                       op=op, ndim=len(out))
    N, C, H, W, K, s, pad = 2, 3, 9, 8, 3, 2, 1
    x = rnd(N, C, H, W).requires_grad_()
    ymax, yavg = F.max_pool2d(x, K, s, pad), F.avg_pool2d(x, K, s, pad, count_include_pad=True)
    dmax, davg = rnd(*ymax.shape), rnd(*yavg.shape)
    (dxm,) = grads((ymax * dmax).sum(), x)
    (dxa,) = grads((yavg * davg).sum(), x)
    OH, OW = ymax.shape[2:]
    p = dict(N=N, C=C, H=H, W=W, OH=OH, OW=OW, KH=K, KW=K, stride_h=s, stride_w=s, pad_h=pad, pad_w=pad, dil_h=1,
             dil_w=1, count_include_pad=1, divisor_override=0)  # pk::Pool2dParams
    yield call("max_pool2d_fwd+max_pool2d_bwd", {"x": x, "dy": dmax}, {"y": ymax, "dx": dxm}, {"idx": (N, C, OH, OW)}, **p)
    yield call("avg_pool2d_fwd+avg_pool2d_bwd", {"x": x, "dy": davg}, {"y": yavg, "dx": dxa}, **p)
    for n, V, D, k, pidx in [(10, 7, 5, 3, 2), (9, 6, 17, 17, -1)]:
        w, idx, dy = rnd(V, D).requires_grad_(), torch.randint(0, V, (n,), generator=_g), rnd(n, D)
        idx[:2] = torch.tensor([max(pidx, 0), 1])
        y = F.embedding(idx, w, padding_idx=pidx if pidx >= 0 else None)
        (dw,) = grads((y * dy).sum(), w)
        yield call("embedding_fwd", {"w": w, "idx": idx}, {"y": y}, n=n, V=V, D=D)
        yield call("embedding_bwd", {"dy": dy, "idx": idx}, {"dw": dw[:, :k]}, n=n, V=V, D=D, k=k, padding_idx=pidx)
        base = rnd(V, k)
        yield call("embedding_bwd_onto", {"dy": dy, "idx": idx, "base": base}, {"dw": base + dw[:, :k]}, n=n, V=V, D=D,
                   k=k, padding_idx=pidx)


def kernel_cases():
    """{case name: (inputs, expected)}; case names are "<family>.<i>"."""
    cases, count = {}, {}
    for gen in (gemm_cases, linear_cases, lowp_cases, conv2d_cases, norm_cases, softmax_loss_cases, sdpa_cases, rnn_cases,
                optimizer_cases, data_cases):
        for family, params, ins, exp in gen():
            i = count[family] = count.get(family, -1) + 1
            arr = lambda t: np.asarray(t.detach().numpy() if torch.is_tensor(t) else t, dtype=np.float64)
            p = {k: np.array(float(v)) for k, v in params.items()}
            ins = {**p, **{k: arr(v) for k, v in ins.items()}}
            cases[f"{family}.{i}"] = (ins, {k: arr(v) for k, v in exp.items()})
    return cases


def _kernels(case: str) -> set[str]:
    """The kernels a case calls ("lstm_fwd+lstm_bwd.2" -> both)."""
    return set(case.split(".")[0].split("+"))


def test_kernels(tmp_path):
    check_kernels(kernel_cases(), tmp_path)


def test_compute_dtype_kernels_with_and_without_bf16(tmp_path):
    """compute_dtype's products (lowp.cpp *_cd) on a core without BF16 (qemu neoverse-n1: the portable
    path for bf16) as well as with it (-cpu max, in test_kernels: lowp_dot.cpp's BFMMLA for bf16); fp16
    runs on FMLA on both (lowp_fmla.cpp; tests/arm64/test_lowp_fmla.py covers a core without it)."""
    cases = {c: v for c, v in kernel_cases().items() if c.startswith(("linear_fwd_lowp_cd", "linear_bwd_input_lowp_cd"))}
    assert len(cases) == 48  # 3 shapes x 4 storage formats x (bf16, fp16) x (forward, input gradient)
    check_kernels(cases, tmp_path, cpu="neoverse-n1")


def check_kernels(cases, tmp_path, cpu="max"):
    callable_ = set(driver_kernels())
    absent = sorted(set().union(*map(_kernels, cases)) - callable_)  # kernels this tree does not have
    cases = {c: v for c, v in cases.items() if _kernels(c) <= callable_}
    (tmp_path / "calls.cpp").write_text(driver_source(callable_))
    exe = cross.build_executable([HERE / "kernel_check.cpp", tmp_path / "calls.cpp"], tmp_path / "kernel_check")
    inputs = {f"{c}/{k}": v for c, (ins, _) in cases.items() for k, v in ins.items()}
    write_tensors(tmp_path / "in.bin", inputs)
    r = cross.run(exe, tmp_path / "in.bin", tmp_path / "out.bin", cpu=cpu)
    assert r.returncode == 0, f"kernel_check failed under qemu (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    got = read_tensors(tmp_path / "out.bin")

    failures = []
    for case, (ins, exp) in cases.items():
        produced = {k.split("/", 1)[1] for k in got if k.split("/", 1)[0] == case}
        produced -= (set(ins) | {"ret"}) - set(exp)  # scratch buffers and return values go unchecked
        if produced != set(exp):
            failures.append(f"{case}: outputs {sorted(produced)}, expected {sorted(exp)}")
            continue
        for name, want in exp.items():
            have = got[f"{case}/{name}"]
            if have.shape != want.shape:
                failures.append(f"{case}/{name}: shape {have.shape}, expected {want.shape}")
                continue
            atol = 1e-5 * max(1.0, float(np.abs(want).max(initial=0.0)))
            bad = ~np.isclose(have, want, rtol=RTOL, atol=atol)
            if bad.any():
                i = np.unravel_index(np.argmax(np.abs(have - want) * bad), want.shape)
                p = {k: float(v) for k, v in ins.items() if v.ndim == 0}
                failures.append(f"{case}/{name} (p={p}): {bad.sum()} of {want.size} differ; "
                                f"worst at {tuple(map(int, i))}: got {have[i]!r}, expected {want[i]:.7g}")
    if absent:
        print(f"kernels not in this tree (skipped): {absent}")
    assert not failures, f"{len(failures)} aarch64 kernel mismatches:\n" + "\n".join(failures)


# ----------------------------------------------------------------------------- end to end
E2E = {
    "mlp": dict(update=SPARSE["mlp"], optimizer=pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)),
    "lstm": dict(update=SPARSE["lstm"], optimizer=pe.AdamW(lr=1e-2)),
}
STEPS = 5


@pytest.mark.parametrize("model", sorted(E2E))
def test_train_end_to_end(model, tmp_path):
    torch.manual_seed(0)
    data = batches(model)
    inputs, targets = data[0]
    module = MODELS[model]()
    original = copy.deepcopy(module).state_dict()
    prog = pe.compile(module, inputs, targets, **E2E[model])
    (tmp_path / "model.cpp").write_text(prog.source())
    exe = cross.build_executable([tmp_path / "model.cpp", HERE / "train_driver.c"], tmp_path / "train")

    host = prog.build()
    host.save(tmp_path / "start.ckpt")
    before = host.state_dict()
    with open(tmp_path / "data.bin", "wb") as f:
        for i in range(STEPS):
            ins, tgs = data[i % len(data)]
            for t, io in zip([*ins, *tgs], host.inputs + host.targets):
                f.write(np.ascontiguousarray(t.numpy(), dtype=io.dtype).tobytes())
    host_losses = [host.step(*data[i % len(data)]) for i in range(STEPS)]

    r = cross.run(exe, tmp_path / "start.ckpt", tmp_path / "data.bin", STEPS, tmp_path / "arm.ckpt", 2)
    assert r.returncode == 0, f"train_driver failed under qemu (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    arm_losses = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("loss ")]
    # both judged against PyTorch fp64 as PyTorch fp32 is (tests/numerics.py); SGD also elementwise
    ref = fp64_reference(module, data, "cross_entropy", E2E[model]["update"], E2E[model]["optimizer"], STEPS)
    trained = resolve_update({n: tuple(p.shape) for n, p in module.named_parameters()}, E2E[model]["update"])
    assert_losses_close(arm_losses, ref)
    assert_losses_close(host_losses, ref)
    strict = isinstance(E2E[model]["optimizer"], pe.SGD)
    if strict:
        np.testing.assert_allclose(arm_losses, host_losses, rtol=RTOL, err_msg="losses: aarch64 vs host")

    arm = prog.build()
    arm.load(tmp_path / "arm.ckpt")  # the aarch64-written checkpoint, read on this machine
    assert arm.step_count == host.step_count == STEPS
    want, got = host.state_dict(), arm.state_dict()
    assert got.keys() == want.keys()
    assert_state_close_fp64(got, ref, original, trained)
    for name in want:
        if strict:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=1e-6, err_msg=f"{name}: aarch64 vs host")
        frozen = np.array_equal(want[name], before[name])
        assert not frozen or np.array_equal(got[name], before[name]), f"frozen {name} changed on aarch64"
