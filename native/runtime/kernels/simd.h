// simd.h — internal to the kernels (not part of the public runtime API): the
// native-width float vector V the GEMM and convolution kernels are written over,
// chosen at compile time: AVX-512 (__AVX512F__), AVX2+FMA (__AVX2__ && __FMA__),
// NEON (__aarch64__), or GNU vector extensions (any GCC/Clang target: SIMD
// registers where it has them, scalar code elsewhere).  V holds kW floats.
//
// vmax(a, b) / vmin(a, b) follow x86's maxps/minps on every target: b when either
// is NaN, so vmax(vzero(), x) propagates a NaN x (as torch.relu does).
//
// Also: vsub, vdiv, vabs, vxorsign (a with its sign flipped where b is negative),
// ordered comparisons vlt / vgt giving a mask M (false when either is NaN),
// vsel(m, a, b) = m ? a : b lane-wise, and vscale2(a, n) = a * 2^n for an
// integral-valued n in [-254, 254] (two exact power-of-two factors, so a
// subnormal result comes out right).  vec_math.h builds exp / tanh / erf on them.
// load_part / store_part move n <= kW floats (a row's tail) in and out of a V.
// transpose_copy(src, lds, rows, cols, dst, ldd): dst[r*ldd + c] = src[c*lds + r], through
// kT x kT tiles transposed in registers (AVX 8x8, NEON 4x4; plain copies elsewhere); on x86-64
// transpose8(r) is the 8 x 8 register transpose itself (AVX2 by target attribute).
#pragma once

#include <cstdint>
#include <cstring>

// PK_NEON: the NEON paths (every aarch64 build but the scalar comparison build below).
// POCK_SIMD_NONE (aarch64 only; with -fno-tree-vectorize -fno-tree-slp-vectorize): V is
// 4 floats operated on one at a time, and every kernel's NEON branch falls back to its
// portable one: the "vectorization disabled" build bench/arm64/insns.py counts against.
#if defined(POCK_SIMD_NONE) && (defined(__AVX2__) || defined(__AVX512F__))
#error "POCK_SIMD_NONE is for aarch64 builds (the instruction-count comparison); x86 builds pick their ISA by -march"
#endif
#if defined(__aarch64__) && !defined(POCK_SIMD_NONE)
#define PK_NEON 1
#else
#define PK_NEON 0
#endif

#if defined(__AVX512F__) || defined(__AVX2__) || (defined(__x86_64__) && defined(__GNUC__))
#include <immintrin.h>
#elif PK_NEON
#include <arm_neon.h>
#endif

namespace pk {
namespace simd {

#if defined(__AVX512F__)
struct V {
  __m512 v;
};
constexpr int kW = 16;
inline V vzero() { return {_mm512_setzero_ps()}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vbcast(float x) { return {_mm512_set1_ps(x)}; }
inline void vstore(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a*b + c
inline V vadd(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V vmul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V vmax(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline float vsum(V a) { return _mm512_reduce_add_ps(a.v); }
typedef __mmask16 M;
inline V vsub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V vdiv(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V vsqrt(V a) { return {_mm512_sqrt_ps(a.v)}; }
inline V vabs(V a) { return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7fffffff)))}; }
inline V vxorsign(V a, V b) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(b.v), _mm512_set1_epi32(int(0x80000000u)));
  return {_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a.v), sign))};
}
inline M vlt(V a, V b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ); }
inline M vgt(V a, V b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
inline V vsel(M m, V a, V b) { return {_mm512_mask_blend_ps(m, b.v, a.v)}; }
inline V vscale2(V a, V n) {
  const __m512i ni = _mm512_cvtps_epi32(n.v);
  const __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
  const __m512i b127 = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, b127), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, b127), 23));
  return {_mm512_mul_ps(_mm512_mul_ps(a.v, s1), s2)};
}
#elif defined(__AVX2__) && defined(__FMA__)
struct V {
  __m256 v;
};
constexpr int kW = 8;
inline V vzero() { return {_mm256_setzero_ps()}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V vbcast(float x) { return {_mm256_set1_ps(x)}; }
inline void vstore(float* p, V a) { _mm256_storeu_ps(p, a.v); }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V vmul(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V vmax(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
inline float vsum(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
typedef __m256 M;
inline V vsub(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V vdiv(V a, V b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V vsqrt(V a) { return {_mm256_sqrt_ps(a.v)}; }
inline V vabs(V a) { return {_mm256_and_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))}; }
inline V vxorsign(V a, V b) {
  return {_mm256_xor_ps(a.v, _mm256_and_ps(b.v, _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)))))};
}
inline M vlt(V a, V b) { return _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ); }
inline M vgt(V a, V b) { return _mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ); }
inline V vsel(M m, V a, V b) { return {_mm256_blendv_ps(b.v, a.v, m)}; }
inline V vscale2(V a, V n) {
  const __m256i ni = _mm256_cvtps_epi32(n.v);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i b127 = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, b127), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, b127), 23));
  return {_mm256_mul_ps(_mm256_mul_ps(a.v, s1), s2)};
}
#elif PK_NEON
struct V {
  float32x4_t v;
};
constexpr int kW = 4;
inline V vzero() { return {vdupq_n_f32(0.0f)}; }
inline V vload(const float* p) { return {vld1q_f32(p)}; }
inline V vbcast(float x) { return {vdupq_n_f32(x)}; }
inline void vstore(float* p, V a) { vst1q_f32(p, a.v); }
inline V vfma(V a, V b, V c) { return {vfmaq_f32(c.v, a.v, b.v)}; }
inline V vadd(V a, V b) { return {vaddq_f32(a.v, b.v)}; }
inline V vmul(V a, V b) { return {vmulq_f32(a.v, b.v)}; }
inline V vmax(V a, V b) { return {vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v)}; }
inline V vmin(V a, V b) { return {vbslq_f32(vcltq_f32(a.v, b.v), a.v, b.v)}; }
inline float vsum(V a) { return vaddvq_f32(a.v); }
typedef uint32x4_t M;
inline V vsub(V a, V b) { return {vsubq_f32(a.v, b.v)}; }
inline V vdiv(V a, V b) { return {vdivq_f32(a.v, b.v)}; }
inline V vsqrt(V a) { return {vsqrtq_f32(a.v)}; }
inline V vabs(V a) { return {vabsq_f32(a.v)}; }
inline V vxorsign(V a, V b) {
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(b.v), vdupq_n_u32(0x80000000u));
  return {vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(a.v), sign))};
}
inline M vlt(V a, V b) { return vcltq_f32(a.v, b.v); }
inline M vgt(V a, V b) { return vcgtq_f32(a.v, b.v); }
inline V vsel(M m, V a, V b) { return {vbslq_f32(m, a.v, b.v)}; }
inline V vscale2(V a, V n) {
  const int32x4_t ni = vcvtnq_s32_f32(n.v);
  const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
  const int32x4_t b127 = vdupq_n_s32(127);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, b127), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, b127), 23));
  return {vmulq_f32(vmulq_f32(a.v, s1), s2)};
}
#elif defined(POCK_SIMD_NONE)
struct V {
  float v[4];
};
constexpr int kW = 4;
#define PK_LANES(expr) \
  V r;                 \
  for (int l = 0; l < 4; ++l) r.v[l] = (expr);   \
  return r
inline V vzero() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
inline V vload(const float* p) { V r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline V vbcast(float x) { return {{x, x, x, x}}; }
inline void vstore(float* p, V a) { std::memcpy(p, a.v, sizeof a.v); }
inline V vfma(V a, V b, V c) { PK_LANES(__builtin_fmaf(a.v[l], b.v[l], c.v[l])); }
inline V vadd(V a, V b) { PK_LANES(a.v[l] + b.v[l]); }
inline V vmul(V a, V b) { PK_LANES(a.v[l] * b.v[l]); }
inline V vmax(V a, V b) { PK_LANES(a.v[l] > b.v[l] ? a.v[l] : b.v[l]); }
inline V vmin(V a, V b) { PK_LANES(a.v[l] < b.v[l] ? a.v[l] : b.v[l]); }
inline float vsum(V a) { return (a.v[0] + a.v[1]) + (a.v[2] + a.v[3]); }
struct M {
  bool m[4];
};
inline V vsub(V a, V b) { PK_LANES(a.v[l] - b.v[l]); }
inline V vdiv(V a, V b) { PK_LANES(a.v[l] / b.v[l]); }
inline V vsqrt(V a) { PK_LANES(__builtin_sqrtf(a.v[l])); }
inline float bits_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline V vabs(V a) { PK_LANES(bits_as_float(float_bits(a.v[l]) & 0x7fffffffu)); }
inline V vxorsign(V a, V b) { PK_LANES(bits_as_float(float_bits(a.v[l]) ^ (float_bits(b.v[l]) & 0x80000000u))); }
inline M vlt(V a, V b) { return {{a.v[0] < b.v[0], a.v[1] < b.v[1], a.v[2] < b.v[2], a.v[3] < b.v[3]}}; }
inline M vgt(V a, V b) { return {{a.v[0] > b.v[0], a.v[1] > b.v[1], a.v[2] > b.v[2], a.v[3] > b.v[3]}}; }
inline V vsel(M m, V a, V b) { PK_LANES(m.m[l] ? a.v[l] : b.v[l]); }
inline V vscale2(V a, V n) {
  V r;
  for (int l = 0; l < 4; ++l) {
    const int ni = int(n.v[l]), n1 = ni >> 1, n2 = ni - n1;
    r.v[l] = a.v[l] * bits_as_float(uint32_t(n1 + 127) << 23) * bits_as_float(uint32_t(n2 + 127) << 23);
  }
  return r;
}
#undef PK_LANES
#else
typedef float v4f __attribute__((vector_size(16)));
struct V {
  v4f v;
};
constexpr int kW = 4;
inline V vzero() { return {v4f{0.0f, 0.0f, 0.0f, 0.0f}}; }
inline V vload(const float* p) {
  V a;
  std::memcpy(&a.v, p, sizeof a.v);
  return a;
}
inline V vbcast(float x) { return {v4f{x, x, x, x}}; }
inline void vstore(float* p, V a) { std::memcpy(p, &a.v, sizeof a.v); }
inline V vfma(V a, V b, V c) { return {a.v * b.v + c.v}; }
inline V vadd(V a, V b) { return {a.v + b.v}; }
inline V vmul(V a, V b) { return {a.v * b.v}; }
inline V vmax(V a, V b) {
  for (int l = 0; l < 4; ++l) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
  return a;
}
inline V vmin(V a, V b) {
  for (int l = 0; l < 4; ++l) a.v[l] = a.v[l] < b.v[l] ? a.v[l] : b.v[l];
  return a;
}
inline float vsum(V a) { return (a.v[0] + a.v[1]) + (a.v[2] + a.v[3]); }
typedef int32_t v4i __attribute__((vector_size(16)));
typedef v4i M;
inline V vsub(V a, V b) { return {a.v - b.v}; }
inline V vdiv(V a, V b) { return {a.v / b.v}; }
inline V vsqrt(V a) {  // correctly rounded per lane, as the vector instructions
  for (int l = 0; l < 4; ++l) a.v[l] = __builtin_sqrtf(a.v[l]);
  return a;
}
inline V vabs(V a) { return {(v4f)((v4i)a.v & 0x7fffffff)}; }
inline V vxorsign(V a, V b) { return {(v4f)((v4i)a.v ^ ((v4i)b.v & int32_t(0x80000000u)))}; }
inline M vlt(V a, V b) { return a.v < b.v; }
inline M vgt(V a, V b) { return a.v > b.v; }
inline V vsel(M m, V a, V b) { return {(v4f)(((v4i)a.v & m) | ((v4i)b.v & ~m))}; }
inline V vscale2(V a, V n) {
  const v4i ni = __builtin_convertvector(n.v, v4i);
  const v4i n1 = ni >> 1, n2 = ni - n1;
  return {a.v * (v4f)((n1 + 127) << 23) * (v4f)((n2 + 127) << 23)};
}
#endif

// n <= kW floats at p as a vector (zero-padded lanes past n), and back (only n written).
inline V load_part(const float* p, long long n) {
  if (n == kW) return vload(p);
  float t[kW] = {};
  std::memcpy(t, p, sizeof(float) * n);
  return vload(t);
}
inline void store_part(float* p, V v, long long n) {
  if (n == kW) return vstore(p, v);
  float t[kW];
  vstore(t, v);
  std::memcpy(p, t, sizeof(float) * n);
}

// ------------------------------------------------------------ transposing copy
#if defined(__x86_64__) && defined(__GNUC__)
#define PK_X86_TRANSPOSE8 1
// r[0..7] (8 rows of 8) transposed in registers: r[c] becomes column c.  A target-attribute
// function, so baseline x86-64 code chosen at run time (lowp.cpp's AVX2/F16C readers) inlines
// it too, as does transpose_tile below in AVX2 and AVX-512 builds.
__attribute__((target("avx2"), always_inline)) inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]),
               t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]),
               t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
               t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif
#if defined(__AVX2__)
constexpr int kT = 8;
// d[r*ld + c] = s[c*ls + r] for an 8 x 8 tile
inline void transpose_tile(const float* s, long long ls, float* d, long long ld) {
  __m256 r[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ls);
  transpose8(r);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(d + i * ld, r[i]);
}
#elif PK_NEON
constexpr int kT = 4;
inline void transpose_tile(const float* s, long long ls, float* d, long long ld) {
  const float32x4_t r0 = vld1q_f32(s), r1 = vld1q_f32(s + ls), r2 = vld1q_f32(s + 2 * ls), r3 = vld1q_f32(s + 3 * ls);
  const float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1), t2 = vtrn1q_f32(r2, r3), t3 = vtrn2q_f32(r2, r3);
  vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
  vst1q_f32(d + ld, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
  vst1q_f32(d + 2 * ld, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
  vst1q_f32(d + 3 * ld, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
}
#else
constexpr int kT = 4;
inline void transpose_tile(const float* s, long long ls, float* d, long long ld) {
  for (int r = 0; r < kT; ++r)
    for (int c = 0; c < kT; ++c) d[r * ld + c] = s[c * ls + r];
}
#endif

inline void transpose_copy(const float* src, long long lds, long long rows, long long cols, float* dst,
                           long long ldd) {
  const long long rt = rows / kT * kT, ct = cols / kT * kT;
  for (long long r = 0; r < rt; r += kT) {
    for (long long c = 0; c < ct; c += kT) transpose_tile(src + c * lds + r, lds, dst + r * ldd + c, ldd);
    for (long long c = ct; c < cols; ++c)
      for (long long i = r; i < r + kT; ++i) dst[i * ldd + c] = src[c * lds + i];
  }
  for (long long r = rt; r < rows; ++r)
    for (long long c = 0; c < cols; ++c) dst[r * ldd + c] = src[c * lds + r];
}

}  // namespace simd
}  // namespace pk
