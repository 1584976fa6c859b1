#!/usr/bin/env python3
"""Cross-compile PockEngine's runtime and a program for aarch64 Linux, and run it
under qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user).

    python scripts/cross_build.py -o out/train model.cpp tests/arm64/train_driver.c
    python scripts/cross_build.py --run out/train ARGS...

The runtime (native/runtime/*.cpp and kernels/*.cpp) goes into one static
archive, so a program links only the members it needs: a kernel test pulls the
kernels without the C API, a training driver pulls the C API and its model TU.
Objects and the archive are cached by content hash (compiler, flags, source,
every runtime header) under <pockengine's cache>/aarch64 ($POCK_CACHE_DIR,
default ~/.cache/pockengine) by pockengine.build.host's object cache, built
atomically under a file lock so several pytest-xdist workers can share them.  Executables are static, so qemu
needs no aarch64 sysroot.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
from pockengine.build.host import _digest, _produce, _run, cache_dir, compile_objects as _compile  # noqa: E402
RUNTIME = Path(os.environ.get("POCK_RUNTIME_DIR", ROOT / "native" / "runtime"))  # as build/host.py
CXX = os.environ.get("AARCH64_CXX", "aarch64-linux-gnu-g++")
CC = os.environ.get("AARCH64_CC", "aarch64-linux-gnu-gcc")
AR = os.environ.get("AARCH64_AR", "aarch64-linux-gnu-ar")
QEMU = os.environ.get("QEMU_AARCH64", "qemu-aarch64")
# armv8.2-a+fp16+dotprod: the baseline of current phones; qemu's "-cpu max" has it all.
# POCK_AARCH64_EXTRA: more flags for every object, e.g. the scalar comparison build
# "-DPOCK_SIMD_NONE -fno-tree-vectorize -fno-tree-slp-vectorize" (kernels/simd.h).
TARGET = ("-O2", "-march=armv8.2-a+fp16+dotprod", "-pthread", *os.environ.get("POCK_AARCH64_EXTRA", "").split())
INCLUDES = ("-I", str(RUNTIME / "include"), "-I", str(RUNTIME))


def missing_tools() -> list[str]:
    """The cross tools that are not on PATH (empty when everything is there)."""
    return [t for t in (CXX, CC, AR, QEMU) if shutil.which(t) is None]


def compile_objects(sources) -> list[Path]:
    """Compile C and C++ sources (cached), in parallel; returns their objects in order.
    A source's key holds the headers it can see (the runtime's and those beside it)."""
    headers = _digest(sorted(RUNTIME.rglob("*.h")))
    sources = [Path(s).resolve() for s in sources]
    objs = {}
    for lang, tool, std in (("c", CC, "-std=c11"), ("c++", CXX, "-std=c++17")):
        mine = [src for src in sources if (src.suffix == ".c") == (lang == "c")]
        jobs = [(src, (*TARGET, std, *INCLUDES), headers + _digest(sorted(src.parent.glob("*.h")))) for src in mine]
        objs.update(zip(mine, _compile(jobs, (tool,), subdir="aarch64/obj", what=f"aarch64 {lang} compilation")))
    return [objs[src] for src in sources]


def runtime_archive() -> Path:
    """libpock_rt.a for aarch64: every runtime and kernel source."""
    srcs = sorted(RUNTIME.glob("*.cpp")) + sorted((RUNTIME / "kernels").glob("*.cpp"))
    objs = compile_objects(srcs)
    key = hashlib.sha256("\0".join(o.name for o in objs).encode()).hexdigest()[:24]
    return _produce(cache_dir() / "aarch64" / "lib" / f"libpock_rt-{key}.a",
                    lambda tmp: [AR, "rcs", str(tmp), *map(str, objs)], "archiving")


def build_executable(sources, out: Path, extra_link=()) -> Path:
    """Compile sources, link them statically with the runtime archive into out."""
    objs = compile_objects(sources)
    archive = runtime_archive()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        _run([CXX, *TARGET, "-static", *map(str, objs), str(archive), *extra_link, "-o", str(tmp)], "linking (aarch64)")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def run(exe, *args, timeout: float = 120, cpu: str = "max") -> subprocess.CompletedProcess:
    """Run an aarch64 executable under qemu (cpu "max": every CPU feature on; "neoverse-n1": an
    Armv8.2 core with fp16 and dotprod but no BF16); output is captured."""
    return subprocess.run([QEMU, "-cpu", cpu, str(exe), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", help="executable to build from SOURCES")
    ap.add_argument("--run", metavar="EXE", help="run EXE under qemu-aarch64 with the remaining arguments")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="sources (build) or arguments (--run)")
    a = ap.parse_args(argv)
    if missing_tools():
        print(f"missing: {', '.join(missing_tools())} (apt-get install g++-aarch64-linux-gnu qemu-user)",
              file=sys.stderr)
        return 2
    if a.run:
        r = run(a.run, *a.rest, timeout=None)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        return r.returncode
    if not a.output or not a.rest:
        ap.error("give -o EXE and the sources, or --run EXE")
    print(build_executable(a.rest, Path(a.output)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
