// simd.h — internal to the kernels (not part of the public runtime API): the
// native-width float vector V the GEMM and convolution kernels are written over,
// chosen at compile time: AVX-512 (__AVX512F__), AVX2+FMA (__AVX2__ && __FMA__),
// NEON (__aarch64__), or GNU vector extensions (any GCC/Clang target: SIMD
// registers where it has them, scalar code elsewhere).  V holds kW floats.
//
// vmax(a, b) / vmin(a, b) follow x86's maxps/minps on every target: b when either
// is NaN, so vmax(vzero(), x) propagates a NaN x (as torch.relu does).
#pragma once

#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__aarch64__)
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
#elif defined(__aarch64__)
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
#endif

}  // namespace simd
}  // namespace pk
