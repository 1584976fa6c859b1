"""GEMM throughput on SmolLM2-135M's shapes (batch 1 x 128 tokens), ours vs PyTorch, interleaved.

    python bench/gemm_llm.py [--threads 1,2] [--march native,x86-64-v3] [--reps 5] [--rounds 3]

For every linear of the model (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, the
tied LM head 49152x576) it times the forward y = x w^T, the input gradient dx = dy w and the
weight gradient dw = dy^T x with PockEngine's kernels (linear.cpp over gemm.cpp, built with each
-march) and with PyTorch (F.linear / matmul), one after the other in this process, best of
`reps` calls, the best of `rounds` rounds. Also the low-precision frozen-weight forward and input
gradient (lowp.cpp: bf16, int8, q4) and attention's batched products (9 heads, 128x128x64).
GFLOP/s and the fraction of the one-core FMA peak (bench/fma_peak.cpp, same -march) are printed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
T = 128
LINEARS = {"q_proj/o_proj": (576, 576), "k_proj/v_proj": (192, 576), "gate/up": (1536, 576),
           "down": (576, 1536), "lm_head": (49152, 576)}
PER_STEP = {"q_proj/o_proj": 60, "k_proj/v_proj": 60, "gate/up": 60, "down": 30, "lm_head": 1}


def load(path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(path))
    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    dll.bench_linear.argtypes = [ci, ci, ci, vp, vp, vp, i64, i64, i64, ci, vp]
    dll.bench_linear.restype = ctypes.c_double
    dll.bench_gemm.argtypes = [ci, ci, vp, vp, vp, i64, i64, i64, i64, ci, ci]
    dll.bench_gemm.restype = ctypes.c_double
    dll.bench_pool.argtypes = [ci]
    dll.bench_pool.restype = vp
    dll.bench_linear_once.argtypes = [vp, ci, vp, vp, vp, i64, i64, i64]
    dll.bench_linear_once.restype = ctypes.c_double
    return dll


def build(march: str) -> ctypes.CDLL:
    from pockengine.build.host import build_kernel_library
    return load(build_kernel_library([ROOT / "bench" / "gemm_llm_shim.cpp"], ["-pthread"], march=march))


def fma_peak(march: str) -> float:
    exe = Path("/tmp") / f"pock_fma_peak_{march}"
    if not exe.exists():
        subprocess.run(["g++", "-O3", f"-march={march}", "-std=c++17", "-pthread", str(ROOT / "bench" / "fma_peak.cpp"),
                        "-o", str(exe)], check=True)
    return json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)["single_gflops"]


def P(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def lowp_weight(w: np.ndarray, dt: str):
    """(storage, scale, dtype code) as passes/lowp.py lays them out (values only need the right layout)."""
    N, K = w.shape
    if dt == "bf16":
        return (w.view(np.uint32) >> 16).astype(np.uint16), None, 0
    if dt == "int8":
        s = np.abs(w).max(1) / 127
        return np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8), s.astype(np.float32), 2
    q = np.random.default_rng(0).integers(0, 256, (N, K // 2), dtype=np.uint8)
    return q, np.random.default_rng(1).standard_normal(N * (K // 32) * 2).astype(np.float32) * 0.01, 3


def time_torch(fn, reps):
    fn()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def stream(libs, marches, threads, layers, rounds, torch):
    """The model's linears in step order over `layers` layers of distinct weights (cold caches, as in a
    training step): per call the best of `rounds` passes; ours and PyTorch in alternating passes."""
    rng = np.random.default_rng(0)
    order = ["q_proj/o_proj", "k_proj/v_proj", "k_proj/v_proj", "q_proj/o_proj", "gate/up", "gate/up", "down"]
    ws = [[rng.standard_normal(LINEARS[n], dtype=np.float32) * 0.05 for n in order] for _ in range(layers)]
    head = rng.standard_normal(LINEARS["lm_head"], dtype=np.float32) * 0.05
    pools = {m: libs[m].bench_pool(threads) for m in marches}
    res = {}
    for op, case in enumerate(("fwd", "bwd_in", "bwd_w")):
        calls = [(n, ws[li][j]) for li in range(layers) for j, n in enumerate(order)] + [("lm_head", head)]
        best = {m: [1e30] * len(calls) for m in marches + ["torch"]}
        bufs = {}
        for _ in range(rounds):
            for who in marches + ["torch"]:
                for ci, (n, w) in enumerate(calls):
                    N, K = w.shape
                    if n not in bufs:
                        bufs[n] = (rng.standard_normal((T, K), dtype=np.float32), rng.standard_normal((T, N), dtype=np.float32),
                                   np.empty((T, N), np.float32), np.empty((T, K), np.float32), np.empty((N, K), np.float32))
                    x, dy, y, dx, dw = bufs[n]
                    if who == "torch":
                        tx, tdy, tw = torch.from_numpy(x), torch.from_numpy(dy), torch.from_numpy(w)
                        t0 = time.perf_counter()
                        if op == 0:
                            torch.nn.functional.linear(tx, tw, out=torch.from_numpy(y))
                        elif op == 1:
                            torch.matmul(tdy, tw, out=torch.from_numpy(dx))
                        else:
                            torch.matmul(tdy.t(), tx, out=torch.from_numpy(w if False else dw))
                        s = time.perf_counter() - t0
                    else:
                        A, B, C = ((x, w, y), (dy, w, dx), (dy, x, dw))[op]
                        s = libs[who].bench_linear_once(pools[who], op, P(A), P(B), P(C), T, N, K)
                    best[who][ci] = min(best[who][ci], s)
        fl = sum(2 * T * w.shape[0] * w.shape[1] for _, w in calls)
        head_i = len(calls) - 1
        res[case] = {who: (sum(b) * 1e3, fl / sum(b) / 1e9, b[head_i] * 1e3) for who, b in best.items()}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--march", default="native")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated shape names (default all)")
    ap.add_argument("--lowp", action="store_true", help="also the bf16/int8/q4 frozen-weight products")
    ap.add_argument("--stream", type=int, default=0, metavar="LAYERS",
                    help="instead: the step's linears over LAYERS layers of distinct weights (cold caches)")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=LIB",
                    help="also time a prebuilt gemm_llm shim library (e.g. the kernels before a change), "
                         "its peak taken as the first -march's")
    a = ap.parse_args(argv)
    import torch
    rng = np.random.default_rng(0)
    marches = a.march.split(",")
    libs = {m: build(m) for m in marches}
    peaks = {m: fma_peak(m) for m in marches}
    for spec in a.extra:
        name, path = spec.split("=", 1)
        libs[name], peaks[name] = load(path), peaks[marches[0]]
        marches.append(name)
    print(f"load {os.getloadavg()[0]:.1f}; FMA peak 1 core: " + ", ".join(f"{m} {p:.1f}" for m, p in peaks.items()))
    if a.stream:
        for threads in map(int, a.threads.split(",")):
            torch.set_num_threads(threads)
            res = stream(libs, marches, threads, a.stream, a.rounds, torch)
            print(f"\n{threads} thread(s), {a.stream} layers + LM head, cold weights: ms (GFLOP/s, % of peak; LM head ms)")
            for case, r in res.items():
                print(f"{case:8s}" + "".join(f"  {who}: {ms:7.1f} ({g:5.1f}, {100 * g / peaks.get(who, peaks[marches[0]]) / threads:3.0f}%; "
                                             f"head {hm:6.1f})" for who, (ms, g, hm) in r.items()), flush=True)
        return
    names = [n for n in LINEARS if not a.only or n in a.only.split(",")]
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        rows = []
        for name in names:
            N, K = LINEARS[name]
            x = rng.standard_normal((T, K), dtype=np.float32)
            w = rng.standard_normal((N, K), dtype=np.float32) * 0.05
            dy = rng.standard_normal((T, N), dtype=np.float32)
            tx, tw, tdy = map(torch.from_numpy, (x, w, dy))
            cases = [("fwd", 0, x, w, np.empty((T, N), np.float32), lambda: torch.nn.functional.linear(tx, tw)),
                     ("bwd_in", 1, dy, w, np.empty((T, K), np.float32), lambda: tdy @ tw),
                     ("bwd_w", 2, dy, x, np.empty((N, K), np.float32), lambda: tdy.t() @ tx)]
            for case, op, A, B, C, tfn in cases:
                best = {}
                for _ in range(a.rounds):
                    for m in marches:
                        s = libs[m].bench_linear(op, threads, a.reps, P(A), P(B), P(C), T, N, K, 0, None)
                        best[m] = min(best.get(m, 1e30), s)
                    best["torch"] = min(best.get("torch", 1e30), time_torch(tfn, a.reps))
                rows.append((name, case, 2 * T * N * K, best))
            if a.lowp:
                for dt in ("bf16", "int8", "q4"):
                    q, sc, code = lowp_weight(w, dt)
                    for case, op, A, C in (("fwd_" + dt, 3, x, np.empty((T, N), np.float32)),
                                           ("bwd_in_" + dt, 4, dy, np.empty((T, K), np.float32))):
                        best = {}
                        for _ in range(a.rounds):
                            for m in marches:
                                s = libs[m].bench_linear(op, threads, a.reps, P(A), P(q), P(C), T, N, K, code,
                                                         P(sc) if sc is not None else None)
                                best[m] = min(best.get(m, 1e30), s)
                        rows.append((name, case, 2 * T * N * K, best))
        # attention: 9 heads, scores q k^T, probs v, and their gradients
        H, D = 9, 64
        for case, M, N, K, ta, tb in (("attn qk^T", T, T, D, 0, 1), ("attn pv", T, D, T, 0, 0),
                                      ("attn dP=dO v^T", T, T, D, 0, 1), ("attn dV=P^T dO", T, D, T, 1, 0),
                                      ("attn dQ=dS k", T, D, T, 0, 0), ("attn dK=dS^T q", T, D, T, 1, 0)):
            A = rng.standard_normal((H, K, M) if ta else (H, M, K), dtype=np.float32)
            B = rng.standard_normal((H, N, K) if tb else (H, K, N), dtype=np.float32)
            C = np.empty((H, M, N), np.float32)
            tA, tB = torch.from_numpy(A), torch.from_numpy(B)
            opA = tA.transpose(1, 2) if ta else tA
            opB = tB.transpose(1, 2) if tb else tB
            best = {}
            for _ in range(a.rounds):
                for m in marches:
                    best[m] = min(best.get(m, 1e30), libs[m].bench_gemm(threads, a.reps, P(A), P(B), P(C), H, M, N, K,
                                                                        ta, tb))
                best["torch"] = min(best.get("torch", 1e30), time_torch(lambda: torch.bmm(opA, opB), a.reps))
            rows.append(("attention", case, 2 * H * M * N * K, best))
        print(f"\n{threads} thread(s); GFLOP/s (% of the {threads}-core FMA peak of that -march)")
        hdr = f"{'shape':14s} {'case':16s}" + "".join(f"{m:>22s}" for m in marches) + f"{'torch':>16s}"
        print(hdr)
        for name, case, fl, best in rows:
            line = f"{name:14s} {case:16s}"
            for m in marches:
                g = fl / best[m] / 1e9
                line += f"{g:12.1f} ({100 * g / peaks[m] / threads:4.0f}%)   "
            if "torch" in best:
                line += f"{fl / best['torch'] / 1e9:10.1f}"
            print(line, flush=True)
        for m in marches:
            step = {c: 0.0 for c in ("fwd", "bwd_in", "bwd_w")}
            tstep = dict(step)
            for name, case, fl, best in rows:
                if case in step:
                    step[case] += best[m] * PER_STEP[name] * 1e3
                    tstep[case] += best["torch"] * PER_STEP[name] * 1e3
            print(f"[{m}] per-step linear ms (ours / torch): " +
                  ", ".join(f"{c} {step[c]:.0f}/{tstep[c]:.0f}" for c in step))


if __name__ == "__main__":
    main()
