// lowp_dot.cpp — compute_dtype="bf16" products on CPUs with bf16 dot-product arithmetic: arm64's
// BFMMLA (this part) and x86's VDPBF16PS (the second part, below).
//
// arm64 CPUs that have BF16 (FEAT_BF16:
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
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "arm_features.h"
#include "gemm_detail.h"
#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
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

#else  // no BFMMLA on this architecture: the portable path (x86: the VDPBF16PS block below)

bool bf16_dot_available() { return false; }
void bf16_dot_rows(const uint16_t*, const uint16_t*, float*, i64, i64, i64, i64) {}

#endif

// ---- x86: AVX512_BF16 (Cooper Lake, Sapphire Rapids and later Xeons, AMD Zen 4 and later),
// chosen at run time from cpuid, so a baseline x86-64 build uses it where the CPU has it.
// VDPBF16PS adds, in each of 16 fp32 lanes, the products of one pair of bf16 values of each
// operand (32 multiply-adds an instruction; an fp32 FMA does 16): exact products, each added
// with fp32 round-to-nearest-even (Intel's definition: the odd element's first, then the
// even's; denormal inputs read as zero, denormal results flushed).  So the operands are in
// pairs along the depth: one operand's pair is broadcast from its row (A, rows of bf16), the
// other (B) is packed per call in panels of 32 columns, each depth pair a row of 32 dwords
// (dword c = B's column c at depth 2p, 2p + 1).  C is computed 12 x 32 at a time, each
// element in its own accumulator over the depth in order, so its arithmetic does not depend
// on the block it falls in or on the thread count.  bf16 subnormals (below 2^-126, which
// VDPBF16PS would read as zero) are looked for while packing; a product that has one takes
// the portable path, so every result is fp32 accumulation of the exact products (the tests
// judge against float64 products of the rounded operands; identities are bit-exact).
//
// POCK_EMULATE_DPBF16 (tests only: tests/native/runtime/test_kernels_lowp_dp.py) replaces the
// three instructions with their definitions in C++, so the packing, the tiling and the edges run
// on a CPU without AVX512_BF16 exactly as they would with it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

namespace {

#if defined(POCK_EMULATE_DPBF16)
#define PK_DPBF16
struct Z {
  float v[16];
};
struct Zb {
  uint32_t v[16];
};
inline float bf16_value(uint32_t h) {  // denormals read as zero, as VDPBF16PS does
  const uint32_t b = (h & 0x7f80u) ? h << 16 : (h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline float ftz(float f) { return std::fabs(f) < 1.17549435e-38f ? std::copysign(0.0f, f) : f; }
inline Z zzero() { return Z{}; }
inline Zb zload(const uint32_t* p) {
  Zb b;
  std::memcpy(b.v, p, sizeof b.v);
  return b;
}
inline Z zdp(Z acc, uint32_t a, const Zb& b) {  // Intel's VDPBF16PS, lane by lane
  for (int j = 0; j < 16; ++j) {
    acc.v[j] = ftz(acc.v[j] + bf16_value(b.v[j] >> 16) * bf16_value(a >> 16));
    acc.v[j] = ftz(acc.v[j] + bf16_value(b.v[j] & 0xffffu) * bf16_value(a & 0xffffu));
  }
  return acc;
}
inline void zstore(float* p, const Z& a, i64 n) { std::memcpy(p, a.v, sizeof(float) * static_cast<size_t>(n)); }
bool detect_dp() { return true; }
#else
#define PK_DPBF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
using Z = __m512;
using Zb = __m512i;
PK_DPBF16 inline Z zzero() { return _mm512_setzero_ps(); }
PK_DPBF16 inline Zb zload(const uint32_t* p) { return _mm512_loadu_si512(p); }
PK_DPBF16 inline Z zdp(Z acc, uint32_t a, Zb b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(a)), (__m512bh)b);
}
PK_DPBF16 inline void zstore(float* p, Z a, i64 n) {  // n in [1, 16]
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), a);
}
bool detect_dp() { return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw"); }
#endif

constexpr i64 kDpCols = 32;  // columns of a panel: two accumulators per row
constexpr int kDpRows = 12;  // rows of C per block: 24 accumulators of the 32 registers

inline bool bf16_subnormal(uint32_t h) { return (h & 0x7f80u) == 0 && (h & 0x7fu) != 0; }
inline bool pair_subnormal(uint32_t d) { return bf16_subnormal(d & 0xffffu) || bf16_subnormal(d >> 16); }

// The packers' inner loops on AVX2 (every AVX512_BF16 CPU has it), with the subnormal check.
#define PK_DP_PACK __attribute__((target("avx2")))
// true when a 16-bit lane of v is a bf16 subnormal (exponent 0, mantissa not 0)
PK_DP_PACK inline __m256i subnormal16(__m256i v) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i exp0 = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f80)), zero);
  const __m256i man0 = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x007f)), zero);
  return _mm256_andnot_si256(man0, exp0);
}
// panel[p * 32 + r] = row r's pair p (the u32 at B + r * ldb + 2p) for r < 8, p < pv (a multiple of
// 8, whole pairs): 8 x 8 dword transposes; returns whether a value is subnormal.
PK_DP_PACK bool pack_rows8(const uint16_t* B, i64 ldb, i64 pv, uint32_t* panel) {
  __m256i sub = _mm256_setzero_si256();
  for (i64 p = 0; p < pv; p += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + i * ldb + 2 * p));
      sub = _mm256_or_si256(sub, subnormal16(v));
      r[i] = _mm256_castsi256_ps(v);
    }
    simd::transpose8(r);  // bit moves only
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(reinterpret_cast<float*>(panel + (p + k) * kDpCols), r[k]);
  }
  return !_mm256_testz_si256(sub, sub);
}
// dst[c] = even[c] | odd[c] << 16 for c < 16; returns whether a value is subnormal
PK_DP_PACK bool interleave16(const uint16_t* even, const uint16_t* odd, uint32_t* dst) {
  const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even));
  const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd));
  const __m256i lo = _mm256_unpacklo_epi16(e, o), hi = _mm256_unpackhi_epi16(e, o);  // c 0-3, 8-11 | 4-7, 12-15
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  const __m256i sub = _mm256_or_si256(subnormal16(e), subnormal16(o));
  return !_mm256_testz_si256(sub, sub);
}

// C[r][0, nc) for rows [0, MR) of A (bf16 rows, row stride lda) . one panel (P depth pairs)
template <int MR>
PK_DPBF16 void dp_block(const uint16_t* A, i64 lda, const uint32_t* panel, i64 P, float* C, i64 ldc, i64 nc) {
  Z acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = zzero();
  for (i64 p = 0; p < P; ++p) {
    const Zb b0 = zload(panel + p * kDpCols), b1 = zload(panel + p * kDpCols + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      uint32_t a;
      std::memcpy(&a, A + r * lda + 2 * p, 4);
      acc[r][0] = zdp(acc[r][0], a, b0);
      acc[r][1] = zdp(acc[r][1], a, b1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    zstore(C + r * ldc, acc[r][0], std::min<i64>(nc, 16));
    if (nc > 16) zstore(C + r * ldc + 16, acc[r][1], nc - 16);
  }
}

// rows [0, rows) of A against one panel: blocks of 12 rows, the rest 8 / 4 / 2 / 1 at a time
PK_DPBF16 void dp_rows(const uint16_t* A, i64 lda, i64 rows, const uint32_t* panel, i64 P, float* C, i64 ldc, i64 nc) {
  i64 i = 0;
  for (; i + kDpRows <= rows; i += kDpRows) dp_block<kDpRows>(A + i * lda, lda, panel, P, C + i * ldc, ldc, nc);
  if (rows - i >= 8) dp_block<8>(A + i * lda, lda, panel, P, C + i * ldc, ldc, nc), i += 8;
  if (rows - i >= 4) dp_block<4>(A + i * lda, lda, panel, P, C + i * ldc, ldc, nc), i += 4;
  if (rows - i >= 2) dp_block<2>(A + i * lda, lda, panel, P, C + i * ldc, ldc, nc), i += 2;
  if (rows - i >= 1) dp_block<1>(A + i * lda, lda, panel, P, C + i * ldc, ldc, nc);
}

struct ScratchPanels {};

}  // namespace

bool bf16_dp_available() {
  static const bool has = detect_dp() || bf16_amx_available();
  return has;
}

// Depth pairs of a panel: the depth's, padded with zero pairs to a multiple of 16 for AMX's tiles
static i64 dp_pairs(i64 D) {
  const i64 P = (D + 1) / 2;
  return bf16_amx_available() ? (P + 15) / 16 * 16 : P;
}

i64 bf16_dp_panel_words(i64 R, i64 D) { return (R + kDpCols - 1) / kDpCols * kDpCols * dp_pairs(D); }

// The panels of R columns over depth D, block by block on the pool: fill(blk, panel) writes depth
// pairs [0, (D + 1) / 2) of block blk's 32 columns and returns whether it met a subnormal; the padding
// pairs up to dp_pairs(D) are zeroed here.  False when any block met one.
template <class Fill>
bool pack_panels(i64 R, i64 D, uint32_t* out, const Fill& fill) {
  const i64 P = (D + 1) / 2, PP = dp_pairs(D), blocks = (R + kDpCols - 1) / kDpCols;
  std::atomic<bool> sub{false};
  parallel_for(blocks, grain_for_work(kDpCols * D, kMinChunkElems), [&](i64 b0, i64 b1) {
    bool any = false;
    for (i64 blk = b0; blk < b1; ++blk) {
      uint32_t* panel = out + blk * PP * kDpCols;
      std::memset(panel + P * kDpCols, 0, sizeof(uint32_t) * static_cast<size_t>((PP - P) * kDpCols));
      any |= fill(blk, panel);
    }
    if (any) sub.store(true, std::memory_order_relaxed);
  });
  return !sub.load();
}

bool bf16_dp_pack_rows(const uint16_t* B, i64 R, i64 D, i64 ldb, uint32_t* out) {
  const i64 P = (D + 1) / 2;
  return pack_panels(R, D, out, [&](i64 blk, uint32_t* panel) {
    bool any = false;
    for (i64 c0 = 0; c0 < kDpCols; c0 += 8) {
      const i64 j0 = blk * kDpCols + c0;
      // 8 rows x 8 whole pairs at a time through a register transpose; the rest one by one
      const i64 pv = j0 + 8 <= R ? D / 2 / 8 * 8 : 0;
      if (pv > 0) any |= pack_rows8(B + j0 * ldb, ldb, pv, panel + c0);
      for (i64 c = c0; c < c0 + 8; ++c) {
        const i64 j = blk * kDpCols + c;
        const uint16_t* row = B + j * ldb;
        for (i64 p = j < R ? pv : 0; p < P; ++p) {
          uint32_t d = 0;
          if (j < R) {
            d = row[2 * p];
            if (2 * p + 1 < D) d |= static_cast<uint32_t>(row[2 * p + 1]) << 16;
          }
          any |= pair_subnormal(d);
          panel[p * kDpCols + c] = d;
        }
      }
    }
    return any;
  });
}

bool bf16_dp_pack_cols(const uint16_t* W, i64 D, i64 R, uint32_t* out) {
  const i64 P = (D + 1) / 2;
  return pack_panels(R, D, out, [&](i64 blk, uint32_t* panel) {
    bool any = false;
    const i64 j0 = blk * kDpCols, nc = std::min<i64>(kDpCols, R - j0);
    for (i64 p = 0; p < P; ++p) {
      const uint16_t* even = W + 2 * p * R + j0;
      const uint16_t* odd = 2 * p + 1 < D ? even + R : nullptr;
      uint32_t* dst = panel + p * kDpCols;
      i64 c = 0;
      if (odd) {
        for (; c + 16 <= nc; c += 16) any |= interleave16(even + c, odd + c, dst + c);
      }
      for (; c < nc; ++c) {
        const uint32_t d = even[c] | (odd ? static_cast<uint32_t>(odd[c]) << 16 : 0u);
        any |= pair_subnormal(d);
        dst[c] = d;
      }
      for (; c < kDpCols; ++c) dst[c] = 0;
    }
    return any;
  });
}

void bf16_dp_gemm(const uint16_t* A, i64 lda, i64 M, const uint32_t* panels, i64 R, i64 D, float* C, i64 ldc) {
  if (bf16_amx_available()) return bf16_amx_gemm(A, lda, M, panels, R, D, dp_pairs(D), C, ldc);
  const i64 P = (D + 1) / 2, blocks = (R + kDpCols - 1) / kDpCols;
  parallel_for(blocks, grain_for_work(kDpCols * M * D, kMinChunkMacs), [&](i64 b0, i64 b1) {
    for (i64 blk = b0; blk < b1; ++blk)
      dp_rows(A, lda, M, panels + blk * P * kDpCols, P, C + blk * kDpCols, ldc,
              std::min<i64>(kDpCols, R - blk * kDpCols));
  });
}

#else  // no VDPBF16PS in this build

bool bf16_dp_available() { return false; }
i64 bf16_dp_panel_words(i64, i64) { return 0; }
bool bf16_dp_pack_rows(const uint16_t*, i64, i64, i64, uint32_t*) { return false; }
bool bf16_dp_pack_cols(const uint16_t*, i64, i64, uint32_t*) { return false; }
void bf16_dp_gemm(const uint16_t*, i64, i64, const uint32_t*, i64, i64, float*, i64) {}

#endif

}  // namespace detail
}  // namespace pk
