"""sdpa forward + backward at SmolLM2-135M's attention shapes (batch 1, 9 query heads, 3 kv heads,
head dim 64, causal, operands read in place as the compiled step does), one thread, best of
--reps: the kernel of an earlier revision (`--old`, from git: the one that keeps the probabilities
[H, T, T] for the backward) against the working tree's flash-style one (saves each row's
log-sum-exp, recomputes the probabilities block by block), each built with its own runtime.

    .venv/bin/python bench/attention.py [--old REV] [--tokens 128 512] [--reps 20] [--march native]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
def _tree(rev: str | None, dst: Path) -> Path:
    """The runtime of rev (None: the working tree) under dst."""
    if rev is None:
        return ROOT
    dst.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev, "codegen/runtime"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=tar, check=True)
    return dst


def build(rev: str | None, tmp: Path, march: str) -> Path:
    root = _tree(rev, tmp / (rev or "work"))
    rt = root / "codegen" / "runtime"
    probs = "const float* lse" not in (rt / "include" / "pock_kernels.h").read_text()
    flags = ["-O3", "-std=c++17", f"-march={march}", "-pthread", "-I", str(rt / "include"), "-I", str(rt),
             "-I", str(rt / "kernels")] + (["-DPOCK_SDPA_PROBS"] if probs else [])
    exe = tmp / f"attention_{rev or 'work'}"
    srcs = [rt / "kernels" / "attention.cpp", rt / "kernels" / "gemm.cpp", rt / "threadpool.cpp",
            ROOT / "bench" / "attention.cpp"]
    subprocess.run(["g++", *flags, *map(str, srcs), "-o", str(exe)], check=True)
    return exe


def measure(old_rev: str, tokens=(128, 512), reps: int = 20, march: str = "native") -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-attn-") as tmp:
        exes = {"old": build(old_rev, Path(tmp), march), "new": build(None, Path(tmp), march)}
        for T in tokens:
            for which, exe in exes.items():
                r = json.loads(subprocess.run([str(exe), str(T), str(reps)], check=True, capture_output=True,
                                              text=True).stdout)
                rows.append({"kernel": which, **r})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="ee3e501")
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--march", default="native")
    a = ap.parse_args()
    for row in measure(a.old, a.tokens, a.reps, a.march):
        print(json.dumps(row))
