"""compute_dtype="bf16" on x86 CPUs with AVX512_BF16 (kernels/lowp_dot.cpp's VDPBF16PS path), run on
any x86 CPU: the library is built with -DPOCK_EMULATE_DPBF16, which replaces the three instructions
(a 16-lane load, VDPBF16PS, a masked store) with Intel's definition in C++, so the packing, the
12 x 32 tiling, the edges and the threading run as on such a CPU.
- the product bit for bit against numpy's fp32 replay of that definition (each lane adds the odd
  element's product, then the even one's, depth pair after depth pair), for both packers;
- linear_fwd_lowp_cd / linear_bwd_input_lowp_cd taking it, judged by test_kernels_lowp_cd's own
  tests (float64 of the rounded operands, identities bit-exact, rounding edges: a bf16 subnormal,
  which the instruction reads as zero, sends the product to the portable path).
Every test runs twice: on VDPBF16PS (-DPOCK_EMULATE_DPBF16) and on AMX's tiles (lowp_amx.cpp,
-DPOCK_EMULATE_AMX: TDPBF16PS, its loads and stores as Intel defines them; the even element's
product before the odd one's)."""
import ctypes

import numpy as np
import pytest

import test_kernels_lowp_cd as cd_tests
from conftest import build_shim, ptr
from test_kernels_lowp import ODD, SHAPES

i64, vp, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


EMULATE = {"vdpbf16ps": "-DPOCK_EMULATE_DPBF16", "amx": "-DPOCK_EMULATE_AMX"}


@pytest.fixture(scope="module", params=sorted(EMULATE))
def lib(request):
    lib = build_shim("lowp_dp_shim.cpp", (EMULATE[request.param],))
    lib.path = request.param
    lib.shim_bf16_dp_available.restype = cint
    lib.shim_bf16_amx_available.restype = cint
    lib.shim_bf16_dp_rows.restype = cint
    lib.shim_bf16_dp_rows.argtypes = [vp, i64, i64, vp, i64, i64, i64, vp, i64, cint]
    lib.shim_bf16_dp_cols.restype = cint
    lib.shim_bf16_dp_cols.argtypes = [vp, i64, i64, vp, i64, i64, vp, i64, cint]
    return lib


def bf16(rng, shape, scale=1.0):
    """Random bf16 bit patterns (normal values of either sign) and their fp32 values."""
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    bits = (v.view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def replay(a, b, path):
    """C = a [M, D] . b [R, D]^T as the instruction sums it: per depth pair p, VDPBF16PS adds
    a[2p+1] b[2p+1] then a[2p] b[2p], AMX's TDPBF16PS the even one first; each addition rounded
    to fp32 (the products are exact)."""
    M, D = a.shape
    c = np.zeros((M, b.shape[0]), np.float32)
    for p in range(0, D, 2):
        order = (p + 1, p) if path == "vdpbf16ps" else (p, p + 1)
        for k in order:
            if k < D:
                c = c + np.outer(a[:, k], b[:, k])
    return c


def test_the_emulated_build_takes_the_path(lib):
    assert lib.shim_bf16_dp_available() == 1
    assert lib.shim_bf16_amx_available() == (lib.path == "amx")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,R,D", [(1, 1, 1), (1, 33, 2), (12, 32, 7), (13, 31, 8), (25, 65, 17), (3, 100, 64),
                                   (40, 7, 130), (11, 1, 5), (127, 40, 96), (33, 64, 33), (64, 33, 64)])
def test_product_bit_for_bit_against_the_instructions_definition(lib, threads, M, R, D):
    rng = np.random.default_rng(M * 100 + R * 10 + D)
    lda = D + (D % 2) + 2  # even, padded with zeros past D
    a_bits = np.zeros((M, lda), np.uint16)
    a_bits[:, :D], a = bf16(rng, (M, D))
    b_bits, b = bf16(rng, (R, D))
    want = replay(a, b, lib.path)
    ldc = R + 3
    c = np.full((M, ldc), np.nan, np.float32)
    assert lib.shim_bf16_dp_rows(ptr(a_bits), lda, M, ptr(np.ascontiguousarray(b_bits)), D, R, D, ptr(c), ldc,
                                 threads) == 1
    np.testing.assert_array_equal(c[:, :R], want)
    assert np.isnan(c[:, R:]).all()  # nothing written past the R columns
    w_bits = np.ascontiguousarray(b_bits.T)  # W [D, R]: its columns are b's rows
    c2 = np.full((M, ldc), np.nan, np.float32)
    assert lib.shim_bf16_dp_cols(ptr(a_bits), lda, M, ptr(w_bits), D, R, ptr(c2), ldc, threads) == 1
    np.testing.assert_array_equal(c2[:, :R], want)
    assert np.isnan(c2[:, R:]).all()


@pytest.mark.parametrize("R,D,at,bits", [(20, 10, (7, 3), 0x0001), (20, 40, (3, 17), 0x807f), (40, 40, (35, 0), 0x0040),
                                         (40, 33, (12, 32), 0x0001)])
def test_a_subnormal_weight_is_refused_by_the_packers(lib, R, D, at, bits):
    """Anywhere in the weight (the vector loops' blocks and their scalar edges), either sign."""
    rng = np.random.default_rng(3)
    M = 4
    a_bits = np.zeros((M, D + D % 2), np.uint16)
    a_bits[:, :D], _ = bf16(rng, (M, D))
    b_bits, _ = bf16(rng, (R, D))
    b_bits[at] = bits  # a bf16 subnormal
    c = np.zeros((M, R), np.float32)
    lda = a_bits.shape[1]
    assert lib.shim_bf16_dp_rows(ptr(a_bits), lda, M, ptr(b_bits), D, R, D, ptr(c), R, 1) == 0
    w_bits = np.ascontiguousarray(b_bits.T)
    assert lib.shim_bf16_dp_cols(ptr(a_bits), lda, M, ptr(w_bits), D, R, ptr(c), R, 1) == 0
    b_bits[at] = 0x0080  # the smallest normal: accepted
    assert lib.shim_bf16_dp_rows(ptr(a_bits), lda, M, ptr(b_bits), D, R, D, ptr(c), R, 1) == 1


@pytest.mark.parametrize("dt", ["bf16", "f16", "i8", "q4"])
@pytest.mark.parametrize("M,N,K", SHAPES + ODD)
def test_linear_cd_takes_it_and_meets_the_fp64_bound(lib, dt, M, N, K):
    cd_tests.test_linear_cd_against_fp64_of_rounded_operands(lib, "bf16", dt, M, N, K)


def test_low_precision_identities_and_rounding_edges(lib):
    cd_tests.test_the_product_really_is_in_low_precision(lib, "bf16")
    for N, K in [(37, 96), (3, 544)]:
        cd_tests.test_identity_reads_the_rounded_weight(lib, "bf16", N, K)
    cd_tests.test_rounding_edges(lib, "bf16")


@pytest.mark.slow  # ~2 min each: a whole step library built with the emulation
@pytest.mark.parametrize("path", sorted(EMULATE))
def test_tiny_llama_trains_on_it_as_judged_for_every_bf16_path(monkeypatch, path):
    """tests/compiler/test_compute_dtype.py's end-to-end judgement (3 steps of sparse + LoRA against
    PyTorch fp64, our error at most 2x autocast-bf16's; frozen weights bit-exact), with the step's
    library built with the emulated instructions: the whole step on the VDPBF16PS path."""
    import importlib.util
    import os
    import shlex
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "compute_dtype_tests", Path(__file__).resolve().parents[2] / "compiler" / "test_compute_dtype.py")
    test_compute_dtype = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_compute_dtype)
    monkeypatch.setenv("CXX", shlex.join([*shlex.split(os.environ.get("CXX", "g++")), EMULATE[path]]))
    test_compute_dtype.test_tiny_llama_sparse_lora_against_fp64_and_autocast("bf16")
