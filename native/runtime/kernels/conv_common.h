// conv_common.h — internal to conv2d.cpp, conv2d_plane3x3.cpp, conv2d_small_k.cpp and
// conv2d_dw_small.cpp (not part
// of the public runtime API): the valid-range helper, simd.h's native-width
// float vector V with deinterleaving loads/stores, the fused relu / relu6 epilogue, the
// im2col both GEMM-like paths read, and the 3x3 plane kernels (defined in
// conv2d_plane3x3.cpp) that conv2d.cpp dispatches to.
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

// ---- im2col, the one copy behind conv2d.cpp's implicit GEMM and conv2d_small_k.cpp

// out[i*step] = 0 for i in [0, n).
inline void zero_strided(float* out, i64 n, i64 step) {
  for (i64 i = 0; i < n; ++i) out[i * step] = 0.0f;
}

// One output row segment of an im2col row: for q in [q0, q0+n), position q of output
// row `oh` reads input (oh*sh + off_h, q*sw + off_w) of plane xp, or 0 in the padding
// (rw = valid_range(off_w, sw, W, OW)).  Written to out[i*step]; a contiguous segment
// (step 1) copies stride-1 rows whole and deinterleaves stride-2 rows a vector at a time.
inline void im2col_segment(const float* xp, const Conv2dParams& p, i64 oh, i64 off_h, i64 off_w, const Range& rw,
                           i64 q0, i64 n, float* out, i64 step) {
  const i64 ih = oh * p.stride_h + off_h;
  if (ih < 0 || ih >= p.H) {
    zero_strided(out, n, step);
    return;
  }
  const i64 q1 = q0 + n;
  const i64 lo = rw.lo < q0 ? q0 : (rw.lo > q1 ? q1 : rw.lo);
  const i64 hi = rw.hi < lo ? lo : (rw.hi > q1 ? q1 : rw.hi);
  const float* xrow = xp + ih * p.W + off_w;  // xrow[q * sw] for q in [lo, hi)
  zero_strided(out, lo - q0, step);
  i64 q = lo;
  if (step == 1 && p.stride_w == 1) {
    for (; q < hi; ++q) out[q - q0] = xrow[q];  // a memcpy, vectorised
  } else if (step == 1 && p.stride_w == 2) {
    // the even elements of xrow[2q, 2q + 2*kW): inside the row while 2q + off_w + 2*kW <= W
    for (; q + kW <= hi && 2 * q + off_w + 2 * kW <= p.W; q += kW) {
      V e, o;
      vdeint(xrow + 2 * q, e, o);
      vstore(out + (q - q0), e);
    }
  }
  for (; q < hi; ++q) out[(q - q0) * step] = xrow[q * p.stride_w];
  zero_strided(out + (hi - q0) * step, q1 - hi, step);
}

// im2col taps [k0, k0+nk) (tap = (c, kh, kw)) x output positions [q0, q0+nq) (q = (oh, ow))
// of one image's group x (its C/groups planes) -> x[c, ih, iw] or 0, into
// out[k * tap_ld + q * pos_ld].
inline void im2col_block(const float* x, const Conv2dParams& p, i64 k0, i64 nk, i64 q0, i64 nq, float* out,
                         i64 tap_ld, i64 pos_ld) {
  const i64 KHW = p.KH * p.KW;
  for (i64 k = 0; k < nk; ++k) {
    const i64 tap = k0 + k, c = tap / KHW, kh = tap % KHW / p.KW, kw = tap % p.KW;
    const i64 off_h = kh * p.dil_h - p.pad_h, off_w = kw * p.dil_w - p.pad_w;
    const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
    const float* xp = x + c * p.H * p.W;
    i64 oh = q0 / p.OW, ow = q0 % p.OW;
    for (i64 q = 0; q < nq; ow = 0, ++oh) {
      const i64 run = p.OW - ow < nq - q ? p.OW - ow : nq - q;
      im2col_segment(xp, p, oh, off_h, off_w, rw, ow, run, out + k * tap_ld + q * pos_ld, pos_ld);
      q += run;
    }
  }
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

// ---- the forward of an ungrouped convolution with >= 8 output channels and C*KH*KW <= 32
// taps, or a 1x1 one with few output channels (conv2d_small_k.cpp), parallel inside; false,
// doing nothing, elsewhere.
bool small_k_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act);

}  // namespace conv
}  // namespace pk
