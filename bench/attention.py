"""sdpa forward + backward at SmolLM2-135M's attention shapes (batch 1, 9 query heads, 3 kv heads,
head dim 64, causal, operands read in place as the compiled step does): the kernel of an earlier
revision (`--old`, from git; default the one that keeps the probabilities [H, T, T] for the
backward) against the working tree's flash-style one (saves each row's log-sum-exp, recomputes
the probabilities block by block), each built with its own runtime into a shared library, both
loaded into this one process and their calls interleaved (old, new, old, new, ...), so a shared
machine's load falls on both alike.  Reported per kernel: the median and best thread-CPU time of
the calling thread (one thread: the whole kernel; not counting what other processes take) and
the median wall time, and new/old ratios of the medians; the gradients of the two are compared.

    .venv/bin/python bench/attention.py [--old REV] [--tokens 128 512] [--reps 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA: list[str] = []  # extra g++ flags (tuning)


def _tree(rev: str | None, dst: Path) -> Path:
    """The runtime of rev (None: the working tree) under dst."""
    if rev is None:
        return ROOT
    dst.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev, "native/runtime"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=tar, check=True)
    return dst


def build(rev: str | None, tmp: Path, march: str) -> Path:
    root = _tree(rev, tmp / (rev or "work"))
    rt = root / "native" / "runtime"
    probs = "const float* lse" not in (rt / "include" / "pock_kernels.h").read_text()
    flags = ["-O3", "-std=c++17", f"-march={march}", "-pthread", "-shared", "-fPIC", "-fvisibility=hidden",
             "-I", str(rt / "include"), "-I", str(rt), "-I", str(rt / "kernels")] + EXTRA + (["-DPOCK_SDPA_PROBS"] if probs else [])
    lib = tmp / f"attention_{rev or 'work'}.so"
    srcs = [rt / "kernels" / "attention.cpp", rt / "kernels" / "gemm.cpp", rt / "threadpool.cpp",
            ROOT / "bench" / "attention.cpp"]
    subprocess.run(["g++", *flags, *map(str, srcs), "-o", str(lib)], check=True)
    return lib


def _load(path: Path):
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    lib.attn_make.restype = ctypes.c_void_p
    lib.attn_make.argtypes = [ctypes.c_long, ctypes.c_int]
    lib.attn_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
    lib.attn_grad.restype = ctypes.POINTER(ctypes.c_float)
    lib.attn_grad.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_long)]
    lib.attn_free.argtypes = [ctypes.c_void_p]
    return lib


def _grads(lib, h) -> list[list[float]]:
    out = []
    for which in range(4):
        n = ctypes.c_long()
        p = lib.attn_grad(h, which, ctypes.byref(n))
        out.append(p[: n.value])
    return out


def measure(old_rev: str, tokens=(128, 512), reps: int = 20, march: str = "native", threads: int = 1) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-attn-") as tmp:
        libs = {"old": _load(build(old_rev, Path(tmp), march)), "new": _load(build(None, Path(tmp), march))}
        for T in tokens:
            handles = {k: lib.attn_make(T, threads) for k, lib in libs.items()}
            times = {k: [] for k in libs}
            ms = (ctypes.c_double * 4)()
            for r in range(reps + 1):
                for k, lib in libs.items():  # interleaved: old, new, old, new, ...
                    lib.attn_step(handles[k], ms)
                    if r > 0:  # the first call of each warms caches and scratch
                        times[k].append(list(ms))
            g = {k: _grads(lib, handles[k]) for k, lib in libs.items()}
            diff = [max((abs(a - b) for a, b in zip(x, y)), default=0.0) for x, y in zip(g["old"], g["new"])]
            med = {}
            for k in libs:
                t = times[k]
                med[k] = {f: statistics.median(x[i] for x in t) for i, f in enumerate(("fwd_cpu", "bwd_cpu", "fwd_wall", "bwd_wall"))}
                rows.append({"kernel": k, "T": T, "threads": threads,
                             **{f"{f}_ms": round(v, 4) for f, v in med[k].items()},
                             "bwd_cpu_best_ms": round(min(x[1] for x in t), 4)})
            rows.append({"ratio_new_over_old": T, **{f: round(med["new"][f] / med["old"][f], 3) for f in med["new"]},
                         "max_abs_diff_dq_dk_dv_out": [float(f"{d:.3g}") for d in diff]})
            for k, lib in libs.items():
                lib.attn_free(handles[k])
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="ee3e501")
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--march", default="native")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    for row in measure(a.old, a.tokens, a.reps, a.march, a.threads):
        print(json.dumps(row))
