// lowp_fmla.cpp — compute_dtype="fp16" products on arm64 CPUs with half-precision vector
// arithmetic (FEAT_FP16, Armv8.2: FMLA on 8 fp16 lanes, twice fp32's multiply-adds per
// instruction).  Chosen at compile time where the target has it (-march=armv8.2-a+fp16:
// __ARM_FEATURE_FP16_VECTOR_ARITHMETIC), at run time from the hwcaps otherwise
// (getauxval(AT_HWCAP) & HWCAP_ASIMDHP; Apple: hw.optional.arm.FEAT_FP16), the kernel then
// compiled with target("+fp16"): one library serves every phone.  lowp.cpp's *_cd kernels take
// this path when f16_fmla_available(), the portable fp32 GEMM over rounded operands otherwise.
//
// Numerics (what tests/arm64 emulates exactly and bounds against fp64):
//   C[i][j] = sum over chunks c of fp32( h_c ),  h_c = the fp16 sum of A[i][l] * B[l][j] for
//   l in [16c, 16c + 16), one fused multiply-add per l in order, rounded to fp16 (RNE,
//   subnormals kept: Linux runs with FPCR.FZ16 = 0), from h = 0; the chunk sums are widened
//   exactly and added to an fp32 accumulator in order of c.
// An element's arithmetic does not depend on its block or the thread count.  The error of a
// chunk is at most 16 fp16 roundings of partial sums bounded by sum |A||B| over the chunk:
// |C - exact| <= (16 u16 + (D / 16) u32) sum_l |A[i][l] B[l][j]| (u16 = 2^-11, u32 = 2^-24),
// to first order; rounding the operands to fp16 adds 2 u16 sum |a w| against the unrounded
// product (bf16 operands alone give 2 u_bf16 = 2^-8 of it).  Overflow: lowp.cpp scales the
// activation operand so that max |a| max |w| <= 2^11, so a chunk's |h| <= 16 * 2^11 = 2^15 <
// 65504 (and max |a| <= 2^14, as the portable path).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "arm_features.h"
#include "gemm_detail.h"
#include "pock_kernels.h"
#include "pock_parallel.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace pk {
namespace detail {

#if defined(__aarch64__) && !defined(POCK_SIMD_NONE)  // (the scalar comparison build: the portable path)

#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
#define PK_FP16_TARGET
#else
#define PK_FP16_TARGET __attribute__((target("arch=armv8.2-a+fp16")))
#endif

namespace {

bool detect_fp16() {
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
  return true;  // the build's target has it
#else
  return arm_has("hw.optional.arm.FEAT_FP16", 1, 1ul << 10);  // HWCAP_ASIMDHP
#endif
}

constexpr int kChunk = 16;  // depth steps summed in fp16 before the fp32 accumulator

// One depth step s of a group of 8: h[i][*] += B[l + s][16 columns] * A[i][l + s].  FMLA by element:
// GCC turns vfmaq_laneq_f16 into DUP + FMLA when one lane feeds two FMLAs; the asm keeps the
// by-element form ("x": the lane's register in v0-v15, as the encoding needs).
#define PK_FMLA_STEP(s)                                                                       \
  {                                                                                           \
    const float16x8_t b0 = vld1q_f16(bl + (s) * 16), b1 = vld1q_f16(bl + (s) * 16 + 8);       \
    _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {                                    \
      asm("fmla %0.8h, %1.8h, %2.h[%3]" : "+w"(h[i][0]) : "w"(b0), "x"(a[i]), "i"(s));        \
      asm("fmla %0.8h, %1.8h, %2.h[%3]" : "+w"(h[i][1]) : "w"(b1), "x"(a[i]), "i"(s));        \
    }                                                                                         \
  }

// tile[i][0:16) = C[i][j0 : j0 + 16) for MR rows of A (16 columns of a row: 4 fp32 accumulators).
template <int MR>
PK_FP16_TARGET void fmla_block(const uint16_t* A, i64 lda, const uint16_t* B, i64 D, float* tile) {
  const float16_t* a16 = reinterpret_cast<const float16_t*>(A);
  const float16_t* b16 = reinterpret_cast<const float16_t*>(B);
  float32x4_t acc[MR][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[i][v] = vdupq_n_f32(0.0f);
  for (i64 l0 = 0; l0 < D; l0 += kChunk) {
    float16x8_t h[MR][2];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) h[i][0] = h[i][1] = vdupq_n_f16(0.0f);
    // the chunk's one or two groups of 8 depth steps, written out (no loop: h stays in registers)
#define PK_FMLA_GROUP(l)                                                      \
  {                                                                           \
    float16x8_t a[MR];                                                        \
    _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) a[i] = vld1q_f16(a16 + i * lda + (l)); \
    const float16_t* bl = b16 + (l) * 16;                                     \
    PK_FMLA_STEP(0) PK_FMLA_STEP(1) PK_FMLA_STEP(2) PK_FMLA_STEP(3)           \
    PK_FMLA_STEP(4) PK_FMLA_STEP(5) PK_FMLA_STEP(6) PK_FMLA_STEP(7)           \
  }
    PK_FMLA_GROUP(l0)
    if (l0 + 8 < D) PK_FMLA_GROUP(l0 + 8)
#undef PK_FMLA_GROUP
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {  // the chunk's fp16 sums, widened exactly, into fp32
      acc[i][0] = vaddq_f32(acc[i][0], vcvt_f32_f16(vget_low_f16(h[i][0])));
      acc[i][1] = vaddq_f32(acc[i][1], vcvt_high_f32_f16(h[i][0]));
      acc[i][2] = vaddq_f32(acc[i][2], vcvt_f32_f16(vget_low_f16(h[i][1])));
      acc[i][3] = vaddq_f32(acc[i][3], vcvt_high_f32_f16(h[i][1]));
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) vst1q_f32(tile + i * 16 + v * 4, acc[i][v]);
}

// 3 rows x 16 columns: 12 fp32 + 6 fp16 accumulators, 3 A and 2 B vectors, so every FMLA takes
// its A lane by index (a by-element fp16 operand must sit in v0-v15) with nothing spilled.
constexpr int kMR = 3;
#undef PK_FMLA_STEP
using FmlaBlock = void (*)(const uint16_t*, i64, const uint16_t*, i64, float*);
constexpr FmlaBlock kBlocks[kMR] = {fmla_block<1>, fmla_block<2>, fmla_block<3>};

}  // namespace

bool f16_fmla_available() {
  static const bool has = detect_fp16();
  return has;
}

void f16_fmla_gemm(const uint16_t* A, i64 lda, const uint16_t* B, float* C, i64 ldc, bool transposed, i64 M, i64 N,
                   i64 D) {
  const i64 jblocks = (N + 15) / 16;
  parallel_for(jblocks, grain_for_work(16 * M * D / 2, kMinChunkMacs), [&](i64 b0, i64 b1) {
    alignas(16) float tile[kMR * 16];
    for (i64 jb = b0; jb < b1; ++jb) {
      const i64 j0 = jb * 16, nc = std::min<i64>(16, N - j0);
      for (i64 i0 = 0; i0 < M; i0 += kMR) {
        const int mr = static_cast<int>(std::min<i64>(kMR, M - i0));
        kBlocks[mr - 1](A + i0 * lda, lda, B + jb * D * 16, D, tile);
        for (int i = 0; i < mr; ++i)
          for (i64 j = 0; j < nc; ++j) {
            if (transposed)
              C[(j0 + j) * ldc + i0 + i] = tile[i * 16 + j];
            else
              C[(i0 + i) * ldc + j0 + j] = tile[i * 16 + j];
          }
      }
    }
  });
}

// out[i*ld + l] = fp16(a[i*n + l] * mul) for l < n, zeros to ld (rows: 4 at a time with FCVTN)
void f16_round_rows(const float* a, i64 M, i64 n, float mul, uint16_t* out, i64 ld) {
  parallel_for(M, grain_for_work(ld, kMinChunkElems), [&](i64 r0, i64 r1) {
    const float32x4_t m = vdupq_n_f32(mul);
    for (i64 i = r0; i < r1; ++i) {
      const float* src = a + i * n;
      uint16_t* dst = out + i * ld;
      i64 l = 0;
      for (; l + 4 <= n; l += 4)
        vst1_u16(dst + l, vreinterpret_u16_f16(vcvt_f16_f32(vmulq_f32(vld1q_f32(src + l), m))));
      for (; l < n; ++l) {
        const __fp16 h = static_cast<__fp16>(src[l] * mul);
        std::memcpy(dst + l, &h, 2);
      }
      for (; l < ld; ++l) dst[l] = 0;
    }
  });
}

// The panels of (a [M, n] * mul)^T in fp16: out[(i / 16) * D * 16 + l * 16 + i % 16] = fp16(a[i*n + l] * mul),
// zeros for l in [n, D) and i in [M, pad16(M))
void f16_round_panels_t(const float* a, i64 M, i64 n, float mul, uint16_t* out, i64 D) {
  const i64 panels = (M + 15) / 16;
  parallel_for(panels, grain_for_work(16 * D, kMinChunkElems), [&](i64 p0, i64 p1) {
    for (i64 p = p0; p < p1; ++p) {
      uint16_t* dst = out + p * D * 16;
      std::memset(dst, 0, sizeof(uint16_t) * static_cast<size_t>(D * 16));
      for (i64 c = 0; c < 16 && p * 16 + c < M; ++c) {
        const float* src = a + (p * 16 + c) * n;
        for (i64 l = 0; l < n; ++l) {
          const __fp16 h = static_cast<__fp16>(src[l] * mul);
          std::memcpy(dst + l * 16 + c, &h, 2);
        }
      }
    }
  });
}

// The panels of w [rows, cols] (fp16, row stride ld): out[(j / 16) * D * 16 + l * 16 + j % 16] = w[l][j],
// zeros for l in [rows, D) and j in [cols, pad16(cols))
void f16_pack_panels(const uint16_t* w, i64 rows, i64 cols, i64 ld, uint16_t* out, i64 D) {
  const i64 panels = (cols + 15) / 16;
  parallel_for(panels, grain_for_work(16 * D, kMinChunkElems), [&](i64 p0, i64 p1) {
    for (i64 p = p0; p < p1; ++p) {
      uint16_t* dst = out + p * D * 16;
      const i64 j0 = p * 16, nc = std::min<i64>(16, cols - j0);
      for (i64 l = 0; l < D; ++l) {
        if (l < rows && nc == 16) {
          vst1q_u16(dst + l * 16, vld1q_u16(w + l * ld + j0));
          vst1q_u16(dst + l * 16 + 8, vld1q_u16(w + l * ld + j0 + 8));
          continue;
        }
        for (i64 c = 0; c < 16; ++c) dst[l * 16 + c] = (l < rows && c < nc) ? w[l * ld + j0 + c] : 0;
      }
    }
  });
}

// max |w| over n fp16 values (inf when any is inf or NaN)
float f16_absmax(const uint16_t* w, i64 n) {
  uint16x8_t vm = vdupq_n_u16(0);
  i64 i = 0;
  for (; i + 8 <= n; i += 8) vm = vmaxq_u16(vm, vandq_u16(vld1q_u16(w + i), vdupq_n_u16(0x7fff)));
  uint16_t m = vmaxvq_u16(vm);
  for (; i < n; ++i) m = std::max<uint16_t>(m, w[i] & 0x7fff);
  if (m >= 0x7c00) return __builtin_inff();
  __fp16 h;
  std::memcpy(&h, &m, 2);
  return static_cast<float>(h);
}

#else  // no fp16 vector arithmetic on this architecture (or POCK_SIMD_NONE): the portable path

bool f16_fmla_available() { return false; }
void f16_fmla_gemm(const uint16_t*, i64, const uint16_t*, float*, i64, bool, i64, i64, i64) {}
void f16_round_rows(const float*, i64, i64, float, uint16_t*, i64) {}
void f16_round_panels_t(const float*, i64, i64, float, uint16_t*, i64) {}
void f16_pack_panels(const uint16_t*, i64, i64, i64, uint16_t*, i64) {}
float f16_absmax(const uint16_t*, i64) { return 0.0f; }

#endif

}  // namespace detail
}  // namespace pk
