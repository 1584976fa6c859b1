"""aarch64 instruction counts of one training step under qemu-aarch64 (the phone-ISA proxy).

    .venv/bin/python bench/arm64/insns.py [--models lstm,transformer,mobilenetv2] [--full]

For each workload and scheme, the step is cross-compiled (aarch64-linux-gnu-g++, -O3
-march=armv8.2-a+fp16+dotprod, the flags of an Android build) with tests/arm64/train_driver.c
in builds that differ only in the kernels:

  * ours            this checkout's runtime (explicit NEON vector kernels + auto-vectorization);
  * no-autovec      the same with -fno-tree-vectorize -fno-tree-slp-vectorize (GCC's
                    auto-vectorizer off; the explicit simd.h / vec_math.h kernels stay vector);
  * scalar          vectorization disabled: no-autovec plus -DPOCK_SIMD_NONE, so simd.h's vector
                    is 4 floats operated on one at a time and no kernel takes its NEON branch
                    (the same step, the same arithmetic order, no SIMD instruction);
  * ref             the runtime in $POCK_BENCH_REF_RUNTIME (e.g. the previous commit's
                    native/runtime), when set: a before/after comparison.

Instructions are counted by bench/arm64/insn_count.c, a QEMU TCG plugin built here (Debian's
qemu-user ships none).  Per-step count = (count of 1 + K steps - count of 1 step) / K, on
one thread, so loading, the checkpoint and process start-up cancel out.  Instruction
counts, not time: qemu's TCG timing says nothing about a phone, but fewer instructions for
the same step is the vector code doing its job.  Writes bench/arm64/results.md (and .json).
The miniature workloads (bench/models.py quick) by default; --full runs the real ones
(minutes each under qemu).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
sys.path.insert(0, str(ROOT / "bench"))

import pockengine as pe  # noqa: E402
from pockengine.build.host import _digest, _run, compile_objects  # noqa: E402

CXX, CC, QEMU = "aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc", "qemu-aarch64"
FLAGS = ("-O3", "-march=armv8.2-a+fp16+dotprod", "-pthread")
NOVEC = ("-fno-tree-vectorize", "-fno-tree-slp-vectorize")


def plugin(out: Path) -> Path:
    lib = out / "libinsn_count.so"
    _run(["gcc", "-shared", "-fPIC", "-O2", str(HERE / "insn_count.c"), "-o", str(lib)], "building the qemu plugin")
    return lib


def build(model_cpp: Path, runtime: Path, extra: tuple, exe: Path, link: tuple = ()) -> Path:
    """model TU + train_driver.c + every runtime source, statically linked for aarch64 (`link`: more
    link flags, e.g. compute_insns.py's -Wl,-Map=FILE)."""
    inc = ("-I", str(runtime / "include"), "-I", str(runtime))
    headers = _digest(sorted(runtime.rglob("*.h")))
    cpp = [model_cpp, *sorted(runtime.glob("*.cpp")), *sorted((runtime / "kernels").glob("*.cpp"))]
    jobs = [(s, (*FLAGS, *extra, "-std=c++17", *inc, "-I", str(s.parent)), headers) for s in cpp]
    objs = compile_objects(jobs, (CXX,), subdir="aarch64-insns/obj", what="aarch64 compilation")
    objs += compile_objects([(ROOT / "tests" / "arm64" / "train_driver.c", (*FLAGS, "-std=c11", *inc), headers)],
                            (CC,), subdir="aarch64-insns/obj", what="aarch64 compilation")
    _run([CXX, *FLAGS, "-static", *map(str, objs), *link, "-o", str(exe)], "linking (aarch64)")
    return exe


def count(exe: Path, lib: Path, work: Path, steps: int, ckpt: str = "start.ckpt") -> int:
    r = subprocess.run([QEMU, "-cpu", "max", "-plugin", str(lib), "-d", "plugin", str(exe), str(work / ckpt),
                        str(work / "data.bin"), str(steps), str(work / "end.ckpt"), "1"],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{exe.name} failed under qemu: {r.stderr[-2000:]}")
    line = [ln for ln in (r.stderr + r.stdout).replace("insns", "\ninsns").splitlines() if ln.startswith("insns ")]
    return int(line[-1].split()[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lstm_b1,transformer,mobilenetv2")
    ap.add_argument("--schemes", default="full,sparse")
    ap.add_argument("--full", nargs="?", const="all", default="",
                    help="the real workloads (default: bench/models.py quick); --full=lstm_b1 takes the real size "
                         "only for the named ones (the real transformer takes ~10 min per build under qemu)")
    ap.add_argument("--steps", type=int, default=2, help="K: extra steps the per-step count is taken over")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--builds", default="ours,no-autovec,scalar", help="the kernel builds to count (ours always)")
    ap.add_argument("--compute", default="",
                    help="also count the step compiled with these compute_dtypes (e.g. bf16,fp16: the frozen-weight "
                         "products in bf16 on BFMMLA (qemu -cpu max has BF16) / fp16), this checkout's runtime; "
                         "columns 'compute-bf16' ... (a Llama with frozen linears, sparse and LoRA: compute_insns.py)")
    a = ap.parse_args(argv)
    missing = [t for t in (CXX, CC, QEMU, "gcc") if shutil.which(t) is None]
    if missing:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    from frameworks import LR, MOMENTUM
    from models import workloads
    keys = a.models.split(",")
    real = a.full.split(",") if a.full and a.full != "all" else []

    def is_real(key: str) -> bool:
        return a.full == "all" or any(key.startswith(k) for k in real)
    wls = [w for quick in (True, False) for w in workloads(quick)
           if any(w.key.startswith(k) for k in keys) and is_real(w.key) != quick]
    builds = {"ours": (ROOT / "native" / "runtime", ()), "no-autovec": (ROOT / "native" / "runtime", NOVEC),
              "scalar": (ROOT / "native" / "runtime", (*NOVEC, "-DPOCK_SIMD_NONE"))}
    if os.environ.get("POCK_BENCH_REF_RUNTIME"):
        builds["ref"] = (Path(os.environ["POCK_BENCH_REF_RUNTIME"]), ())
    builds = {k: v for k, v in builds.items() if k in a.builds.split(",") + ["ours", "ref"]}
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-insns-") as tmp:
        tmp = Path(tmp)
        lib = plugin(tmp)
        for w in wls:
            for scheme in a.schemes.split(","):
                if scheme not in w.schemes:
                    continue
                work = tmp / f"{w.key}-{scheme}"
                work.mkdir()
                model = w.make().train()
                g = torch.Generator().manual_seed(1234)
                x, y = w.inputs(g)
                prog = pe.compile(model, x, y, loss="cross_entropy", update=w.schemes[scheme](model),
                                  optimizer=pe.SGD(lr=LR, momentum=MOMENTUM), name=f"insns_{w.key}_{scheme}")
                (work / "model.cpp").write_text(prog.source())
                host = prog.build()
                host.save(work / "start.ckpt")
                with open(work / "data.bin", "wb") as f:
                    for _ in range(1 + a.steps):
                        for t, io in zip([*x, *y], host.inputs + host.targets):
                            f.write(np.ascontiguousarray(t.numpy(), dtype=io.dtype).tobytes())
                row = {"workload": w.key, "scheme": scheme, "flops_per_step": prog.stats()["flops_per_step"]}
                for cd in filter(None, a.compute.split(",")):  # the same step, frozen-weight products in cd
                    p_cd = pe.compile(model, x, y, loss="cross_entropy", update=w.schemes[scheme](model),
                                      optimizer=pe.SGD(lr=LR, momentum=MOMENTUM), compute_dtype=cd,
                                      name=f"insns_{w.key}_{scheme}_{cd}")
                    (work / f"model-{cd}.cpp").write_text(p_cd.source())
                    p_cd.build().save(work / f"start-{cd}.ckpt")
                    exe = build(work / f"model-{cd}.cpp", ROOT / "native" / "runtime", (), work / f"train-{cd}")
                    c1 = count(exe, lib, work, 1, f"start-{cd}.ckpt")
                    row[f"compute-{cd}"] = (count(exe, lib, work, 1 + a.steps, f"start-{cd}.ckpt") - c1) / a.steps
                    print(f"{w.key}/{scheme} compute {cd}: {row[f'compute-{cd}'] / 1e6:.1f} M instructions/step",
                          flush=True)
                for name, (rt, extra) in builds.items():
                    t0 = time.perf_counter()
                    exe = build(work / "model.cpp", rt, extra, work / f"train-{name}")
                    c1 = count(exe, lib, work, 1)
                    ck = count(exe, lib, work, 1 + a.steps)
                    row[name] = (ck - c1) / a.steps
                    print(f"{w.key}/{scheme} {name}: {row[name] / 1e6:.1f} M instructions/step "
                          f"[{time.perf_counter() - t0:.0f} s]", flush=True)
                rows.append(row)
    out = Path(a.out)
    (out / "results.json").write_text(json.dumps({"full": a.full or False, "rows": rows}, indent=1))
    names = list(builds) + [f"compute-{cd}" for cd in filter(None, a.compute.split(","))]
    lines = ["# aarch64 instructions per training step (qemu-aarch64 + bench/arm64/insn_count.c)", "",
             f"{'Real' if a.full == 'all' else 'Miniature (bench/models.py quick)'} workloads"
             f"{f' (real size: {a.full})' if a.full and a.full != 'all' else ''}, one thread, "
             f"{' '.join(FLAGS[:2])}. Fewer is better; the ratio is the build's count / ours.", "",
             "| model | scheme | MFLOP/step | " + " | ".join(f"{n} (M insns)" for n in names) + " | " +
             " | ".join(f"{n} / ours" for n in names[1:]) + " |",
             "|---|---|---:|" + "---:|" * (2 * len(names) - 1)]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['scheme']} | {r['flops_per_step'] / 1e6:.1f} | " +
                     " | ".join(f"{r[n] / 1e6:.2f}" for n in names) + " | " +
                     " | ".join(f"{r[n] / r['ours']:.2f}x" for n in names[1:]) + " |")
    if (out / "lowp_cd_results.md").exists():  # compute_dtype's per-product counts (lowp_cd_insns.py)
        lines += ["", (out / "lowp_cd_results.md").read_text().rstrip("\n")]
    if (out / "compute_results.md").exists():  # fp32 against bf16/fp16 compute per step (compute_insns.py)
        lines += ["", "#" + (out / "compute_results.md").read_text().rstrip("\n")]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
