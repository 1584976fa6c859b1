// lowp_dot.cpp — compute_dtype="bf16" products on arm64 CPUs that have BF16 (FEAT_BF16:
// Armv8.6, Cortex-A710/X2 and later, Apple A15 and later), chosen at run time from the
// hwcaps (getauxval(AT_HWCAP2) & HWCAP2_BF16; Apple: hw.optional.arm.FEAT_BF16), so one
// library serves every phone: lowp.cpp's *_cd kernels take this path when
// bf16_dot_available(), the portable fp32 GEMM over rounded operands otherwise.
//
// The product is a set of dot products of bf16 rows, both operands contiguous along
// the depth (x @ w^T: the rows of x and of w; dy @ w: the rows of dy and of w^T,
// packed per call): C[i][j] = sum_l A[i][l] * B[j][l] in fp32.  BFMMLA multiplies a 2 x 4
// block of A by a 4 x 2 block of B^T into a 2 x 2 block of fp32 accumulators (16 multiply-adds
// an instruction; BFDOT does 8), so both operands are repacked per call in pairs of rows
// interleaved by 4 along the depth; C is computed 4 x 8 at a time, each element in its own
// accumulator over the depth in order, so its arithmetic does not depend on the block it
// falls in or on the thread count.  Per 4 depth steps BFMMLA adds two pairs of exact products
// (each pair summed, then added to the accumulator, with Arm's BF16 rounding, not IEEE's): the
// result agrees with fp32 accumulation of the exact products to fp32 rounding, which is how
// the tests judge it (tests/arm64, against float64 products of the rounded operands).
#include <algorithm>
#include <cstdint>

#include "arm_features.h"
#include "gemm_detail.h"
#include "pock_kernels.h"
#include "pock_parallel.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace pk {
namespace detail {

#if defined(__aarch64__)

namespace {

bool detect_bf16() { return arm_has("hw.optional.arm.FEAT_BF16", 2, 1ul << 14); }  // HWCAP2_BF16

// ---- BFMMLA: a 2 x 4 block of bf16 times a 4 x 2 block, accumulated into a 2 x 2 fp32 block
// (16 multiply-adds an instruction, BFDOT's 8).  Operands in pairs of rows interleaved by 4
// along the depth: pair p, group g = [row 2p][4g, 4g + 4) then [row 2p + 1][4g, 4g + 4).

// out (pairs of rows of X [rows, L], rows padded with zeros to pad_rows, a multiple of 2)
void pack_pairs(const uint16_t* X, i64 rows, i64 pad_rows, i64 L, uint16_t* out) {
  for (i64 p = 0; p < pad_rows / 2; ++p) {
    const uint16_t* r0 = X + 2 * p * L;
    const uint16_t* r1 = 2 * p + 1 < rows ? r0 + L : nullptr;
    uint16_t* o = out + p * 2 * L;
    if (2 * p >= rows) {
      for (i64 l = 0; l < 2 * L; ++l) o[l] = 0;
      continue;
    }
    for (i64 l = 0; l < L; l += 8) {
      const uint64x2_t a = vreinterpretq_u64_u16(vld1q_u16(r0 + l));
      const uint64x2_t b = r1 ? vreinterpretq_u64_u16(vld1q_u16(r1 + l)) : vdupq_n_u64(0);
      vst1q_u16(o + 2 * l, vreinterpretq_u16_u64(vzip1q_u64(a, b)));
      vst1q_u16(o + 2 * l + 8, vreinterpretq_u16_u64(vzip2q_u64(a, b)));
    }
  }
}

// C rows [0, 4) x columns [0, 8) of A pairs (2) . B pairs (4): acc[i][j] = [C[2i][2j], C[2i][2j+1],
// C[2i+1][2j], C[2i+1][2j+1]]; tile[r * 8 + c] = C[r][c].
__attribute__((target("arch=armv8.2-a+bf16"))) void mmla_block(const uint16_t* A, const uint16_t* B, i64 L,
                                                                 float* tile) {
  float32x4_t acc[2][4];
#pragma GCC unroll 4
  for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = vdupq_n_f32(0.0f);
  for (i64 g = 0; g < 2 * L; g += 8) {  // 4 depth steps of a pair: 8 values
    bfloat16x8_t a[2], b[4];
#pragma GCC unroll 4
    for (int i = 0; i < 2; ++i) a[i] = vreinterpretq_bf16_u16(vld1q_u16(A + i * 2 * L + g));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) b[j] = vreinterpretq_bf16_u16(vld1q_u16(B + j * 2 * L + g));
#pragma GCC unroll 4
    for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[i][j] = vbfmmlaq_f32(acc[i][j], a[i], b[j]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; j += 2) {
      vst1q_f32(tile + (2 * i) * 8 + 2 * j, vcombine_f32(vget_low_f32(acc[i][j]), vget_low_f32(acc[i][j + 1])));
      vst1q_f32(tile + (2 * i + 1) * 8 + 2 * j, vcombine_f32(vget_high_f32(acc[i][j]), vget_high_f32(acc[i][j + 1])));
    }
}

struct ScratchPairsA {};
struct ScratchPairsB {};

}  // namespace

bool bf16_dot_available() {
  static const bool has = detect_bf16();
  return has;
}

void bf16_dot_rows(const uint16_t* A, const uint16_t* B, float* C, i64 M, i64 R, i64 L, i64 ldc) {
  // BFMMLA over 4 x 8 blocks of C: A and B repacked in interleaved pairs of rows (per call)
  const i64 Mp = (M + 3) / 4 * 4, Rp = (R + 7) / 8 * 8;
  uint16_t* Ap = reinterpret_cast<uint16_t*>(thread_scratch<ScratchPairsA>((Mp * L + 1) / 2));
  uint16_t* Bp = reinterpret_cast<uint16_t*>(thread_scratch<ScratchPairsB>((Rp * L + 1) / 2));
  pack_pairs(A, M, Mp, L, Ap);
  parallel_for(Rp / 8, grain_for_work(8 * L, kMinChunkElems), [&](i64 b0, i64 b1) {
    pack_pairs(B + b0 * 8 * L, std::min<i64>(R - b0 * 8, (b1 - b0) * 8), (b1 - b0) * 8, L, Bp + b0 * 8 * L);
  });
  parallel_for(Rp / 8, grain_for_work(8 * Mp * L, kMinChunkMacs), [&](i64 b0, i64 b1) {
    alignas(16) float tile[4 * 8];
    for (i64 rb = b0; rb < b1; ++rb) {
      const i64 j = rb * 8, nc = std::min<i64>(8, R - j);
      for (i64 i = 0; i < M; i += 4) {
        mmla_block(Ap + i * L, Bp + j * L, L, tile);
        const i64 mr = std::min<i64>(4, M - i);
        for (i64 r = 0; r < mr; ++r)
          for (i64 c = 0; c < nc; ++c) C[(i + r) * ldc + j + c] = tile[r * 8 + c];
      }
    }
  });
}

#else  // no BFDOT on this architecture: the portable path

bool bf16_dot_available() { return false; }
void bf16_dot_rows(const uint16_t*, const uint16_t*, float*, i64, i64, i64, i64) {}

#endif

}  // namespace detail
}  // namespace pk
