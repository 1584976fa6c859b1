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
// Every entry point returns false, doing nothing, where it does not apply (other
// shapes, or a target without AVX-512: NEON and AVX2 keep conv2d_plane3x3.cpp).
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

// Planes per parallel chunk: ~32K multiply-adds.
inline i64 plane_grain(i64 HW) { return (1 << 15) / (9 * HW) + 1; }

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

#else  // no AVX-512: conv2d_plane3x3.cpp's kernels serve every shape

bool dw_small_fwd(const float*, const float*, const float*, float*, const Conv2dParams&, Act) { return false; }
bool dw_small_bwd_input(const float*, const float*, float*, const Conv2dParams&) { return false; }
bool dw_small_bwd_weight(const float*, const float*, float*, const Conv2dParams&, i64, i64) { return false; }

#endif

}  // namespace conv
}  // namespace pk
