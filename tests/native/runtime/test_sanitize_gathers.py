"""The gather-like kernels under AddressSanitizer and UBSan (issue 13): a C++ driver
(sanitize/gather_kernels.cpp) calls embedding forward/backward, its low-precision forward
(bf16, f16, int8), cross-entropy and NLL forward/backward and first_bad_index directly with
hostile indices (-1, vocab, 10**6, 2**32, 2**40, INT64_MIN/MAX) in arrays of exactly their
size.  Each kernel must never read with a bad index (any out-of-bounds read is a sanitizer
report), must return the first bad position, and must give the other rows what good
indices give.  The driver also checks the update kernels' check_finite flag (a NaN/inf in
the gradient leaves parameter and optimizer state bit-identical).  (Before: embedding_fwd read w[10**6 * D], an ASan SEGV, and the kernels
reported nothing.)  It runs as its own process: nothing preloads ASan into Python."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "native" / "runtime"
DRIVER = Path(__file__).resolve().parent / "sanitize" / "gather_kernels.cpp"
KERNELS = ("embedding.cpp", "copy.cpp", "loss.cpp", "lowp.cpp", "lowp_dot.cpp", "lowp_amx.cpp", "guards.cpp",
           "gemm.cpp", "optimizer.cpp")  # copy.cpp: embedding_bwd zeroes the table with its threaded fill
SOURCES = [RUNTIME / "kernels" / f for f in KERNELS] + [RUNTIME / "threadpool.cpp"]
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
ENV = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
       "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def sanitizing_compiler(tmp_path) -> str | None:
    """A C++ compiler whose ASan/UBSan runtime links and runs here, or None."""
    probe = tmp_path / "probe.cpp"
    probe.write_text("int main() { int* p = new int[2]; p[1] = 1; int r = p[1] - 1; delete[] p; return r; }\n")
    for cxx in ("g++", "clang++"):
        path = shutil.which(cxx)
        if path is None:
            continue
        exe = tmp_path / f"probe_{cxx}"
        build = subprocess.run([path, *SANITIZE, str(probe), "-o", str(exe)], capture_output=True)
        if build.returncode == 0 and subprocess.run([str(exe)], env=ENV, capture_output=True).returncode == 0:
            return path
    return None


def test_gather_kernels_with_hostile_ids_under_asan_and_ubsan(tmp_path):
    cxx = sanitizing_compiler(tmp_path)
    if cxx is None:
        pytest.skip("no C++ compiler with a working AddressSanitizer/UBSan runtime")
    exe = tmp_path / "gather_kernels"
    subprocess.run([cxx, "-std=c++17", "-Wall", *SANITIZE, "-I", str(RUNTIME / "include"), "-I", str(RUNTIME),
                    str(DRIVER), *map(str, SOURCES), "-o", str(exe), "-lpthread"], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    assert "runtime error" not in r.stderr and "AddressSanitizer" not in r.stderr, r.stderr[-4000:]
