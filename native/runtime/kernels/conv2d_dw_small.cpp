// conv2d_dw_small.cpp — depthwise 3x3 convolution (groups == C == O, padding
// 1, stride 1 or 2) on small planes (H*W <= kSmallMaxHW: MobileNetV2's 16x16,
// 8x8 and 4x4 stages): forward, input gradient and weight gradient.
//
// "Masked flat" form (AVX-512 only): a plane is one flat run of H*W floats and
// a vector covers 16 consecutive positions, several rows at once when W < 16.
// With padding 1 and stride 1 the output has the input's shape and tap (kh, kw)
// of output q reads input q + (kh-1)*W + (kw-1), so every tap is one masked
// unaligned load (lanes whose row or column falls outside the plane masked to
// zero: the padding costs nothing, and masked-off lanes never touch memory).
// The masks depend only on the plane shape and are computed once per call.
//
// Stride 2 with padding 1 is the stride-1 result at the even positions
// (2*oh, 2*ow): the forward computes the vectors holding such positions and
// compresses them out; the input gradient and the weight gradient expand dy
// onto a zero H x W plane (dy_up[2*oh, 2*ow] = dy[oh, ow]) and run the
// stride-1 form on it (dx = stride-1 correlation of dy_up with the flipped
// kernel; dw = the stride-1 weight gradient of dy_up).
//
// Without AVX-512 (AVX2+FMA, NEON, portable) the same entry points use a
// channel-vectorized form instead (see below).  Every entry point returns
// false, doing nothing, where it does not apply (other shapes).
#include "conv_common.h"
#include "pock_parallel.h"

namespace pk {
namespace conv {

#if defined(__AVX512F__)
namespace {

#ifndef PK_DW_SMALL_MAX_HW
#define PK_DW_SMALL_MAX_HW 256
#endif
constexpr i64 kSmallMaxHW = PK_DW_SMALL_MAX_HW;  // planes up to 16x16
constexpr i64 kMaxVec = kSmallMaxHW / 16;     // vectors per plane

// Per-shape tables: for vector v and tap t = kh*3 + kw, the lanes whose tap lies
// inside the plane; the lanes inside the plane at all; for stride 2, the lanes
// at even (row, column) and whether a vector holds any.
struct Masks {
  i64 H, W, HW, nv;
  i64 off[9];                   // flat input offset of tap t
  __mmask16 tap[kMaxVec][9];
  __mmask16 in[kMaxVec];        // q < HW
  __mmask16 even[kMaxVec];      // stride 2: row and column even
};

void make_masks(i64 H, i64 W, Masks& m) {
  m.H = H, m.W = W, m.HW = H * W, m.nv = (m.HW + 15) / 16;
  for (int t = 0; t < 9; ++t) m.off[t] = (t / 3 - 1) * W + (t % 3 - 1);
  for (i64 v = 0; v < m.nv; ++v) {
    unsigned in = 0, even = 0, tap[9] = {};
    for (int l = 0; l < 16; ++l) {
      const i64 q = v * 16 + l, r = q / W, c = q % W;
      if (q >= m.HW) continue;
      in |= 1u << l;
      if (r % 2 == 0 && c % 2 == 0) even |= 1u << l;
      for (int t = 0; t < 9; ++t) {
        const i64 ir = r + t / 3 - 1, ic = c + t % 3 - 1;
        if (ir >= 0 && ir < H && ic >= 0 && ic < W) tap[t] |= 1u << l;
      }
    }
    m.in[v] = static_cast<__mmask16>(in);
    m.even[v] = static_cast<__mmask16>(even);
    for (int t = 0; t < 9; ++t) m.tap[v][t] = static_cast<__mmask16>(tap[t]);
  }
}

// The stride-1 3x3 correlation of plane x at flat positions [16v, 16v + 16).
inline __m512 taps(const Masks& m, const float* x, i64 v, const __m512* wv, __m512 s) {
  const float* p = x + v * 16;
  for (int t = 0; t < 9; ++t) s = _mm512_fmadd_ps(wv[t], _mm512_maskz_loadu_ps(m.tap[v][t], p + m.off[t]), s);
  return s;
}

inline __m512 act512(__m512 s, Act act) {
  if (act == Act::None) return s;
  s = _mm512_max_ps(_mm512_setzero_ps(), s);  // NaN propagates (maxps returns the second operand)
  if (act == Act::Relu6) s = _mm512_min_ps(_mm512_set1_ps(6.0f), s);
  return s;
}

// y = act(bias + conv3x3(x, w9)), stride S, padding 1 (y is H x W, or its even
// positions for S == 2).
void small_fwd_plane(const Masks& m, i64 S, const float* x, const float* w9, float* y, float bias, Act act) {
  __m512 wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = _mm512_set1_ps(w9[t]);
  const __m512 vb = _mm512_set1_ps(bias);
  if (S == 1) {
    for (i64 v = 0; v < m.nv; ++v) _mm512_mask_storeu_ps(y + v * 16, m.in[v], act512(taps(m, x, v, wv, vb), act));
    return;
  }
  float* out = y;
  for (i64 v = 0; v < m.nv; ++v) {
    if (m.even[v] == 0) continue;
    const __m512 s = act512(taps(m, x, v, wv, vb), act);
    const int n = __builtin_popcount(m.even[v]);
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << n) - 1), _mm512_maskz_compress_ps(m.even[v], s));
    out += n;
  }
}

// up (H x W) = dy (OH x OW) at the even positions, zero elsewhere.
void expand_even(const Masks& m, const float* dy, float* up) {
  const float* in = dy;
  for (i64 v = 0; v < m.nv; ++v) {
    const int n = __builtin_popcount(m.even[v]);
    const __m512 d = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), in);
    _mm512_storeu_ps(up + v * 16, _mm512_maskz_expand_ps(m.even[v], d));
    in += n;
  }
}

// dx (H x W) = the transposed convolution of dy: the stride-1 correlation of dy
// (or of dy expanded to H x W for S == 2) with the flipped kernel.
void small_bwd_input_plane(const Masks& m, i64 S, const float* dy, const float* w9, float* dx) {
  alignas(64) float up[kSmallMaxHW + 16];
  if (S == 2) {
    expand_even(m, dy, up);
    dy = up;
  }
  __m512 wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = _mm512_set1_ps(w9[8 - t]);
  for (i64 v = 0; v < m.nv; ++v) _mm512_mask_storeu_ps(dx + v * 16, m.in[v], taps(m, dy, v, wv, _mm512_setzero_ps()));
}

// acc[t] += per-lane dy * (tap t of x) over one plane (dy already H x W; for
// S == 2 the vectors without an even position hold only zeros and are skipped).
inline void small_bwd_weight_plane(const Masks& m, i64 S, const float* dy, const float* x, __m512* acc) {
  for (i64 v = 0; v < m.nv; ++v) {
    if (S == 2 && m.even[v] == 0) continue;
    const __m512 d = _mm512_maskz_loadu_ps(m.in[v], dy + v * 16);
    const float* p = x + v * 16;
    for (int t = 0; t < 9; ++t) acc[t] = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m.tap[v][t], p + m.off[t]), acc[t]);
  }
}

bool applies(const Conv2dParams& p) {
  return p.KH == 3 && p.KW == 3 && p.dil_h == 1 && p.dil_w == 1 && p.pad_h == 1 && p.pad_w == 1 &&
         p.stride_h == p.stride_w && (p.stride_h == 1 || p.stride_h == 2) && p.groups == p.C && p.O == p.C &&
         p.H * p.W <= kSmallMaxHW && p.H > 0 && p.W > 0 && p.OH == (p.H - 1) / p.stride_h + 1 &&
         p.OW == (p.W - 1) / p.stride_w + 1;
}

// Planes per parallel chunk: at least kMinChunkMacs multiply-adds.
inline i64 plane_grain(i64 HW) { return grain_for_work(9 * HW, kMinChunkMacs); }

}  // namespace

bool dw_small_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  if (!applies(p)) return false;
  Masks m;
  make_masks(p.H, p.W, m);
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(HW), [&](i64 b0, i64 b1) {
    for (i64 pl = b0; pl < b1; ++pl) {
      const i64 c = pl % p.C;
      small_fwd_plane(m, p.stride_h, x + pl * HW, w + c * 9, y + pl * OHW, b != nullptr ? b[c] : 0.0f, act);
    }
  });
  return true;
}

bool dw_small_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p) {
  if (!applies(p)) return false;
  Masks m;
  make_masks(p.H, p.W, m);
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(HW), [&](i64 b0, i64 b1) {
    for (i64 pl = b0; pl < b1; ++pl) small_bwd_input_plane(m, p.stride_h, dy + pl * OHW, w + pl % p.C * 9, dx + pl * HW);
  });
  return true;
}

// dw[c, 0, kh, kw] = sum over n, oh, ow of dy[n, c, oh, ow] * x[n, c, ih, iw]:
// per channel, 9 vector accumulators over every image, flushed to double every
// ~64 terms per lane.
bool dw_small_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc) {
  if (!applies(p) || k != 1 || xc != p.C) return false;
  Masks m;
  make_masks(p.H, p.W, m);
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  const i64 flush_every = 64 / m.nv > 1 ? 64 / m.nv : 1;  // images between flushes
  parallel_for(p.C, plane_grain(p.N * HW), [&](i64 c0, i64 c1) {
    alignas(64) float up[kSmallMaxHW + 16];
    for (i64 c = c0; c < c1; ++c) {
      double s9[9] = {};
      __m512 acc[9];
      for (int t = 0; t < 9; ++t) acc[t] = _mm512_setzero_ps();
      for (i64 n = 0; n < p.N; ++n) {
        const float* d = dy + (n * p.C + c) * OHW;
        if (p.stride_h == 2) {
          expand_even(m, d, up);
          d = up;
        }
        small_bwd_weight_plane(m, p.stride_h, d, x + (n * p.C + c) * HW, acc);
        if ((n + 1) % flush_every == 0 || n + 1 == p.N)
          for (int t = 0; t < 9; ++t) {
            s9[t] += _mm512_reduce_add_ps(acc[t]);
            acc[t] = _mm512_setzero_ps();
          }
      }
      for (int t = 0; t < 9; ++t) dw[c * 9 + t] = static_cast<float>(s9[t]);
    }
  });
  return true;
}

#else  // no AVX-512: the channel-vectorized form over simd.h's V (AVX2+FMA, NEON, portable)

// "Channel-vectorized" form: a vector holds kW channels of one image at one
// position.  A block of kW channels is transposed (kW x kW register
// transposes) into a zero-padded (H+2) x (W+2) buffer of position vectors, so
// every tap of every output -- borders included -- is one full aligned vector
// load and one multiply-add with that tap's per-channel weights; the result is
// transposed back into the channel planes.  Unlike a vector along the plane,
// no lane is wasted on a 4x4 or 8x8 plane, and stride 2 computes only the
// outputs it keeps.  A last block of fewer than kW channels computes the
// missing lanes on zeros and never stores them.
namespace {

using namespace simd;

#ifndef PK_DW_SMALL_MAX_HW
#define PK_DW_SMALL_MAX_HW 256
#endif
constexpr i64 kSmallMaxHW = PK_DW_SMALL_MAX_HW;
constexpr i64 kMaxPadded = kSmallMaxHW + 2 * (kSmallMaxHW + 1) + 4;  // (H+2)(W+2) for H*W <= kSmallMaxHW

// a[j] lane l <-> a[l] lane j.
inline void transpose(V* a) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(a[2 * i].v, a[2 * i + 1].v);
    t[2 * i + 1] = _mm256_unpackhi_ps(a[2 * i].v, a[2 * i + 1].v);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    __m256* u = t + 4 * h;
    s[4 * h + 0] = _mm256_shuffle_ps(u[0], u[2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * h + 1] = _mm256_shuffle_ps(u[0], u[2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * h + 2] = _mm256_shuffle_ps(u[1], u[3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * h + 3] = _mm256_shuffle_ps(u[1], u[3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    a[i].v = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
    a[4 + i].v = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
  }
#elif PK_NEON
  const float32x4x2_t p = vtrnq_f32(a[0].v, a[1].v), q = vtrnq_f32(a[2].v, a[3].v);
  a[0].v = vcombine_f32(vget_low_f32(p.val[0]), vget_low_f32(q.val[0]));
  a[1].v = vcombine_f32(vget_low_f32(p.val[1]), vget_low_f32(q.val[1]));
  a[2].v = vcombine_f32(vget_high_f32(p.val[0]), vget_high_f32(q.val[0]));
  a[3].v = vcombine_f32(vget_high_f32(p.val[1]), vget_high_f32(q.val[1]));
#else
  float t[kW][kW];
  for (int i = 0; i < kW; ++i) vstore(t[i], a[i]);
  float u[kW][kW];
  for (int i = 0; i < kW; ++i)
    for (int j = 0; j < kW; ++j) u[j][i] = t[i][j];
  for (int i = 0; i < kW; ++i) a[i] = vload(u[i]);
#endif
}

// Geometry of one call: input H x W (pitch Wp = W + 2 in the padded buffer),
// output OH x OW, stride S.
struct Geo {
  i64 H, W, OH, OW, S, HW, OHW, Wp;
};
inline Geo geo_of(const Conv2dParams& p) {
  return Geo{p.H, p.W, p.OH, p.OW, p.stride_h, p.H * p.W, p.OH * p.OW, p.W + 2};
}

// Channel planes src + l*stride (l < nl; n positions each) -> position vectors:
// position q's vector goes to dst + slot(q)*kW.  Lanes >= nl read zeros.
template <class Slot>
inline void planes_to_lanes(const float* src, i64 stride, i64 nl, i64 n, float* dst, Slot slot) {
  V a[kW];
  for (i64 j = 0; j < n; j += kW) {
    const i64 m = n - j < kW ? n - j : kW;
    for (int l = 0; l < kW; ++l) a[l] = l < nl ? load_part(src + l * stride + j, m) : vzero();
    transpose(a);
    for (i64 i = 0; i < m; ++i) vstore(dst + slot(j + i) * kW, a[i]);
  }
}
// Position vectors src + q*kW (q < n) -> channel planes dst + l*stride, l < nl.
inline void lanes_to_planes(const float* src, i64 n, float* dst, i64 stride, i64 nl) {
  V a[kW];
  for (i64 j = 0; j < n; j += kW) {
    const i64 m = n - j < kW ? n - j : kW;
    for (i64 i = 0; i < kW; ++i) a[i] = i < m ? vload(src + (j + i) * kW) : vzero();
    transpose(a);
    for (i64 l = 0; l < nl; ++l) store_part(dst + l * stride + j, a[l], m);
  }
}
// Channel planes (H x W) into the padded buffer's interior (its border stays zero).
inline void load_padded(const float* src, i64 stride, i64 nl, const Geo& g, float* xt) {
  planes_to_lanes(src, stride, nl, g.HW, xt, [&](i64 q) { return (q / g.W + 1) * g.Wp + q % g.W + 1; });
}
inline void zero(float* p, i64 n) {
  for (i64 i = 0; i < n; i += kW) vstore(p + i, vzero());
}
// wv[t] lane l = w[(c0 + l)*9 + t] (zero for l >= nl); flip: tap 8 - t.
inline void load_weights(const float* w, i64 c0, i64 nl, bool flip, V* wv) {
  alignas(64) float t9[9][kW] = {};
  for (i64 l = 0; l < nl; ++l)
    for (int t = 0; t < 9; ++t) t9[flip ? 8 - t : t][l] = w[(c0 + l) * 9 + t];
  for (int t = 0; t < 9; ++t) wv[t] = vload(t9[t]);
}

// yt[oh*OW + ow] = bias + the 3x3 correlation of the padded xt at (oh*S, ow*S).
template <int S>
inline void taps_all(const Geo& g, const float* xt, const V* wv, V bias, Act act, float* yt) {
  const i64 Wp = g.Wp;
  for (i64 oh = 0; oh < g.OH; ++oh)
    for (i64 ow = 0; ow < g.OW; ++ow) {
      const float* b = xt + (oh * S * Wp + ow * S) * kW;
      V s = bias;
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) s = vfma(wv[3 * kh + kw], vload(b + (kh * Wp + kw) * kW), s);
      vstore(yt + (oh * g.OW + ow) * kW, actv(s, act));
    }
}

bool applies(const Conv2dParams& p) {
  return p.KH == 3 && p.KW == 3 && p.dil_h == 1 && p.dil_w == 1 && p.pad_h == 1 && p.pad_w == 1 &&
         p.stride_h == p.stride_w && (p.stride_h == 1 || p.stride_h == 2) && p.groups == p.C && p.O == p.C &&
         p.H * p.W <= kSmallMaxHW && p.H > 0 && p.W > 0 && p.OH == (p.H - 1) / p.stride_h + 1 &&
         p.OW == (p.W - 1) / p.stride_w + 1;
}

// (image, channel block) items per parallel chunk: at least kMinChunkMacs multiply-adds.
inline i64 block_grain(i64 per_block) { return grain_for_work(per_block, kMinChunkMacs); }

}  // namespace

bool dw_small_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  if (!applies(p)) return false;
  const Geo g = geo_of(p);
  const i64 nblk = (p.C + kW - 1) / kW;
  parallel_for(p.N * nblk, block_grain(9 * g.OHW * kW), [&](i64 u0, i64 u1) {
    alignas(64) float xt[kMaxPadded * kW];
    alignas(64) float yt[kSmallMaxHW * kW];
    zero(xt, (g.H + 2) * g.Wp * kW);
    for (i64 u = u0; u < u1; ++u) {
      const i64 n = u / nblk, c0 = u % nblk * kW, nl = p.C - c0 < kW ? p.C - c0 : kW;
      V wv[9];
      load_weights(w, c0, nl, false, wv);
      alignas(64) float bl[kW] = {};
      if (b != nullptr)
        for (i64 l = 0; l < nl; ++l) bl[l] = b[c0 + l];
      load_padded(x + (n * p.C + c0) * g.HW, g.HW, nl, g, xt);
      if (g.S == 1) taps_all<1>(g, xt, wv, vload(bl), act, yt);
      else taps_all<2>(g, xt, wv, vload(bl), act, yt);
      lanes_to_planes(yt, g.OHW, y + (n * p.C + c0) * g.OHW, g.OHW, nl);
    }
  });
  return true;
}

// dx = the transposed convolution of dy.  Stride 1: the correlation of the
// padded dy with the flipped kernel (the forward's loop).  Stride 2: scatter
// form, dxt[(2oh + kh, 2ow + kw)] += w[kh, kw] * dy[oh, ow] on a padded buffer,
// whose interior is then transposed out.
bool dw_small_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p) {
  if (!applies(p)) return false;
  const Geo g = geo_of(p);
  const i64 nblk = (p.C + kW - 1) / kW;
  const i64 padded = (g.H + 2) * g.Wp * kW;
  parallel_for(p.N * nblk, block_grain(9 * g.OHW * kW), [&](i64 u0, i64 u1) {
    alignas(64) float bt[kMaxPadded * kW];   // stride 1: padded dy; stride 2: padded dx
    alignas(64) float ot[kMaxPadded * kW];   // stride 1: dx; stride 2: dy
    zero(bt, padded);
    for (i64 u = u0; u < u1; ++u) {
      const i64 n = u / nblk, c0 = u % nblk * kW, nl = p.C - c0 < kW ? p.C - c0 : kW;
      const float* dyb = dy + (n * p.C + c0) * g.OHW;
      float* dxb = dx + (n * p.C + c0) * g.HW;
      V wv[9];
      if (g.S == 1) {
        load_weights(w, c0, nl, true, wv);
        load_padded(dyb, g.OHW, nl, g, bt);
        taps_all<1>(g, bt, wv, vzero(), Act::None, ot);
        lanes_to_planes(ot, g.HW, dxb, g.HW, nl);
        continue;
      }
      load_weights(w, c0, nl, false, wv);
      if (u > u0) zero(bt, padded);
      planes_to_lanes(dyb, g.OHW, nl, g.OHW, ot, [](i64 q) { return q; });
      for (i64 oh = 0; oh < g.OH; ++oh)
        for (i64 ow = 0; ow < g.OW; ++ow) {
          const V d = vload(ot + (oh * g.OW + ow) * kW);
          float* o = bt + (2 * oh * g.Wp + 2 * ow) * kW;
          for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw) {
              float* q = o + (kh * g.Wp + kw) * kW;
              vstore(q, vfma(wv[3 * kh + kw], d, vload(q)));
            }
        }
      // interior rows of the padded dx, row by row, back to the planes
      V a[kW];
      for (i64 j = 0; j < g.HW; j += kW) {
        const i64 m = g.HW - j < kW ? g.HW - j : kW;
        for (i64 i = 0; i < kW; ++i) {
          const i64 q = j + i;
          a[i] = i < m ? vload(bt + ((q / g.W + 1) * g.Wp + q % g.W + 1) * kW) : vzero();
        }
        transpose(a);
        for (i64 l = 0; l < nl; ++l) store_part(dxb + l * g.HW + j, a[l], m);
      }
    }
  });
  return true;
}

// dw[c, 0, kh, kw] = sum over n, oh, ow of dy[n, c, oh, ow] * x[n, c, oh*S + kh - 1, ow*S + kw - 1]:
// per channel block, 9 vector accumulators (a lane per channel) over every
// image, flushed to double every ~64 terms per lane.
bool dw_small_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc) {
  if (!applies(p) || k != 1 || xc != p.C) return false;
  const Geo g = geo_of(p);
  const i64 nblk = (p.C + kW - 1) / kW;
  parallel_for(nblk, block_grain(9 * p.N * g.OHW * kW), [&](i64 b0, i64 b1) {
    alignas(64) float xt[kMaxPadded * kW];
    alignas(64) float dt[kSmallMaxHW * kW];
    zero(xt, (g.H + 2) * g.Wp * kW);
    for (i64 blk = b0; blk < b1; ++blk) {
      const i64 c0 = blk * kW, nl = p.C - c0 < kW ? p.C - c0 : kW;
      double s9[9][kW] = {};
      V acc[9];
      for (int t = 0; t < 9; ++t) acc[t] = vzero();
      i64 terms = 0;
      auto flush = [&] {
        for (int t = 0; t < 9; ++t) {
          alignas(64) float f[kW];
          vstore(f, acc[t]);
          for (int l = 0; l < kW; ++l) s9[t][l] += f[l];
          acc[t] = vzero();
        }
        terms = 0;
      };
      for (i64 n = 0; n < p.N; ++n) {
        load_padded(x + (n * p.C + c0) * g.HW, g.HW, nl, g, xt);
        planes_to_lanes(dy + (n * p.C + c0) * g.OHW, g.OHW, nl, g.OHW, dt, [](i64 q) { return q; });
        for (i64 oh = 0; oh < g.OH; ++oh)
          for (i64 ow = 0; ow < g.OW; ++ow) {
            const V d = vload(dt + (oh * g.OW + ow) * kW);
            const float* b = xt + (oh * g.S * g.Wp + ow * g.S) * kW;
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 3; ++kw)
                acc[3 * kh + kw] = vfma(d, vload(b + (kh * g.Wp + kw) * kW), acc[3 * kh + kw]);
            if (++terms == 64) flush();
          }
      }
      flush();
      for (i64 l = 0; l < nl; ++l)
        for (int t = 0; t < 9; ++t) dw[(c0 + l) * 9 + t] = static_cast<float>(s9[t][l]);
    }
  });
  return true;
}

#endif

}  // namespace conv
}  // namespace pk
