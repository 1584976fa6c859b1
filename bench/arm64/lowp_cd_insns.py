"""aarch64 instructions of compute_dtype's frozen-weight products against the fp32 ones, under qemu.

    .venv/bin/python bench/arm64/lowp_cd_insns.py [--shapes 128x576x576,128x1536x576] [--cpu max]

One product (lowp_cd_driver.cpp: linear forward x @ w^T, and the input gradient dy @ w; the weight
stored bf16 for fp32 and bf16 compute, fp16 for fp16 compute, as compile(compute_dtype=...) stores
it) cross-compiled with the runtime (scripts/cross_build.py, -march=armv8.2-a+fp16+dotprod) and
counted by bench/arm64/insn_count.c: per call = (count of 3 calls - count of 1) / 2, one thread.
qemu -cpu max has BF16, so compute_dtype="bf16" runs on BFMMLA (kernels/lowp_dot.cpp), and fp16
arithmetic, so "fp16" runs on FMLA (kernels/lowp_fmla.cpp); --cpu neoverse-n1 (no BF16) shows
bf16's portable path.  Every count includes the per-call packing and rounding of both operands.
Writes bench/arm64/lowp_cd_results.md (--out; bench/arm64/insns.py appends it to results.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
_spec = importlib.util.spec_from_file_location("cross_build", ROOT / "scripts" / "cross_build.py")
cross = importlib.util.module_from_spec(_spec)
sys.modules["cross_build"] = cross
_spec.loader.exec_module(cross)


def count(exe, plugin, cpu, args) -> int:
    r = subprocess.run([cross.QEMU, "-cpu", cpu, "-plugin", str(plugin), "-d", "plugin", str(exe), *map(str, args)],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{exe} {args} failed under qemu: {r.stderr[-2000:]}")
    line = [ln for ln in (r.stderr + r.stdout).replace("insns", "\ninsns").splitlines() if ln.startswith("insns ")]
    return int(line[-1].split()[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x576x576,128x1536x576", help="MxNxK (SmolLM2: q/o 576x576, up 1536x576)")
    ap.add_argument("--cpu", default="max")
    ap.add_argument("--out", default=str(HERE), help="folder for lowp_cd_results.md / .json")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-lowp-cd-") as tmp:
        tmp = Path(tmp)
        plugin = tmp / "libinsn_count.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(HERE / "insn_count.c"), "-o", str(plugin)], check=True)
        exe = cross.build_executable([HERE / "lowp_cd_driver.cpp"], tmp / "lowp_cd_driver")
        lines = ["## compute_dtype: aarch64 instructions per frozen-weight product (bench/arm64/lowp_cd_insns.py)", "",
                 f"qemu -cpu {a.cpu}, one thread, -O2 -march=armv8.2-a+fp16+dotprod; M tokens x N out x K in "
                 "(SmolLM2-135M's q/o and gate/up at 128 tokens). fp32: FMLA .4s over the bf16-stored weight "
                 "widened; bf16: BFMMLA (lowp_dot.cpp); fp16: FMLA .8h, fp16 sums over 16 depth steps added "
                 "in fp32 (lowp_fmla.cpp), the weight stored fp16. Fewer is better.", "",
                 "| product | M x N x K | fp32 (M insns) | bf16 (M insns) | fp16 (M insns) | bf16 / fp32 | fp16 / fp32 |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        print("\n".join(lines), flush=True)
        for shape in a.shapes.split(","):
            M, N, K = map(int, shape.split("x"))
            for kind in ("fwd", "bwd"):
                got = {}
                for cd in ("fp32", "bf16", "fp16"):
                    args = (f"{kind}_{cd}", M, N, K)
                    got[cd] = (count(exe, plugin, a.cpu, (*args, 3)) - count(exe, plugin, a.cpu, (*args, 1))) / 2
                lines.append(f"| {'x @ w^T' if kind == 'fwd' else 'dy @ w'} | {M}x{N}x{K} | {got['fp32'] / 1e6:.2f} | "
                             f"{got['bf16'] / 1e6:.2f} | {got['fp16'] / 1e6:.2f} | {got['bf16'] / got['fp32']:.2f}x | "
                             f"{got['fp16'] / got['fp32']:.2f}x |")
                rows.append({"product": kind, "M": M, "N": N, "K": K, **got})
                print(lines[-1], flush=True)
    out = Path(a.out)
    (out / "lowp_cd_results.json").write_text(json.dumps({"cpu": a.cpu, "rows": rows}, indent=1))
    (out / "lowp_cd_results.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
