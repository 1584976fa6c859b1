// gemm_detail.h — internal to the kernels (not part of the public runtime API): the entry
// points gemm.cpp defines for the other kernels (linear, conv2d, attention, lowp, the RNNs),
// declared once here.
#pragma once

#include <vector>

#include "pock_kernels.h"

namespace pk {
struct UpdateEpilogue;  // update_math.h

namespace detail {
// A column-major op(A) (element (r, k) at a[k*cs + r]) is read in place up to this stride
// and packed beyond it (per strip, on every call): beyond it a strip's kKC rows of kMR
// floats each sit in a new cache line at a large power-of-two-ish stride (dy^T in
// dw = dy^T x: the stride is the layer width), so they collide in a few L1 sets and every
// micro-kernel pass refetches them from L2.
constexpr i64 kColMajorInPlace = 64;

// A per-thread buffer of at least n floats, grown on first use (never shrunk, freed at thread
// exit). One buffer per Tag type, so a kernel's scratch and that of the GEMM it calls with
// it (conv2d's images side by side, then gemm.cpp's swapped product) never share memory.
template <class Tag>
float* thread_scratch(i64 n) {
  thread_local std::vector<float> buf;
  if (static_cast<i64>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// C[M,N] (row stride ldc) = op(A) @ op(B) (+ C when accumulate),
// op(A)[i][k] = A[i*a_rs + k*a_cs], op(B)[k][j] = B[k*b_rs + j*b_cs].
void gemm_strided(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                  i64 M, i64 N, i64 K, bool accumulate);
// As gemm_strided (overwriting C), then C[i][j] = act(C[i][j] + bias[j]) as each tile is stored.
void gemm_strided_bias_act(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C,
                           i64 ldc, i64 M, i64 N, i64 K, const float* bias, Act act);
// As gemm_strided with beta 0, the last depth block handing each finished row of a tile to
// upd.apply (an optimizer update) instead of storing it; false (nothing done) where
// gemm_strided would not take the blocked path.
bool gemm_strided_update(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                         i64 M, i64 N, i64 K, const UpdateEpilogue& upd);
// As gemm_strided with beta 0, and *finite = no NaN/inf stored (tested as each row of a tile
// is stored); false (nothing done) where gemm_strided would not take the blocked path.
bool gemm_strided_checked(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C,
                          i64 ldc, i64 M, i64 N, i64 K, bool* finite);

// Reader-based operands (implicit GEMM): a reader fills out[r*ld + c] with rows [r0, r0+rows)
// x columns [c0, c0+cols) of a logical matrix; it may be called from several threads at once.
using BlockReadFn = void (*)(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld);
// C[M,N] = A @ B (+ C when accumulate); read_at reads A^T ([K, M]), read_b reads B ([K, N]).
void gemm_readers(BlockReadFn read_at, const void* at_ctx, BlockReadFn read_b, const void* b_ctx, float* C,
                  i64 ldc, i64 M, i64 N, i64 K, bool accumulate);
// op(A) a strided view (as gemm_strided), op(B) [K, N] from a reader:
// C = op(A) @ op(B) + beta*C, then bias (nullable) and act per tile.
void gemm_view_reader(const float* A, i64 a_rs, i64 a_cs, BlockReadFn read_b, const void* b_ctx, float* C, i64 ldc,
                      i64 M, i64 N, i64 K, float beta, const float* bias, Act act);

// lowp.cpp: out[0, n) = dequant(w)[row, c0 : c0 + n] for w [rows, K] stored as dt (scale as
// linear_fwd_lowp's), exactly: the values every low-precision kernel multiplies (gemv.cpp's
// portable path and row tails read them through this).
void dequant_span(const void* w, LowpDtype dt, const float* scale, i64 K, i64 row, i64 c0, i64 n, float* out);

// lowp_dot.cpp: compute_dtype's bf16 products on arm64 CPUs with BF16 (BFMMLA; hwcaps, at run time;
// false elsewhere): C[i][j] (row stride ldc) = sum_l A[i][l] * B[j][l], A [M, L] and B [R, L]
// bf16 rows, L a multiple of 8 (zero padded), fp32 accumulation.
bool bf16_dot_available();
void bf16_dot_rows(const uint16_t* A, const uint16_t* B, float* C, i64 M, i64 R, i64 L, i64 ldc);

// lowp_dot.cpp: compute_dtype's bf16 products on x86 CPUs with AVX512_BF16 (VDPBF16PS) or AMX-BF16
// (lowp_amx.cpp's tiles; cpuid, at run time; false elsewhere).  C[i][j] (row stride ldc) = sum_l A[i][l] * B[j][l] over the depth
// l < D in fp32, A [M, D] bf16 rows (row stride lda, even, zero padded to an even depth), B packed
// by a pack_* call into bf16_dp_panel_words(R, D) words.  The packers return false when an operand
// of B is a bf16 subnormal (the instruction reads those as zero): the caller then takes the
// portable path (the caller checks A).
bool bf16_dp_available();
i64 bf16_dp_panel_words(i64 R, i64 D);
// B [R, D] rows (row stride ldb): the forward's weight rows
bool bf16_dp_pack_rows(const uint16_t* B, i64 R, i64 D, i64 ldb, uint32_t* out);
// B[j][l] = W[l][j], W [D, R] rows: the input gradient's weight columns, no transpose (pairs of W's rows)
bool bf16_dp_pack_cols(const uint16_t* W, i64 D, i64 R, uint32_t* out);
void bf16_dp_gemm(const uint16_t* A, i64 lda, i64 M, const uint32_t* panels, i64 R, i64 D, float* C, i64 ldc);
// lowp_amx.cpp: bf16_dp_gemm on x86 CPUs with AMX-BF16 (cpuid and the kernel's permission for the
// tile state; false elsewhere): the same panels with their depth padded to `pairs` (a multiple of 16)
bool bf16_amx_available();
void bf16_amx_gemm(const uint16_t* A, i64 lda, i64 M, const uint32_t* panels, i64 R, i64 D, i64 pairs, float* C,
                   i64 ldc);

// lowp_fmla.cpp: compute_dtype's fp16 products on arm64 CPUs with fp16 vector arithmetic
// (compile time, or hwcaps at run time; false elsewhere).  C = A @ B: A [M, D] fp16 rows (row
// stride lda, D a multiple of 8, zero padded), B [D, N] fp16 in panels of 16 columns (panel p at
// B + p * D * 16, row l of it at + l * 16; zero padded), into C[i*ldc + j] (C[j*ldc + i] when
// transposed); fp16 FMLA over chunks of 16 depth steps, the chunk sums added in fp32 (numerics
// in lowp_fmla.cpp).
bool f16_fmla_available();
void f16_fmla_gemm(const uint16_t* A, i64 lda, const uint16_t* B, float* C, i64 ldc, bool transposed, i64 M, i64 N,
                   i64 D);
// out[i*ld + l] = fp16(a[i*n + l] * mul), zeros for l in [n, ld)
void f16_round_rows(const float* a, i64 M, i64 n, float mul, uint16_t* out, i64 ld);
// (a [M, n] * mul)^T in fp16 as f16_fmla_gemm's B panels (D >= n rows)
void f16_round_panels_t(const float* a, i64 M, i64 n, float mul, uint16_t* out, i64 D);
// w [rows, cols] fp16 (row stride ld) as f16_fmla_gemm's B panels (D >= rows rows)
void f16_pack_panels(const uint16_t* w, i64 rows, i64 cols, i64 ld, uint16_t* out, i64 D);
// max |w| over n fp16 values (inf when any is inf or NaN)
float f16_absmax(const uint16_t* w, i64 n);
}  // namespace detail
}  // namespace pk
