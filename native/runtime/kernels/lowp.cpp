// lowp.cpp — linear and embedding over a frozen weight stored in low precision
// (compile(frozen_dtype=...), passes/lowp.py), dequantized inside the kernel.
//
//   bf16: the high 16 bits of an fp32 (round-to-nearest-even when stored)
//   f16:  IEEE half
//   i8:   w[n, k] = q[n, k] * scale[n]   (per output channel, |q| <= 127)
//   q4:   GGUF Q4_1-style blocks of 32 along a row: w = q * d + m, q in [0, 15], (d, m) =
//         scale[(n * K / 32 + block) * 2 + {0, 1}]; a row is K / 2 bytes, byte j of a block
//         holds q[j] (low nibble) and q[j + 16] (high nibble)
//
// The weight is never materialised in fp32: gemm.cpp packs op(B) block by block
// through a reader (gemm_view_reader) that dequantizes the rows it packs, so the
// dequantization rides on the packing pass the fp32 product makes anyway (the
// forward's w^T panels go through register transposes, simd.h). Dequantization
// is exact (every format widens to fp32 without rounding; q4 rounds q * d, then
// the + m, never one FMA), so a torch model holding the rounded weights in fp32
// is the reference. The forward applies bias and the fused activation per tile.
//
// compute_dtype (compile(compute_dtype=...), passes/compute_dtype.py): the two
// products above in bf16 or fp16 with fp32 accumulation (the *_cd kernels at the
// end).  Both operands are rounded to that format (round-to-nearest-even) and
// multiplied exactly in fp32 (8 x 8 or 11 x 11 significant bits fit in fp32's
// 24), so the fp32 GEMM over rounded operands is the portable kernel and the
// exact reference of any bf16/fp16 dot-product instruction that accumulates in
// fp32.  fp16's exponent range is narrow: the activation operand (x, or the
// gradient dy) is scaled by a power of two per call so its largest magnitude
// lands in [2^13, 2^14) before rounding, and the result scaled back (both
// exact in fp32): small gradients do not flush to zero and large activations do
// not overflow, with no loss scale to carry between steps.  On arm64 CPUs with
// BF16 the bf16 products run on BFMMLA instead (lowp_dot.cpp, chosen at run time), and on
// those with fp16 vector arithmetic (Armv8.2 FP16: every phone core since 2018) the fp16
// products run on FMLA (lowp_fmla.cpp, at compile time or from the hwcaps): fp16 sums over
// 16 depth steps added in fp32, the activation scaled so max |a| max |w| < 2^11 (fmla_scale).
// On x86 CPUs with AVX512_BF16 (cpuid) the bf16 products run on VDPBF16PS (lowp_dot.cpp: exact
// products summed in fp32, two per lane and instruction; a bf16 subnormal operand, which it reads
// as zero, keeps the call on the portable path).
// On x86 CPUs with AVX2 and F16C (cpuid, so baseline builds too) bf16/fp16 weights are
// widened into the packed panels 8 at a time and the operand rounding runs 8 lanes at a time
// (the PK_LOWP_X86 block): the same values, so the same bits.
#include <cmath>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"
#include "gemm_detail.h"
#include "half.h"
#if defined(__x86_64__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pk {

namespace {

using namespace simd;

// Keeps x a rounded value of its own (no FMA may absorb the operation that made it).
inline void opaque(V& x) {
#if defined(__AVX512F__) || defined(__AVX2__)
  asm("" : "+x"(x.v));
#elif PK_NEON
  asm("" : "+w"(x.v));
#else
  asm volatile("" : : "r"(&x) : "memory");
#endif
}

// q4 block b (32 values from 16 bytes) positions [p0, p1) -> out[0, p1 - p0)
#if defined(__GNUC__)
#define PK_LOWP_INLINE inline __attribute__((always_inline))
#else
#define PK_LOWP_INLINE inline
#endif

PK_LOWP_INLINE void q4_block(const uint8_t* bytes, float d, float m, int p0, int p1, float* out) {
#if defined(__AVX512F__)
  // 16 values at a time straight from the nibbles: the low (p0 = 0) and/or high
  // half of the block, every panel's case (32 / 256 columns)
  if (((p0 | p1) & 15) == 0) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)), nib = _mm_set1_epi8(15);
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    for (int g = p0 >> 4; g < p1 >> 4; ++g) {
      const __m128i b16 = _mm_and_si128(g ? _mm_srli_epi16(raw, 4) : raw, nib);
      __m512 prod = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b16)), dv);
      asm("" : "+v"(prod));  // two roundings, as quant.dequantize
      _mm512_storeu_ps(out + (g << 4) - p0, _mm512_add_ps(prod, mv));
    }
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  // 8 values at a time straight from the nibbles (the scalar unpack below is
  // what made x86-64-v3's q4 products ~20% slower than int8's): groups of 8
  // aligned to the block, which is every panel's case (16 / 32 / 256 columns)
  if (((p0 | p1) & 7) == 0) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)), nib = _mm_set1_epi8(15);
    const __m128i half[2] = {_mm_and_si128(raw, nib), _mm_and_si128(_mm_srli_epi16(raw, 4), nib)};
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int g = p0 >> 3; g < p1 >> 3; ++g) {
      const __m128i b8 = (g & 1) ? _mm_srli_si128(half[g >> 1], 8) : half[g >> 1];
      __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8)), dv);
      asm("" : "+x"(prod));  // two roundings, as quant.dequantize
      _mm256_storeu_ps(out + (g << 3) - p0, _mm256_add_ps(prod, mv));
    }
    return;
  }
#endif
  alignas(64) float q[32];
  if (p0 == 0 && p1 == 32) {
    for (int j = 0; j < 16; ++j) q[j] = static_cast<float>(bytes[j] & 15);
    for (int j = 0; j < 16; ++j) q[j + 16] = static_cast<float>(bytes[j] >> 4);
  } else if (p0 == 0 && p1 == 16) {  // AVX2 panels: half blocks
    for (int j = 0; j < 16; ++j) q[j] = static_cast<float>(bytes[j] & 15);
  } else if (p0 == 16 && p1 == 32) {
    for (int j = 0; j < 16; ++j) q[j + 16] = static_cast<float>(bytes[j] >> 4);
  } else {
    for (int j = p0; j < (p1 < 16 ? p1 : 16); ++j) q[j] = static_cast<float>(bytes[j] & 15);
    for (int j = p0 > 16 ? p0 : 16; j < p1; ++j) q[j] = static_cast<float>(bytes[j - 16] >> 4);
  }
  // vectors over [p0, p1) (a panel edge may cut the block: AVX2's 16 and NEON's 12 columns)
  const V dv = vbcast(d), mv = vbcast(m);
  int j = p0;
  for (; j + kW <= p1; j += kW) {
    V prod = vmul(vload(q + j), dv);
    opaque(prod);  // two roundings, as quant.dequantize
    vstore(out + j - p0, vadd(prod, mv));
  }
  for (; j < p1; ++j) {
    volatile float prod = q[j] * d;
    out[j - p0] = prod + m;
  }
}

// out[0:n] = dequant(w)[row, c0 : c0 + n]  (w is [rows, K])
PK_LOWP_INLINE void dequant_span(const void* w, LowpDtype dt, const float* scale, i64 K, i64 row, i64 c0, i64 n, float* out) {
  if (dt == LowpDtype::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(w) + row * K + c0;
    for (i64 i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else if (dt == LowpDtype::F16) {
    const uint16_t* src = static_cast<const uint16_t*>(w) + row * K + c0;
    i64 i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) out[i] = f16_to_f32(src[i]);
  } else if (dt == LowpDtype::I8) {
    const int8_t* src = static_cast<const int8_t*>(w) + row * K + c0;
    const float s = scale[row];
    for (i64 i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]) * s;
  } else {  // Q4
    const uint8_t* src = static_cast<const uint8_t*>(w) + row * (K / 2);
    const float* dm = scale + row * (K / 32) * 2;
    for (i64 i = 0; i < n;) {
      const i64 c = c0 + i, b = c / 32;
      const int p0 = static_cast<int>(c % 32);
      const int p1 = static_cast<int>(n - i < 32 - p0 ? p0 + (n - i) : 32);
      q4_block(src + b * 16, dm[2 * b], dm[2 * b + 1], p0, p1, out + i);
      i += p1 - p0;
    }
  }
}

// ---- x86: bf16 / fp16 weights widened 8 at a time with AVX2 (bf16: zero-extend and shift
// left 16, vpslld) or F16C (vcvtph2ps) straight into the GEMM's packed panel (the forward's
// w^T through an 8 x 8 register transpose, no stack tile), so a bf16/fp16 product reads half
// the weight bytes of fp32 for the same FMAs.  Compiled with target attributes and chosen at
// run time from cpuid: a baseline x86-64 build uses them where the CPU has AVX2 and F16C, and
// the portable readers below otherwise.  Widening is exact: the same panel, bit for bit.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PK_LOWP_X86 1
#define PK_X86_WIDE __attribute__((target("avx2,f16c")))
bool x86_wide() {
#if defined(__AVX2__) && defined(__F16C__)
  return true;
#else
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
#endif
}

// 8 values from p, widened to fp32.
PK_X86_WIDE inline __m256 widen8(const uint16_t* p, bool f16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return f16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
PK_X86_WIDE inline float widen1(uint16_t h, bool f16) {
  return f16 ? _cvtsh_ss(h) : bf16_to_f32(h);
}

// out[k*ld + j] = w[c0 + j, r0 + k] (w [N, K] bf16 or fp16): 8 rows of w x 8 k per transpose.
PK_X86_WIDE void read_wt16_x86(const uint16_t* w, bool f16, i64 K, i64 r0, i64 rows, i64 c0, i64 cols, float* out,
                               i64 ld) {
  const i64 jt = cols / 8 * 8, kt = rows / 8 * 8;
  for (i64 j = 0; j < jt; j += 8) {
    const uint16_t* src = w + (c0 + j) * K + r0;
    for (i64 k = 0; k < kt; k += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) r[t] = widen8(src + t * K + k, f16);
      transpose8(r);  // simd.h
      float* d = out + k * ld + j;
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) _mm256_storeu_ps(d + t * ld, r[t]);
    }
    for (i64 k = kt; k < rows; ++k)
      for (i64 t = 0; t < 8; ++t) out[k * ld + j + t] = widen1(src[t * K + k], f16);
  }
  for (i64 j = jt; j < cols; ++j)
    for (i64 k = 0; k < rows; ++k) out[k * ld + j] = widen1(w[(c0 + j) * K + r0 + k], f16);
}

// out[k*ld + j] = w[r0 + k, c0 + j] (w [N, K] bf16 or fp16, read as [N, K] rows).
PK_X86_WIDE void read_w16_x86(const uint16_t* w, bool f16, i64 K, i64 r0, i64 rows, i64 c0, i64 cols, float* out,
                              i64 ld) {
  for (i64 k = 0; k < rows; ++k) {
    const uint16_t* src = w + (r0 + k) * K + c0;
    float* d = out + k * ld;
    i64 j = 0;
    for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(d + j, widen8(src + j, f16));
    for (; j < cols; ++j) d[j] = widen1(src[j], f16);
  }
}
#else
#define PK_LOWP_X86 0
#endif

struct LowpW {
  const void* w;
  LowpDtype dt;
  const float* scale;
  i64 K;  // row length of w [N, K]
};

// gemm reader for op(B) = dequant(w)^T ([K, N]): out[k*ld + j] = w[c0 + j, r0 + k].
// Up to kT rows of w at a time are dequantized into a stack tile, then
// transposed into place.
void read_wt(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpW& q = *static_cast<const LowpW*>(ctx);
#if PK_LOWP_X86
  if ((q.dt == LowpDtype::BF16 || q.dt == LowpDtype::F16) && x86_wide())
    return read_wt16_x86(static_cast<const uint16_t*>(q.w), q.dt == LowpDtype::F16, q.K, r0, rows, c0, cols, out, ld);
#endif
  constexpr i64 kSpan = 256;
  alignas(64) float tile[kT * kSpan];
  for (i64 j = 0; j < cols; j += kT) {
    const i64 nj = cols - j < kT ? cols - j : kT;
    for (i64 k = 0; k < rows; k += kSpan) {
      const i64 nk = rows - k < kSpan ? rows - k : kSpan;
      for (i64 t = 0; t < nj; ++t) dequant_span(q.w, q.dt, q.scale, q.K, c0 + j + t, r0 + k, nk, tile + t * kSpan);
      transpose_copy(tile, kSpan, nk, nj, out + k * ld + j, ld);
    }
  }
}

// gemm reader for op(B) = dequant(w) ([N, K] read as [K_gemm = N, N_gemm = K]).
void read_w(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpW& q = *static_cast<const LowpW*>(ctx);
#if PK_LOWP_X86
  if ((q.dt == LowpDtype::BF16 || q.dt == LowpDtype::F16) && x86_wide())
    return read_w16_x86(static_cast<const uint16_t*>(q.w), q.dt == LowpDtype::F16, q.K, r0, rows, c0, cols, out, ld);
#endif
  switch (q.dt) {  // one loop per format, the format's code inlined into it
    case LowpDtype::BF16:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::BF16, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    case LowpDtype::F16:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::F16, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    case LowpDtype::I8:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::I8, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    default:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::Q4, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
  }
}

}  // namespace

// dequant_span for the other kernels (gemm_detail.h: gemv.cpp), out of line
void detail::dequant_span(const void* w, LowpDtype dt, const float* scale, i64 K, i64 row, i64 c0, i64 n,
                          float* out) {
  pk::dequant_span(w, dt, scale, K, row, c0, n, out);
}

// y[M,N] = act(x[M,K] @ dequant(w)[N,K]^T + b[N])
void linear_fwd_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                     i64 M, i64 N, i64 K, Act act) {
  const LowpW q{w, dt, scale, K};
  detail::gemm_view_reader(x, K, 1, read_wt, &q, y, N, M, N, K, 0.0f, b, act);
}

// dx[M,K] = dy[M,N] @ dequant(w)[N,K]
void linear_bwd_input_lowp(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                           i64 N, i64 K) {
  const LowpW q{w, dt, scale, K};
  detail::gemm_view_reader(dy, N, 1, read_w, &q, dx, K, M, K, N, 0.0f, nullptr, Act::None);
}

// y[i, :] = dequant(w)[idx[i], :]  (indices validated by the C API)
// As embedding_fwd: a row whose index is outside [0, V) becomes zeros (never read
// with); returns the first such i, -1 when none.
i64 embedding_fwd_lowp(const void* w, LowpDtype dt, const float* scale, const int64_t* idx, float* y, i64 n,
                       i64 V, i64 D) {
  auto run = [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) {
      if (idx[i] < 0 || idx[i] >= V)
        std::memset(y + i * D, 0, sizeof(float) * static_cast<size_t>(D));
      else
        dequant_span(w, dt, scale, D, idx[i], 0, D, y + i * D);
    }
  };
  if (n * D >= (i64(1) << 15))
    parallel_for(n, 8, run);
  else
    run(0, n);
  for (i64 i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= V) return i;
  return -1;
}

// ---------------------------------------------------------------- compute_dtype

namespace {

// x rounded to bfloat16 (round-to-nearest-even; NaN stays NaN, quiet), as an fp32.
inline float round_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) {
    b |= 0x00400000u;
  } else {
    b += 0x7fffu + ((b >> 16) & 1u);
  }
  b &= 0xffff0000u;
  std::memcpy(&x, &b, 4);
  return x;
}

// x rounded to IEEE half (round-to-nearest-even, subnormals, overflow to inf), as an fp32.
inline float round_f16(float x) {
#if defined(__aarch64__)
  return static_cast<float>(static_cast<__fp16>(x));  // fcvt: the hardware's rounding
#else
  const float a = std::fabs(x);
  if (!(a < 65520.0f)) return a != a ? x : std::copysign(INFINITY, x);  // NaN, or rounds past 65504
  if (a < 6.103515625e-05f) return std::nearbyint(x * 16777216.0f) * 5.9604644775390625e-08f;  // 2^-24 steps
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0xfffu + ((b >> 13) & 1u);
  b &= ~0x1fffu;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}

#if PK_LOWP_X86
// round_span's loops on AVX2 / F16C (run-time dispatch as the readers): the same roundings
// (round_bf16's integer steps lane by lane; F16C's conversion is IEEE round-to-nearest-even
// with subnormals and overflow to inf, which round_f16 reproduces).
PK_X86_WIDE i64 round_span_x86(const float* in, float* out, i64 n, bool f16, float mul) {
  const __m256 m = _mm256_set1_ps(mul);
  i64 i = 0;
  if (f16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(in + i), m), _MM_FROUND_TO_NEAREST_INT);
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
  }
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                quiet = _mm256_set1_epi32(0x00400000), half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(in + i), m));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
    const __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(b, 16), one)));
    const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(b, quiet), nan);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
  }
  return i;
}
#endif

// out[0:n] = round_cd(in[0:n] * mul)  (mul a power of two: exact)
void round_span(const float* in, float* out, i64 n, LowpDtype cd, float mul) {
  i64 i = 0;
#if PK_LOWP_X86
  if (x86_wide()) i = round_span_x86(in, out, n, cd == LowpDtype::F16, mul);
#endif
  if (cd == LowpDtype::BF16) {
    for (; i < n; ++i) out[i] = round_bf16(in[i] * mul);
    return;
  }
  for (; i < n; ++i) out[i] = round_f16(in[i] * mul);
}

// The power of two the activation operand is multiplied by before its rounding
// (1 for bf16, whose range is fp32's; for fp16, max |a| lands in [2^13, 2^14)).
float cd_scale(const float* a, i64 n, LowpDtype cd) {
  if (cd != LowpDtype::F16) return 1.0f;
  // max |a| skipping NaN (as fmax does): vmax(x, m) keeps m where x is NaN
  V vm = vzero();
  i64 i = 0;
  for (; i + kW <= n; i += kW) vm = vmax(vabs(vload(a + i)), vm);
  alignas(64) float lanes[kW];
  vstore(lanes, vm);
  float amax = 0.0f;
  for (int l = 0; l < kW; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
  for (; i < n; ++i) amax = std::fabs(a[i]) > amax ? std::fabs(a[i]) : amax;
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;  // zeros, or NaN/inf (the guard reports it)
  int e;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e)
  return std::ldexp(1.0f, 14 - e);
}

struct ScratchCd {};  // thread_scratch tag: the rounded activation operand

// The rounded activation operand (m x k, row-major) in this thread's scratch.
const float* rounded_operand(const float* a, i64 m, i64 k, LowpDtype cd, float mul) {
  float* out = detail::thread_scratch<ScratchCd>(m * k);
  parallel_for(m, grain_for_work(k, kMinChunkElems),
               [&](i64 b, i64 e) { round_span(a + b * k, out + b * k, (e - b) * k, cd, mul); });
  return out;
}

struct LowpCd {
  LowpW q;
  LowpDtype cd;
};

// read_wt / read_w, the dequantized weight then rounded to the compute format
// (exact when the weight is stored in that format).
void read_wt_cd(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpCd& c = *static_cast<const LowpCd*>(ctx);
  read_wt(&c.q, r0, rows, c0, cols, out, ld);
  if (c.q.dt != c.cd)
    for (i64 k = 0; k < rows; ++k) round_span(out + k * ld, out + k * ld, cols, c.cd, 1.0f);
}
void read_w_cd(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpCd& c = *static_cast<const LowpCd*>(ctx);
  read_w(&c.q, r0, rows, c0, cols, out, ld);
  if (c.q.dt != c.cd)
    for (i64 k = 0; k < rows; ++k) round_span(out + k * ld, out + k * ld, cols, c.cd, 1.0f);
}

// y[i, :] = act(y[i, :] * mul + b)  (b nullable)
void scale_bias_act(float* y, i64 M, i64 N, float mul, const float* b, Act act) {
  parallel_for(M, grain_for_work(N, kMinChunkElems), [&](i64 r0, i64 r1) {
    const V vm = vbcast(mul);
    for (i64 i = r0; i < r1; ++i) {
      float* row = y + i * N;
      i64 j0 = 0;
      if (b == nullptr && act == Act::None) {  // the fp16 product's scale-back: vectors
        for (; j0 + kW <= N; j0 += kW) vstore(row + j0, vmul(vload(row + j0), vm));
      }
      for (i64 j = j0; j < N; ++j) {
        float v = row[j] * mul + (b ? b[j] : 0.0f);
        if (act == Act::Relu) v = v < 0.0f ? 0.0f : v;
        else if (act == Act::Relu6) v = v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
        row[j] = v;
      }
    }
  });
}

// ---- BFMMLA (lowp_dot.cpp, arm64 CPUs with BF16): bf16 rows padded to multiples of 8
struct ScratchRowsA {};
struct ScratchRowsB {};
struct ScratchRow {};
i64 pad8(i64 n) { return (n + 7) / 8 * 8; }
uint16_t* scratch_u16(float* f) { return reinterpret_cast<uint16_t*>(f); }
inline uint16_t bf16_bits(float v) {  // round_bf16's upper half
  const float r = round_bf16(v);
  uint32_t b;
  std::memcpy(&b, &r, 4);
  return static_cast<uint16_t>(b >> 16);
}
// out[i][0:L) = bf16(a[i][0:n)), zeros to L; false when a value rounds to a bf16 subnormal
bool pack_rows_bf16(const float* a, i64 rows, i64 n, i64 L, uint16_t* out) {
  uint32_t sub = 0;
  for (i64 i = 0; i < rows; ++i) {
    for (i64 l = 0; l < n; ++l) {
      const uint16_t h = bf16_bits(a[i * n + l]);
      sub |= (h & 0x7f80u) == 0 && (h & 0x7fu) != 0;
      out[i * L + l] = h;
    }
    for (i64 l = n; l < L; ++l) out[i * L + l] = 0;
  }
  return sub == 0;
}
#if PK_NEON
// out[k*L + n] = w[n*K + k] (16-bit values) for n < N, k < K: 8 x 8 blocks transposed in
// registers (TRN1/TRN2 on 16-, 32- and 64-bit elements), the edges one by one.
void transpose_u16(const uint16_t* w, i64 N, i64 K, uint16_t* out, i64 L) {
  const i64 nt = N / 8 * 8, kt = K / 8 * 8;
  for (i64 n = 0; n < nt; n += 8) {
    for (i64 k = 0; k < kt; k += 8) {
      uint16x8_t r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = vld1q_u16(w + (n + i) * K + k);
      uint32x4_t t[8];
#pragma GCC unroll 8
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = vreinterpretq_u32_u16(vtrn1q_u16(r[2 * i], r[2 * i + 1]));
        t[2 * i + 1] = vreinterpretq_u32_u16(vtrn2q_u16(r[2 * i], r[2 * i + 1]));
      }
      // u[c] holds columns c and c + 4 of rows 0-3 (u[4 + c]: rows 4-7)
      uint64x2_t u[8];
#pragma GCC unroll 8
      for (int h = 0; h < 2; ++h) {
        u[4 * h + 0] = vreinterpretq_u64_u32(vtrn1q_u32(t[4 * h], t[4 * h + 2]));
        u[4 * h + 2] = vreinterpretq_u64_u32(vtrn2q_u32(t[4 * h], t[4 * h + 2]));
        u[4 * h + 1] = vreinterpretq_u64_u32(vtrn1q_u32(t[4 * h + 1], t[4 * h + 3]));
        u[4 * h + 3] = vreinterpretq_u64_u32(vtrn2q_u32(t[4 * h + 1], t[4 * h + 3]));
      }
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        vst1q_u16(out + (k + c) * L + n, vreinterpretq_u16_u64(vtrn1q_u64(u[c], u[4 + c])));
        vst1q_u16(out + (k + c + 4) * L + n, vreinterpretq_u16_u64(vtrn2q_u64(u[c], u[4 + c])));
      }
    }
    for (i64 k = kt; k < K; ++k)
      for (i64 i = n; i < n + 8; ++i) out[k * L + i] = w[i * K + k];
  }
  for (i64 n = nt; n < N; ++n)
    for (i64 k = 0; k < K; ++k) out[k * L + n] = w[n * K + k];
}
#endif

// the dequantized weight's rows (transposed: its columns), in bf16, padded to L
const uint16_t* pack_weight_bf16(const LowpW& q, i64 N, bool transposed, i64 L) {
  const i64 K = q.K, rows = transposed ? K : N;
  if (!transposed && q.dt == LowpDtype::BF16 && L == K) return static_cast<const uint16_t*>(q.w);  // as stored
  uint16_t* out = scratch_u16(detail::thread_scratch<ScratchRowsB>((rows * L + 1) / 2));
  std::memset(out, 0, sizeof(uint16_t) * static_cast<size_t>(rows * L));
#if PK_NEON
  if (transposed && q.dt == LowpDtype::BF16) {  // the bits as stored, transposed
    transpose_u16(static_cast<const uint16_t*>(q.w), N, K, out, L);
    return out;
  }
#endif
  float* row = detail::thread_scratch<ScratchRow>(K);
  for (i64 n = 0; n < N; ++n) {
    dequant_span(q.w, q.dt, q.scale, K, n, 0, K, row);
    for (i64 k = 0; k < K; ++k) out[transposed ? k * L + n : n * L + k] = bf16_bits(row[k]);
  }
  return out;
}

// ---- VDPBF16PS / AMX (lowp_dot.cpp, x86 CPUs with AVX512_BF16 or AMX-BF16)
struct ScratchDpPanels {};
// c = bf16(a) [M, D] @ bf16(dequant(w))^T (x @ w^T: D = K, N columns) or, transposed, @ bf16(dequant(w))
// (dy @ w: D = N, K columns), the weight packed per call (its rows, or pairs of its rows for its
// columns).  False, c untouched, when an operand is a bf16 subnormal: the caller's portable path.
bool dp_product(const float* a, i64 M, const LowpW& q, i64 N, bool transposed, float* c) {
  const i64 D = transposed ? N : q.K, R = transposed ? q.K : N, L = pad8(D);
  uint16_t* ab = scratch_u16(detail::thread_scratch<ScratchRowsA>((M * L + 1) / 2));
  if (!pack_rows_bf16(a, M, D, L, ab)) return false;
  const uint16_t* wb = pack_weight_bf16(q, N, false, q.K);  // [N, K] rows, as stored when bf16
  uint32_t* panels =
      reinterpret_cast<uint32_t*>(detail::thread_scratch<ScratchDpPanels>(detail::bf16_dp_panel_words(R, D)));
  const bool ok = transposed ? detail::bf16_dp_pack_cols(wb, N, q.K, panels)
                             : detail::bf16_dp_pack_rows(wb, N, q.K, q.K, panels);
  if (ok) detail::bf16_dp_gemm(ab, L, M, panels, R, D, c, R);
  return ok;
}

#if defined(__aarch64__)
// ---- fp16 FMLA (lowp_fmla.cpp, arm64 CPUs with fp16 vector arithmetic)
struct ScratchF16A {};
struct ScratchF16B {};
struct ScratchF16C {};
i64 pad16(i64 n) { return (n + 15) / 16 * 16; }
inline uint16_t f16_bits(float v) {  // fcvt: round-to-nearest-even, as round_f16
  const __fp16 h = static_cast<__fp16>(v);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
// The dequantized weight [N, K] in fp16 with row stride ld >= K, zero padded to `rows` >= N
// rows; as stored when it is fp16 already, ld == K and rows == N.
const uint16_t* weight_f16(const LowpW& q, i64 N, i64 ld, i64 rows) {
  if (q.dt == LowpDtype::F16 && ld == q.K && rows == N) return static_cast<const uint16_t*>(q.w);
  uint16_t* out = scratch_u16(detail::thread_scratch<ScratchF16B>((rows * ld + 1) / 2));
  std::memset(out + N * ld, 0, sizeof(uint16_t) * static_cast<size_t>((rows - N) * ld));
  parallel_for(N, grain_for_work(ld, kMinChunkElems), [&](i64 n0, i64 n1) {
    float* row = detail::thread_scratch<ScratchRow>(q.K);
    for (i64 n = n0; n < n1; ++n) {
      uint16_t* dst = out + n * ld;
      if (q.dt == LowpDtype::F16) {
        std::memcpy(dst, static_cast<const uint16_t*>(q.w) + n * q.K, sizeof(uint16_t) * static_cast<size_t>(q.K));
      } else {
        dequant_span(q.w, q.dt, q.scale, q.K, n, 0, q.K, row);
        for (i64 k = 0; k < q.K; ++k) dst[k] = f16_bits(row[k]);
      }
      for (i64 k = q.K; k < ld; ++k) dst[k] = 0;
    }
  });
  return out;
}
// The activation operand's power of two for FMLA's fp16 sums: cd_scale's (max |a| in
// [2^13, 2^14)), lowered where the weight needs it so that max |a| max |w| < 2^11: a chunk of
// 16 fp16 products then sums to under 2^15 < 65504 (lowp_fmla.cpp).  With max |w| in
// [2^(ew-1), 2^ew): min(mul, mul * 2^(-3-ew)).
float fmla_scale(const float* a, i64 n, float wmax) {
  const float mul = cd_scale(a, n, LowpDtype::F16);
  if (!(wmax > 0.0f) || !std::isfinite(wmax)) return mul;
  int ew;
  std::frexp(wmax, &ew);
  return ew > -3 ? std::ldexp(mul, -3 - ew) : mul;
}
#endif

}  // namespace

// y[M,N] = act(round(x)[M,K] @ round(dequant(w))[N,K]^T + b[N])  in cd (BF16 or F16)
void linear_fwd_lowp_cd(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                        i64 M, i64 N, i64 K, Act act, LowpDtype cd) {
  if (cd == LowpDtype::BF16 && detail::bf16_dot_available()) {  // BFMMLA: rows of x . rows of w
    const i64 L = pad8(K);
    uint16_t* xb = scratch_u16(detail::thread_scratch<ScratchRowsA>((M * L + 1) / 2));
    pack_rows_bf16(x, M, K, L, xb);
    detail::bf16_dot_rows(xb, pack_weight_bf16(LowpW{w, dt, scale, K}, N, false, L), y, M, N, L, N);
    if (b != nullptr || act != Act::None) scale_bias_act(y, M, N, 1.0f, b, act);
    return;
  }
  if (cd == LowpDtype::BF16 && detail::bf16_dp_available() && dp_product(x, M, LowpW{w, dt, scale, K}, N, false, y)) {
    if (b != nullptr || act != Act::None) scale_bias_act(y, M, N, 1.0f, b, act);
    return;
  }
#if defined(__aarch64__)
  if (cd == LowpDtype::F16 && detail::f16_fmla_available()) {  // FMLA: y^T = w @ x^T, stored transposed
    const i64 D = pad8(K);
    const uint16_t* wh = weight_f16(LowpW{w, dt, scale, K}, N, D, N);
    const float mul = fmla_scale(x, M * K, detail::f16_absmax(wh, N * D));
    uint16_t* xt = scratch_u16(detail::thread_scratch<ScratchF16A>((D * pad16(M) + 1) / 2));
    detail::f16_round_panels_t(x, M, K, mul, xt, D);
    detail::f16_fmla_gemm(wh, D, xt, y, N, true, N, M, D);
    if (mul != 1.0f || b != nullptr || act != Act::None) scale_bias_act(y, M, N, 1.0f / mul, b, act);
    return;
  }
#endif
  const float mul = cd_scale(x, M * K, cd);
  const float* xr = rounded_operand(x, M, K, cd, mul);
  const LowpCd c{{w, dt, scale, K}, cd};
  if (mul == 1.0f) {
    detail::gemm_view_reader(xr, K, 1, read_wt_cd, &c, y, N, M, N, K, 0.0f, b, act);
  } else {  // unscaled before the bias and the activation
    detail::gemm_view_reader(xr, K, 1, read_wt_cd, &c, y, N, M, N, K, 0.0f, nullptr, Act::None);
    scale_bias_act(y, M, N, 1.0f / mul, b, act);
  }
}

// dx[M,K] = round(dy)[M,N] @ round(dequant(w))[N,K]  in cd (BF16 or F16)
void linear_bwd_input_lowp_cd(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                              i64 N, i64 K, LowpDtype cd) {
  if (cd == LowpDtype::BF16 && detail::bf16_dot_available()) {  // BFMMLA: rows of dy . columns of w
    const i64 L = pad8(N);
    uint16_t* dyb = scratch_u16(detail::thread_scratch<ScratchRowsA>((M * L + 1) / 2));
    pack_rows_bf16(dy, M, N, L, dyb);
    detail::bf16_dot_rows(dyb, pack_weight_bf16(LowpW{w, dt, scale, K}, N, true, L), dx, M, K, L, K);
    return;
  }
  if (cd == LowpDtype::BF16 && detail::bf16_dp_available() && dp_product(dy, M, LowpW{w, dt, scale, K}, N, true, dx))
    return;
#if defined(__aarch64__)
  if (cd == LowpDtype::F16 && detail::f16_fmla_available()) {  // FMLA: rows of dy, rows of w
    const i64 D = pad8(N);
    const uint16_t* wh = weight_f16(LowpW{w, dt, scale, K}, N, K, N);  // w as stored when fp16
    uint16_t* wp = scratch_u16(detail::thread_scratch<ScratchF16C>((D * pad16(K) + 1) / 2));
    detail::f16_pack_panels(wh, N, K, K, wp, D);
    const float mul = fmla_scale(dy, M * N, detail::f16_absmax(wh, N * K));
    uint16_t* dyh = scratch_u16(detail::thread_scratch<ScratchF16A>((M * D + 1) / 2));
    detail::f16_round_rows(dy, M, N, mul, dyh, D);
    detail::f16_fmla_gemm(dyh, D, wp, dx, K, false, M, K, D);
    if (mul != 1.0f) scale_bias_act(dx, M, K, 1.0f / mul, nullptr, Act::None);
    return;
  }
#endif
  const float mul = cd_scale(dy, M * N, cd);
  const float* dyr = rounded_operand(dy, M, N, cd, mul);
  const LowpCd c{{w, dt, scale, K}, cd};
  detail::gemm_view_reader(dyr, N, 1, read_w_cd, &c, dx, K, M, K, N, 0.0f, nullptr, Act::None);
  if (mul != 1.0f) scale_bias_act(dx, M, K, 1.0f / mul, nullptr, Act::None);
}

}  // namespace pk
