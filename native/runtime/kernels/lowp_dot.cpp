// lowp_dot.cpp — compute_dtype="bf16" products on arm64 CPUs that have BFDOT (FEAT_BF16:
// Armv8.6, Cortex-A710/X2 and later, Apple A15 and later), chosen at run time from the
// hwcaps (getauxval(AT_HWCAP2) & HWCAP2_BF16; Apple: hw.optional.arm.FEAT_BF16), so one
// library serves every phone: lowp.cpp's *_cd kernels take this path when
// bf16_dot_available(), the portable fp32 GEMM over rounded operands otherwise.
//
// The product is a set of dot products of bf16 rows, both operands contiguous along
// the depth (x @ w^T: the rows of x and of w; dy @ w: the rows of dy and of w^T,
// packed per call): C[i][j] = sum_l A[i][l] * B[j][l] in fp32, a 4 x 4 block of C at
// a time, each element in its own accumulator (BFDOT: 8 bf16 products a vector into
// 4 fp32 lanes), so an element's arithmetic does not depend on the block it falls in
// or on the thread count.  BFDOT adds each pair of exact products before adding it to
// the accumulator (with Arm's BF16 rounding, not IEEE's): the result agrees with
// fp32 accumulation of the exact products to fp32 rounding, which is how the tests
// judge it (tests/arm64, against float64 products of the rounded operands).
#include <cstdint>

#include "pock_kernels.h"
#include "pock_parallel.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#if defined(__APPLE__)
#include <sys/sysctl.h>
#else
#include <sys/auxv.h>
#endif
#endif

namespace pk {
namespace detail {

#if defined(__aarch64__)

namespace {

bool detect_bf16() {
#if defined(__APPLE__)
  int v = 0;
  size_t n = sizeof(v);
  return sysctlbyname("hw.optional.arm.FEAT_BF16", &v, &n, nullptr, 0) == 0 && v != 0;
#else
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16 (asm/hwcap.h)
  return (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
#endif
}

// C[i][j] = sum_l A[i][l] * B[j][l] for an MR x NR block; L a multiple of 8.
template <int MR, int NR>
__attribute__((target("arch=armv8.2-a+bf16"))) void dot_block(const uint16_t* A, const uint16_t* B, float* C, i64 L, i64 ldc) {
  // (the small loops unrolled at -O2 too, so the accumulators stay in registers)
  float32x4_t acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = vdupq_n_f32(0.0f);
  for (i64 l = 0; l < L; l += 8) {
    bfloat16x8_t a[MR], b[NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) a[i] = vreinterpretq_bf16_u16(vld1q_u16(A + i * L + l));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) b[j] = vreinterpretq_bf16_u16(vld1q_u16(B + j * L + l));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = vbfdotq_f32(acc[i][j], a[i], b[j]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    if (NR == 4) {  // the four sums of a row in one vector
      vst1q_f32(C + i * ldc, vpaddq_f32(vpaddq_f32(acc[i][0], acc[i][1]), vpaddq_f32(acc[i][2], acc[i][3])));
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) C[i * ldc + j] = vaddvq_f32(acc[i][j]);
    }
  }
}

using DotBlock = void (*)(const uint16_t*, const uint16_t*, float*, i64, i64);
template <int MR>
constexpr DotBlock kRow[4] = {dot_block<MR, 1>, dot_block<MR, 2>, dot_block<MR, 3>, dot_block<MR, 4>};
constexpr const DotBlock* kBlocks[4] = {kRow<1>, kRow<2>, kRow<3>, kRow<4>};

}  // namespace

bool bf16_dot_available() {
  static const bool has = detect_bf16();
  return has;
}

void bf16_dot_rows(const uint16_t* A, const uint16_t* B, float* C, i64 M, i64 R, i64 L, i64 ldc) {
  const i64 rblocks = (R + 3) / 4;
  parallel_for(rblocks, grain_for_work(4 * M * L, kMinChunkMacs), [&](i64 b0, i64 b1) {
    for (i64 i = 0; i < M; i += 4) {
      const int mr = static_cast<int>(M - i < 4 ? M - i : 4);
      for (i64 rb = b0; rb < b1; ++rb) {
        const i64 j = rb * 4;
        const int nr = static_cast<int>(R - j < 4 ? R - j : 4);
        kBlocks[mr - 1][nr - 1](A + i * L, B + j * L, C + i * ldc + j, L, ldc);
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
