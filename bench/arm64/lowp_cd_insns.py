"""aarch64 instructions of compute_dtype's frozen-weight products against the fp32 ones, under qemu.

    .venv/bin/python bench/arm64/lowp_cd_insns.py [--shapes 128x576x576,128x1536x576] [--cpu max]

One product (lowp_cd_driver.cpp: linear forward x @ w^T, and the input gradient dy @ w, over a
bf16-stored weight) cross-compiled with the runtime (scripts/cross_build.py, -march=armv8.2-a+fp16+
dotprod) and counted by bench/arm64/insn_count.c: per call = (count of 3 calls - count of 1) / 2.
qemu -cpu max has BF16, so compute_dtype="bf16" runs on BFDOT (kernels/lowp_dot.cpp);
--cpu neoverse-n1 (no BF16) shows the portable path. fp16 is the portable path everywhere.
"""
from __future__ import annotations

import argparse
import importlib.util
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
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pock-lowp-cd-") as tmp:
        tmp = Path(tmp)
        plugin = tmp / "libinsn_count.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(HERE / "insn_count.c"), "-o", str(plugin)], check=True)
        exe = cross.build_executable([HERE / "lowp_cd_driver.cpp"], tmp / "lowp_cd_driver")
        print(f"aarch64 instructions per product (qemu -cpu {a.cpu}; bf16-stored weight; M tokens x N out x K in)\n")
        print("| product | M x N x K | fp32 (M insns) | bf16 (M insns) | fp16 (M insns) | bf16 / fp32 | fp16 / fp32 |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for shape in a.shapes.split(","):
            M, N, K = map(int, shape.split("x"))
            for kind in ("fwd", "bwd"):
                got = {}
                for cd in ("fp32", "bf16", "fp16"):
                    args = (f"{kind}_{cd}", M, N, K)
                    got[cd] = (count(exe, plugin, a.cpu, (*args, 3)) - count(exe, plugin, a.cpu, (*args, 1))) / 2
                print(f"| {'x @ w^T' if kind == 'fwd' else 'dy @ w'} | {M}x{N}x{K} | {got['fp32'] / 1e6:.2f} | "
                      f"{got['bf16'] / 1e6:.2f} | {got['fp16'] / 1e6:.2f} | {got['bf16'] / got['fp32']:.2f}x | "
                      f"{got['fp16'] / got['fp32']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
