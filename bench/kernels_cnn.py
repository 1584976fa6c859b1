"""Per-kernel timings of the CNN kernels (conv2d forward / input-grad /
weight-grad, batch_norm, relu6) on MobileNetV2 layer shapes (width 1.0, 128x128
input, batch 8) against PyTorch eager, both single-threaded.

    .venv/bin/python bench/kernels_cnn.py [--root DIR] [--reps N] [--threads T]

--root points at a directory holding kernels/, include/ and threadpool.cpp
(default: native/runtime of this checkout), so an old copy of the kernels can
be timed against the current one.  The kernels are compiled with the runtime's
flags into a shared library together with their extern "C" shims, generated from
that copy's include/pock_kernels.h (pockengine.ops.kernels.shim_source).
"""
import argparse
import ctypes
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ["conv2d_fwd", "conv2d_bwd_input", "conv2d_bwd_weight", "batch_norm_train_fwd", "batch_norm_train_bwd"]
# built -O2 -march=native (build.host.build_kernel_library), plus these
FLAGS = ["-pthread", *os.environ.get("PK_BENCH_FLAGS", "").split()]
vp = ctypes.c_void_p

# name, N, C, H, W, O, K, stride, groups   (pad = K // 2)
CONVS = [
    ("stem 3->32 3x3 s2", 8, 3, 128, 128, 32, 3, 2, 1),
    ("dw 32 @64 s1", 8, 32, 64, 64, 32, 3, 1, 32),
    ("pw 32->16 @64", 8, 32, 64, 64, 16, 1, 1, 1),
    ("pw 16->96 @64", 8, 16, 64, 64, 96, 1, 1, 1),
    ("dw 96 @64 s2", 8, 96, 64, 64, 96, 3, 2, 96),
    ("pw 96->24 @32", 8, 96, 32, 32, 24, 1, 1, 1),
    ("pw 24->144 @32", 8, 24, 32, 32, 144, 1, 1, 1),
    ("dw 144 @32 s1", 8, 144, 32, 32, 144, 3, 1, 144),
    ("pw 144->24 @32", 8, 144, 32, 32, 24, 1, 1, 1),
    ("dw 144 @32 s2", 8, 144, 32, 32, 144, 3, 2, 144),
    ("dw 192 @16 s1", 8, 192, 16, 16, 192, 3, 1, 192),
    ("pw 192->32 @16", 8, 192, 16, 16, 32, 1, 1, 1),
    ("dw 384 @8 s1", 8, 384, 8, 8, 384, 3, 1, 384),
    ("pw 64->384 @8", 8, 64, 8, 8, 384, 1, 1, 1),
    ("dw 576 @8 s2", 8, 576, 8, 8, 576, 3, 2, 576),
    ("pw 160->960 @4", 8, 160, 4, 4, 960, 1, 1, 1),
    ("dw 960 @4 s1", 8, 960, 4, 4, 960, 3, 1, 960),
    ("pw 960->160 @4", 8, 960, 4, 4, 160, 1, 1, 1),
    ("pw 320->1280 @4", 8, 320, 4, 4, 1280, 1, 1, 1),
]
BNS = [("bn 96 @64", 8, 96, 64 * 64), ("bn 144 @32", 8, 144, 32 * 32), ("bn 960 @4", 8, 960, 16)]


def build(root: Path) -> ctypes.CDLL:
    """The kernels under `root` with shims over KERNELS generated from root's own header (their
    argtypes set; Conv2dParams travels as its 16 fields)."""
    import hashlib

    from pockengine.build.host import build_kernel_library, cache_dir, write_source
    from pockengine.ops.kernels import argtypes, shim_source, signatures
    header = root / "include" / "pock_kernels.h"
    text = shim_source(KERNELS, header)
    shim = write_source(cache_dir() / "shims" / f"kernels_cnn-{hashlib.sha256(text.encode()).hexdigest()[:16]}.cpp", text)
    L = ctypes.CDLL(str(build_kernel_library([shim], FLAGS, name="kernels_cnn", runtime=root, march="native",
                                             opt="-O2")))
    sigs = signatures(header)
    for k in KERNELS:
        fn = getattr(L, f"shim_{k}")
        fn.argtypes, fn.restype = argtypes(sigs[k], header)
    return L


def P(a):
    return None if a is None else a.ctypes.data_as(vp)


def bench(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=ROOT / "native" / "runtime")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    L = build(args.root)
    rng = np.random.default_rng(0)
    print(f"ms per call, best of {args.reps}; torch threads = {args.threads}; ratio = ours / torch")
    print("| layer | fwd ours | fwd torch | ratio | dx ours | dx torch | ratio | dw ours | dw torch | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tot = np.zeros(6)
    for name, N, C, H, W, O, K, s, G in CONVS:
        if args.only and args.only not in name:
            continue
        pad = K // 2
        OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
        params = [N, C, H, W, O, K, K, OH, OW, s, s, pad, pad, 1, 1, G]  # pk::Conv2dParams
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((O, C // G, K, K), dtype=np.float32)
        dy = rng.standard_normal((N, O, OH, OW), dtype=np.float32)
        y, dx, dw = np.empty((N, O, OH, OW), np.float32), np.empty_like(x), np.empty_like(w)
        tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)

        def t_bwd(mask):
            return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, [s, s], [pad, pad], [1, 1], False,
                                                                [0, 0], G, mask)

        r = [
            bench(lambda: L.shim_conv2d_fwd(P(x), P(w), None, P(y), *params), args.reps),
            bench(lambda: F.conv2d(tx, tw, None, s, pad, 1, G), args.reps),
            bench(lambda: L.shim_conv2d_bwd_input(P(dy), P(w), P(dx), *params), args.reps),
            bench(t_bwd([True, False, False]), args.reps),
            bench(lambda: L.shim_conv2d_bwd_weight(P(dy), P(x), P(dw), *params, C // G, C), args.reps),
            bench(t_bwd([False, True, False]), args.reps),
        ]
        tot += r
        print(f"| {name} | {r[0]:.3f} | {r[1]:.3f} | {r[0] / r[1]:.2f} | {r[2]:.3f} | {r[3]:.3f} | "
              f"{r[2] / r[3]:.2f} | {r[4]:.3f} | {r[5]:.3f} | {r[4] / r[5]:.2f} |", flush=True)
    print(f"| **sum** | {tot[0]:.2f} | {tot[1]:.2f} | {tot[0] / tot[1]:.2f} | {tot[2]:.2f} | {tot[3]:.2f} | "
          f"{tot[2] / tot[3]:.2f} | {tot[4]:.2f} | {tot[5]:.2f} | {tot[4] / tot[5]:.2f} |")
    print()
    print("| batch_norm (train) | fwd ours | fwd torch | bwd ours | bwd torch |")
    print("|---|---|---|---|---|")
    for name, N, C, S in BNS:
        x = rng.standard_normal((N, C, S), dtype=np.float32)
        dy = rng.standard_normal((N, C, S), dtype=np.float32)
        wt, bt = np.ones(C, np.float32), np.zeros(C, np.float32)
        rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
        y, dx = np.empty_like(x), np.empty_like(x)
        sm, si, dwt, dbt = (np.empty(C, np.float32) for _ in range(4))
        tx, tdy, tw, tb = map(torch.from_numpy, (x, dy, wt, bt))
        trm, trv = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
        _, tsm, tsi = torch.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5)
        r = [
            bench(lambda: L.shim_batch_norm_train_fwd(P(x), P(wt), P(bt), P(rm), P(rv), P(y), P(sm), P(si), P(rm),
                                                      P(rv), N, C, S, 0.1, 1e-5), args.reps),
            bench(lambda: torch.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5), args.reps),
            bench(lambda: L.shim_batch_norm_train_bwd(P(dy), P(x), P(sm), P(si), P(wt), P(dx), P(dwt), P(dbt), N, C,
                                                      S), args.reps),
            bench(lambda: torch.ops.aten.native_batch_norm_backward(tdy, tx, tw, trm, trv, tsm, tsi, True, 1e-5,
                                                                    [True, True, True]), args.reps),
        ]
        print(f"| {name} | {r[0]:.3f} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
