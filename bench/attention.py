"""sdpa forward + backward at SmolLM2-135M's attention shapes (batch 1, 128 tokens, 9 query
heads, 3 kv heads, head dim 64, causal): the previous row-at-a-time kernel (from git, `--old`
revision) against the current blocked-GEMM kernel, interleaved in one process on one thread
(best of --reps).  The old kernel gets k/v already repeated to 9 heads and [H, T, D] operands
(the copies the graph made for it are not timed); the new one reads [T, H, D] q/out and
[T, 3, D] k/v in place.

    .venv/bin/python bench/attention.py [--old REV] [--reps 20] [--march native]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RT = ROOT / "codegen" / "runtime"


def measure(old_rev: str, reps: int = 20, march: str = "native") -> dict:
    with tempfile.TemporaryDirectory(prefix="pock-attn-") as tmp:
        old = Path(tmp) / "attention_old.cpp"
        old.write_text(subprocess.run(["git", "show", f"{old_rev}:codegen/runtime/kernels/attention.cpp"],
                                      cwd=ROOT, check=True, capture_output=True, text=True).stdout)
        exe = Path(tmp) / "attention"
        flags = ["-O3", "-std=c++17", f"-march={march}", "-pthread", "-I", str(RT / "include"), "-I", str(RT),
                 "-I", str(RT / "kernels")]
        objs = []
        for src, extra in [(old, ["-Dsdpa_fwd=sdpa_fwd_old", "-Dsdpa_bwd=sdpa_bwd_old"]),
                           (RT / "kernels" / "attention.cpp", []), (RT / "kernels" / "gemm.cpp", []),
                           (RT / "threadpool.cpp", []), (ROOT / "bench" / "attention.cpp", [])]:
            obj = Path(tmp) / f"{len(objs)}.o"
            subprocess.run(["g++", *flags, *extra, "-c", str(src), "-o", str(obj)], check=True)
            objs.append(str(obj))
        subprocess.run(["g++", "-pthread", *objs, "-o", str(exe)], check=True)
        out = subprocess.run([str(exe), str(reps)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="7d63326")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--march", default="native")
    a = ap.parse_args()
    print(json.dumps(measure(a.old, a.reps, a.march)))
