// conv_common.h — internal to conv2d.cpp, conv2d_plane3x3.cpp, conv2d_small_k.cpp and
// conv2d_dw_small.cpp (not part
// of the public runtime API): the valid-range helper, simd.h's native-width
// float vector V with deinterleaving loads/stores, the fused relu / relu6 epilogue, and the 3x3
// plane kernels (defined in conv2d_plane3x3.cpp) that conv2d.cpp dispatches to.
#pragma once

#include "pock_kernels.h"
#include "simd.h"

namespace pk {
namespace conv {

// [lo, hi): the output positions o in [0, out) whose input coordinate
// o*stride + offset falls inside [0, size).
struct Range {
  i64 lo, hi;
};
inline Range valid_range(i64 offset, i64 stride, i64 size, i64 out) {
  i64 lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  i64 hi = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  if (hi > out) hi = out;
  if (lo > hi) lo = hi;
  return Range{lo, hi};
}

// ---- the native-width float vector V of simd.h, plus two conv-only moves:
// vdeint(p, e, o) loads p[0, 2*kW) and splits it into the even and the odd
// elements; vst_int(p, e, o) stores p[2i] = e[i], p[2i+1] = o[i].
using namespace simd;
#if defined(__AVX512F__)
inline void vdeint(const float* p, V& e, V& o) {
  const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  e.v = _mm512_permutex2var_ps(a, ie, b);
  o.v = _mm512_permutex2var_ps(a, io, b);
}
inline void vst_int(float* p, V e, V o) {
  const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_ps(p, _mm512_permutex2var_ps(e.v, il, o.v));
  _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(e.v, ih, o.v));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline void vdeint(const float* p, V& e, V& o) {
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  const __m256 se = _mm256_shuffle_ps(a, b, 0x88), so = _mm256_shuffle_ps(a, b, 0xDD);  // a0 a2 b0 b2 | a4 a6 b4 b6
  e.v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(se), 0xD8));
  o.v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(so), 0xD8));
}
inline void vst_int(float* p, V e, V o) {
  const __m256 lo = _mm256_unpacklo_ps(e.v, o.v), hi = _mm256_unpackhi_ps(e.v, o.v);
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
#elif PK_NEON
inline void vdeint(const float* p, V& e, V& o) {
  const float32x4x2_t t = vld2q_f32(p);
  e.v = t.val[0];
  o.v = t.val[1];
}
inline void vst_int(float* p, V e, V o) {
  float32x4x2_t t;
  t.val[0] = e.v;
  t.val[1] = o.v;
  vst2q_f32(p, t);
}
#else
inline void vdeint(const float* p, V& e, V& o) {
  for (int i = 0; i < 4; ++i) {
    e.v[i] = p[2 * i];
    o.v[i] = p[2 * i + 1];
  }
}
inline void vst_int(float* p, V e, V o) {
  for (int i = 0; i < 4; ++i) {
    p[2 * i] = e.v[i];
    p[2 * i + 1] = o.v[i];
  }
}
#endif

inline float hsum(V a) {
  alignas(64) float t[kW];
  vstore(t, a);
  float s = 0.0f;
  for (int i = 0; i < kW; ++i) s += t[i];
  return s;
}

// The fused epilogue (NaN propagates, as torch.relu / relu6).
inline float act1(float v, Act act) {
  if (act == Act::None) return v;
  v = v < 0.0f ? 0.0f : v;
  if (act == Act::Relu6) v = v > 6.0f ? 6.0f : v;
  return v;
}
inline V actv(V v, Act act) {
  if (act == Act::None) return v;
  v = vmax(vbcast(0.0f), v);
  if (act == Act::Relu6) v = vmin(vbcast(6.0f), v);
  return v;
}
inline void act_inplace(float* y, i64 n, Act act) {
  if (act == Act::None) return;
  i64 i = 0;
  for (; i + kW <= n; i += kW) vstore(y + i, actv(vload(y + i), act));
  for (; i < n; ++i) y[i] = act1(y[i], act);
}

// ---- 3x3 (dilation 1, stride 1 or 2) single-plane kernels (conv2d_plane3x3.cpp)

struct Plane {
  i64 H, W, OH, OW, ph, pw;  // input H x W, output OH x OW, padding
};

// The 3x3 plane kernels apply: dilation 1, equal strides of 1 or 2.
inline bool is_3x3_plane(const Conv2dParams& p) {
  return p.KH == 3 && p.KW == 3 && p.dil_h == 1 && p.dil_w == 1 && p.stride_h == p.stride_w &&
         (p.stride_h == 1 || p.stride_h == 2) && p.pad_h >= 0 && p.pad_w >= 0 && p.pad_h <= 2 && p.pad_w <= 2;
}
inline Plane plane_of(const Conv2dParams& p) { return Plane{p.H, p.W, p.OH, p.OW, p.pad_h, p.pad_w}; }

// y (OH x OW) = init + conv3x3(x, w9) (init = bias, or y itself when acc), then
// act, stride S (1 or 2).
void plane3_fwd_any(i64 S, const float* x, const float* w9, float* y, const Plane& g, float bias, bool acc,
                    Act act);
// s9[kh*3 + kw] += sum over (oh, ow) of dy[oh, ow] * x[oh*S - ph + kh, ow*S - pw + kw].
void plane3_bwd_weight_any(i64 S, const float* dy, const float* x, const Plane& g, double* s9);
// dx (H x W) (= or +=) the transposed 3x3 convolution of dy, stride S.
void plane3_bwd_input(i64 S, const float* dy, const float* w9, float* dx, const Plane& g, bool acc);

// ---- depthwise 3x3, padding 1, stride 1 or 2 on small planes (conv2d_dw_small.cpp)
// Whole-kernel entry points (parallel inside); each returns false, doing
// nothing, where it does not apply (other shapes; targets without AVX-512).
bool dw_small_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act);
bool dw_small_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p);
bool dw_small_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc);

// ---- the forward of an ungrouped convolution with C*KH*KW <= 32 taps and >= 8 output
// channels (conv2d_small_k.cpp), parallel inside; false, doing nothing, elsewhere.
bool small_k_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act);

}  // namespace conv
}  // namespace pk
