"""The aarch64 "vectorization disabled" build bench/arm64/insns.py counts our step against
(-DPOCK_SIMD_NONE -fno-tree-vectorize -fno-tree-slp-vectorize, kernels/simd.h) really has no
NEON arithmetic in the vector kernels, while the normal build does.  (Its numerics: run
tests/arm64/test_arm64.py with POCK_AARCH64_EXTRA set to those flags.)"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RT = ROOT / "native" / "runtime"
CXX, OBJDUMP = "aarch64-linux-gnu-g++", "aarch64-linux-gnu-objdump"
SCALAR = ("-DPOCK_SIMD_NONE", "-fno-tree-vectorize", "-fno-tree-slp-vectorize")
VECTOR_ARITH = re.compile(r"\b(fmla|fadd|fmul|fsub)\s+v\d+\.(4s|2s|8h)")

pytestmark = pytest.mark.skipif(not (shutil.which(CXX) and shutil.which(OBJDUMP)),
                                reason="aarch64 cross tools missing (apt-get install g++-aarch64-linux-gnu)")


def _vector_ops(src: Path, extra, tmp: Path) -> int:
    obj = tmp / f"{src.stem}{'-scalar' if extra else ''}.o"
    subprocess.run([CXX, "-std=c++17", "-O2", "-march=armv8.2-a+fp16+dotprod", *extra, "-I", str(RT / "include"),
                    "-I", str(RT), "-c", str(src), "-o", str(obj)], check=True, capture_output=True, text=True)
    dis = subprocess.run([OBJDUMP, "-d", str(obj)], check=True, capture_output=True, text=True).stdout
    return len(VECTOR_ARITH.findall(dis))


@pytest.mark.parametrize("kernel", ["gemm", "activation", "softmax", "conv2d_dw_small"])
def test_scalar_build_has_no_neon_arithmetic(kernel, tmp_path):
    src = RT / "kernels" / f"{kernel}.cpp"
    assert _vector_ops(src, (), tmp_path) > 0, f"{kernel}.cpp: the normal aarch64 build has no NEON arithmetic"
    assert _vector_ops(src, SCALAR, tmp_path) == 0, f"{kernel}.cpp: the scalar build still has NEON arithmetic"
