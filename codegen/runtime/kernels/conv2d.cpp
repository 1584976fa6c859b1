// conv2d.cpp — 2-D convolution (NCHW, weight [O, C/groups, KH, KW]) and its
// gradients.  Stride, padding, dilation and groups (incl. depthwise) are all
// supported.  Paths, in order:
//   * 3x3, dilation 1, stride 1 or 2, depthwise (groups == C == O): one
//     vectorised pass per image plane (the three input rows of an output row
//     combined in registers; the stride-2 input gradient gathers the two
//     column phases and stores them interleaved), parallel over N*C planes;
//   * 1x1, stride 1, pad 0: one GEMM per image and group (pk::gemm, the
//     images of a parallel chunk batched in one call); the weight gradient
//     splits the output channels over the threads;
//   * other convolutions whose GEMM would have at least kGemmMinRows rows
//     (output channels per group; input channels per group for the input
//     gradient): an implicit GEMM per image and group, where the im2col
//     (resp. col2im) matrix is generated block by block straight into the
//     GEMM's bounded packing buffers — no scratch memory — parallel over images;
//   * 3x3 (as above) with few channels per group: sums of the same plane
//     kernels (e.g. the input gradient of a 3-channel stem);
//   * everything else: a direct loop over kernel taps, each tap a run of
//     contiguous (stride 1) or strided multiply-adds over an output row whose
//     valid range is computed up front.
// conv2d_fwd_act applies relu / relu6 as y is written (in the plane kernels)
// or right after each image's GEMM.  No kernel allocates.  The vector code
// uses the native width (AVX-512 / AVX2+FMA / NEON intrinsics behind #if
// guards, a plain 4-float struct otherwise).
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {
namespace detail {
// Defined in gemm.cpp (implicit GEMM): C[M,N] (row stride ldc) = A @ B
// (+ C when accumulate); read_at fills out[r*ld + c] with A^T[r0+r][c0+c]
// ([K, M]), read_b with B[r0+r][c0+c] ([K, N]).
using BlockReadFn = void (*)(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld);
void gemm_readers(BlockReadFn read_at, const void* at_ctx, BlockReadFn read_b, const void* b_ctx, float* C,
                  i64 ldc, i64 M, i64 N, i64 K, bool accumulate);
}  // namespace detail

namespace {

// Below this many GEMM rows the zero-padded micro-tiles waste most of their
// work and the direct loop is used instead.
constexpr i64 kGemmMinRows = 8;

// [lo, hi): the output positions o in [0, out) whose input coordinate
// o*stride + offset falls inside [0, size).
struct Range {
  i64 lo, hi;
};
Range valid_range(i64 offset, i64 stride, i64 size, i64 out) {
  i64 lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  i64 hi = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  if (hi > out) hi = out;
  if (lo > hi) lo = hi;
  return Range{lo, hi};
}

// y[i] += a * x[i*xs] for i in [0, n); the stride-1 case in fixed-size chunks
// (16, then 8 and 4 for the tail) so the compiler vectorises it at -O2.
inline void axpy(i64 n, float a, const float* __restrict x, i64 xs, float* __restrict y) {
  if (xs == 1) {
    i64 i = 0;
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) y[i + j] += a * x[i + j];
    if (i + 8 <= n) {
      for (int j = 0; j < 8; ++j) y[i + j] += a * x[i + j];
      i += 8;
    }
    if (i + 4 <= n) {
      for (int j = 0; j < 4; ++j) y[i + j] += a * x[i + j];
      i += 4;
    }
    for (; i < n; ++i) y[i] += a * x[i];
  } else {
    for (i64 i = 0; i < n; ++i) y[i] += a * x[i * xs];
  }
}

// y[i*ys] += a * x[i] for i in [0, n) (scatter form used by the input gradient).
inline void axpy_scatter(i64 n, float a, const float* __restrict x, float* __restrict y, i64 ys) {
  if (ys == 1) {
    axpy(n, a, x, 1, y);
  } else {
    for (i64 i = 0; i < n; ++i) y[i * ys] += a * x[i];
  }
}

// sum_i a[i] * b[i*bs] for i in [0, n), with chunked partial sums.
inline float dot(i64 n, const float* __restrict a, const float* __restrict b, i64 bs) {
  constexpr int kChunk = 16;
  float part[kChunk] = {};
  i64 i = 0;
  if (bs == 1) {
    for (; i + kChunk <= n; i += kChunk)
      for (int j = 0; j < kChunk; ++j) part[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i * bs];
  for (int j = 0; j < kChunk; ++j) s += part[j];
  return s;
}

bool is_pointwise(const Conv2dParams& p) {
  return p.KH == 1 && p.KW == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0 &&
         p.OH == p.H && p.OW == p.W;
}

// ---- implicit-GEMM operand readers (all fill out[r*ld + c], r < rows, c < cols)

// Zero out[0:n) with stride `step`.
inline void zero_strided(float* out, i64 n, i64 step) {
  for (i64 i = 0; i < n; ++i) out[i * step] = 0.0f;
}

// One output row segment of an im2col row: for q in [q0, q0+n), position q of
// output row `oh` reads input (oh*sh + off_h, q*sw + off_w) of plane xp, or 0
// in the padding.  Written to out[i*step].
inline void im2col_segment(const float* xp, const Conv2dParams& p, i64 oh, i64 off_h, i64 off_w,
                           const Range& rw, i64 q0, i64 n, float* out, i64 step) {
  const i64 ih = oh * p.stride_h + off_h;
  if (ih < 0 || ih >= p.H) {
    zero_strided(out, n, step);
    return;
  }
  const i64 q1 = q0 + n;
  const i64 lo = rw.lo < q0 ? q0 : (rw.lo > q1 ? q1 : rw.lo);
  const i64 hi = rw.hi < lo ? lo : (rw.hi > q1 ? q1 : rw.hi);
  const float* xrow = xp + ih * p.W;
  zero_strided(out, lo - q0, step);
  for (i64 q = lo; q < hi; ++q) out[(q - q0) * step] = xrow[q * p.stride_w + off_w];
  zero_strided(out + (hi - q0) * step, q1 - hi, step);
}

// A^T of a row-major matrix a[M, lda]: out[r][c] = a[(c0+c)*lda + r0 + r].
struct TransposedCtx {
  const float* a;
  i64 lda;
};
void read_transposed(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const TransposedCtx*>(vctx);
  for (i64 c = 0; c < cols; ++c) {
    const float* src = ctx.a + (c0 + c) * ctx.lda + r0;
    for (i64 r = 0; r < rows; ++r) out[r * ld + c] = src[r];
  }
}

// Image n, group g: x = first input channel of the group, dy = first output
// channel of the group, w = first weight of the group.
struct ConvCtx {
  const Conv2dParams* p;
  const float* x;
  const float* dy;
  const float* w;
};

// Forward B = im2col: row (c, kh, kw), column (oh, ow) -> x[c, ih, iw] or 0.
void read_im2col(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  const Conv2dParams& p = *ctx.p;
  const i64 KHW = p.KH * p.KW;
  for (i64 r = 0; r < rows; ++r) {
    const i64 row = r0 + r, c = row / KHW, kh = row % KHW / p.KW, kw = row % p.KW;
    const i64 off_h = kh * p.dil_h - p.pad_h, off_w = kw * p.dil_w - p.pad_w;
    const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
    const float* xp = ctx.x + c * p.H * p.W;
    i64 oh = c0 / p.OW, ow = c0 % p.OW;
    for (i64 t = 0; t < cols; ow = 0, ++oh) {
      const i64 run = p.OW - ow < cols - t ? p.OW - ow : cols - t;
      im2col_segment(xp, p, oh, off_h, off_w, rw, ow, run, out + r * ld + t, 1);
      t += run;
    }
  }
}

// Weight-gradient B = im2col^T: row (oh, ow), column (c, kh, kw).
void read_im2col_t(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  const Conv2dParams& p = *ctx.p;
  const i64 KHW = p.KH * p.KW;
  for (i64 t = 0; t < cols; ++t) {
    const i64 col = c0 + t, c = col / KHW, kh = col % KHW / p.KW, kw = col % p.KW;
    const i64 off_h = kh * p.dil_h - p.pad_h, off_w = kw * p.dil_w - p.pad_w;
    const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
    const float* xp = ctx.x + c * p.H * p.W;
    i64 oh = r0 / p.OW, ow = r0 % p.OW;
    for (i64 r = 0; r < rows; ow = 0, ++oh) {
      const i64 run = p.OW - ow < rows - r ? p.OW - ow : rows - r;
      im2col_segment(xp, p, oh, off_h, off_w, rw, ow, run, out + r * ld + t, ld);
      r += run;
    }
  }
}

// Input-gradient A^T: row (o, kh, kw), column c -> w[o, c, kh, kw].
void read_weight_t(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  const Conv2dParams& p = *ctx.p;
  const i64 KHW = p.KH * p.KW, Cg = p.C / p.groups;
  for (i64 r = 0; r < rows; ++r) {
    const i64 row = r0 + r, o = row / KHW, tap = row % KHW;
    const float* src = ctx.w + (o * Cg + c0) * KHW + tap;
    for (i64 c = 0; c < cols; ++c) out[r * ld + c] = src[c * KHW];
  }
}

// Input-gradient B = col2im: row (o, kh, kw), column (ih, iw) -> dy[o, oh, ow]
// where ih = oh*sh - ph + kh*dh and iw = ow*sw - pw + kw*dw, or 0 when no
// output position reads (ih, iw) through this tap.
void read_col2im(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  const Conv2dParams& p = *ctx.p;
  const i64 KHW = p.KH * p.KW;
  for (i64 r = 0; r < rows; ++r) {
    const i64 row = r0 + r, o = row / KHW, kh = row % KHW / p.KW, kw = row % p.KW;
    const i64 nh = p.pad_h - kh * p.dil_h, nw = p.pad_w - kw * p.dil_w;  // oh*sh = ih + nh
    const float* dyp = ctx.dy + o * p.OH * p.OW;
    float* o_row = out + r * ld;
    i64 ih = c0 / p.W, iw = c0 % p.W;
    for (i64 t = 0; t < cols; iw = 0, ++ih) {
      const i64 run = p.W - iw < cols - t ? p.W - iw : cols - t;
      float* dst = o_row + t;
      t += run;
      const i64 th = ih + nh;
      if (th < 0 || th % p.stride_h != 0 || th / p.stride_h >= p.OH) {
        zero_strided(dst, run, 1);
        continue;
      }
      const float* dyrow = dyp + th / p.stride_h * p.OW;
      if (p.stride_w == 1) {
        // ow = iw + nw must lie in [0, OW): iw in [-nw, OW - nw)
        const i64 q1 = iw + run;
        const i64 lo = -nw < iw ? iw : (-nw > q1 ? q1 : -nw);
        const i64 hi = p.OW - nw < lo ? lo : (p.OW - nw > q1 ? q1 : p.OW - nw);
        zero_strided(dst, lo - iw, 1);
        for (i64 q = lo; q < hi; ++q) dst[q - iw] = dyrow[q + nw];
        zero_strided(dst + (hi - iw), q1 - hi, 1);
      } else {
        for (i64 u = 0; u < run; ++u) {
          const i64 tw = iw + u + nw;
          dst[u] = (tw >= 0 && tw % p.stride_w == 0 && tw / p.stride_w < p.OW) ? dyrow[tw / p.stride_w] : 0.0f;
        }
      }
    }
  }
}


// ---- a minimal float vector (the native width; intrinsics only behind guards)
//
// V holds kVW floats.  vdeint(p, e, o) loads p[0, 2*kVW) and splits it into the
// even and the odd elements; vst_int(p, e, o) stores p[2i] = e[i], p[2i+1] = o[i].
#if defined(__AVX512F__)
constexpr int kVW = 16;
struct V {
  __m512 v;
};
inline V vload(const float* p) { return V{_mm512_loadu_ps(p)}; }
inline void vstore(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V vset(float x) { return V{_mm512_set1_ps(x)}; }
inline V vfma(V a, V b, V c) { return V{_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V vmul(V a, V b) { return V{_mm512_mul_ps(a.v, b.v)}; }
inline V vadd(V a, V b) { return V{_mm512_add_ps(a.v, b.v)}; }
// (a > b) ? a : b with b returned for NaN; called as vmax(0, x) NaN propagates.
inline V vmax(V a, V b) { return V{_mm512_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return V{_mm512_min_ps(a.v, b.v)}; }
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
constexpr int kVW = 8;
struct V {
  __m256 v;
};
inline V vload(const float* p) { return V{_mm256_loadu_ps(p)}; }
inline void vstore(float* p, V a) { _mm256_storeu_ps(p, a.v); }
inline V vset(float x) { return V{_mm256_set1_ps(x)}; }
inline V vfma(V a, V b, V c) { return V{_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V vmul(V a, V b) { return V{_mm256_mul_ps(a.v, b.v)}; }
inline V vadd(V a, V b) { return V{_mm256_add_ps(a.v, b.v)}; }
inline V vmax(V a, V b) { return V{_mm256_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return V{_mm256_min_ps(a.v, b.v)}; }
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
#elif defined(__aarch64__) && defined(__ARM_NEON)
constexpr int kVW = 4;
struct V {
  float32x4_t v;
};
inline V vload(const float* p) { return V{vld1q_f32(p)}; }
inline void vstore(float* p, V a) { vst1q_f32(p, a.v); }
inline V vset(float x) { return V{vdupq_n_f32(x)}; }
inline V vfma(V a, V b, V c) { return V{vfmaq_f32(c.v, a.v, b.v)}; }
inline V vmul(V a, V b) { return V{vmulq_f32(a.v, b.v)}; }
inline V vadd(V a, V b) { return V{vaddq_f32(a.v, b.v)}; }
inline V vmax(V a, V b) { return V{vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v)}; }  // x86 semantics
inline V vmin(V a, V b) { return V{vbslq_f32(vcltq_f32(a.v, b.v), a.v, b.v)}; }
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
constexpr int kVW = 4;
struct V {
  float v[4];
};
inline V vload(const float* p) { return V{{p[0], p[1], p[2], p[3]}}; }
inline void vstore(float* p, V a) {
  for (int i = 0; i < 4; ++i) p[i] = a.v[i];
}
inline V vset(float x) { return V{{x, x, x, x}}; }
inline V vfma(V a, V b, V c) {
  for (int i = 0; i < 4; ++i) c.v[i] += a.v[i] * b.v[i];
  return c;
}
inline V vmul(V a, V b) {
  for (int i = 0; i < 4; ++i) a.v[i] *= b.v[i];
  return a;
}
inline V vadd(V a, V b) {
  for (int i = 0; i < 4; ++i) a.v[i] += b.v[i];
  return a;
}
inline V vmax(V a, V b) {
  for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return a;
}
inline V vmin(V a, V b) {
  for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i];
  return a;
}
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
  alignas(64) float t[kVW];
  vstore(t, a);
  float s = 0.0f;
  for (int i = 0; i < kVW; ++i) s += t[i];
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
  v = vmax(vset(0.0f), v);
  if (act == Act::Relu6) v = vmin(vset(6.0f), v);
  return v;
}
void act_inplace(float* y, i64 n, Act act) {
  if (act == Act::None) return;
  i64 i = 0;
  for (; i + kVW <= n; i += kVW) vstore(y + i, actv(vload(y + i), act));
  for (; i < n; ++i) y[i] = act1(y[i], act);
}

// ---- 3x3 (dilation 1, stride 1 or 2) single-plane kernels
//
// Rows are processed with the native vector width over the output columns
// whose every tap is inside the input; the few edge columns are scalar.  A
// tail shorter than a vector is computed as the last full vector of the
// interior (overlapping), keeping only its new lanes.

struct Plane {
  i64 H, W, OH, OW, ph, pw;  // input H x W, output OH x OW, padding
};

// The output columns whose three taps ow*S - pw + {0,1,2} all lie in [0, W).
inline Range interior_cols(i64 S, i64 pw, i64 W, i64 OW) {
  const Range a = valid_range(-pw, S, W, OW), b = valid_range(2 - pw, S, W, OW);
  Range r{a.lo > b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// y (OH x OW) = init + conv3x3(x, w9) (init = bias, or y itself when acc), then act.
template <int S>
void plane3_fwd(const float* __restrict x, const float* w9, float* __restrict y, const Plane& g, float bias,
                bool acc, Act act) {
  const Range ir = interior_cols(S, g.pw, g.W, g.OW);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    const float* rows[3];
    const float* wr[3];
    int nr = 0;
    for (int kh = 0; kh < 3; ++kh) {
      const i64 ih = oh * S - g.ph + kh;
      if (ih >= 0 && ih < g.H) {
        rows[nr] = x + ih * g.W;
        wr[nr] = w9 + 3 * kh;
        ++nr;
      }
    }
    float* yr = y + oh * g.OW;
    auto scalar_at = [&](i64 ow) {
      float s = 0.0f;
      for (int r = 0; r < nr; ++r)
        for (int kw = 0; kw < 3; ++kw) {
          const i64 iw = ow * S - g.pw + kw;
          if (iw >= 0 && iw < g.W) s += wr[r][kw] * rows[r][iw];
        }
      yr[ow] = act1((acc ? yr[ow] : bias) + s, act);
    };
    for (i64 ow = 0; ow < ir.lo; ++ow) scalar_at(ow);
    for (i64 ow = ir.hi; ow < g.OW; ++ow) scalar_at(ow);
    if (ir.hi - ir.lo < kVW) {
      for (i64 ow = ir.lo; ow < ir.hi; ++ow) scalar_at(ow);
      continue;
    }
    V wv[3][3];
    for (int r = 0; r < nr; ++r)
      for (int kw = 0; kw < 3; ++kw) wv[r][kw] = vset(wr[r][kw]);
    auto block = [&](i64 ow) {
      V s = vset(0.0f);
      for (int r = 0; r < nr; ++r) {
        const float* q = rows[r] + ow * S - g.pw;
        if (S == 1) {
          s = vfma(wv[r][0], vload(q), s);
          s = vfma(wv[r][1], vload(q + 1), s);
          s = vfma(wv[r][2], vload(q + 2), s);
        } else {
          V e, o, e2, o2;
          vdeint(q, e, o);
          vdeint(q + 1, o2, e2);  // e2 = q[2], q[4], ... (reads up to q[2*kVW])
          s = vfma(wv[r][0], e, s);
          s = vfma(wv[r][1], o, s);
          s = vfma(wv[r][2], e2, s);
        }
      }
      return s;
    };
    const V vb = vset(bias);
    i64 ow = ir.lo;
    for (; ow + kVW <= ir.hi; ow += kVW) {
      const V s = block(ow);
      vstore(yr + ow, actv(vadd(acc ? vload(yr + ow) : vb, s), act));
    }
    if (ow < ir.hi) {  // overlapping last vector, new lanes only
      alignas(64) float t[kVW];
      const i64 base = ir.hi - kVW;
      vstore(t, block(base));
      for (i64 q = ow; q < ir.hi; ++q) yr[q] = act1((acc ? yr[q] : bias) + t[q - base], act);
    }
  }
}

// dx (H x W) (= or +=) the stride-2 transposed 3x3 convolution of dy (OH x OW):
//   dx[ih, iw] = sum of w[kh, kw] * dy[oh, ow] over ih = 2*oh - ph + kh, iw = 2*ow - pw + kw.
// Per dx row only the taps kh of one parity contribute; along the row, with
// j = (iw + pw) / 2: dx[2j - pw] = w0*dy[j] + w2*dy[j-1], dx[2j - pw + 1] = w1*dy[j].
void plane3_bwd_input_s2(const float* __restrict dy, const float* w9, float* __restrict dx, const Plane& g,
                         bool acc) {
  i64 jlo = (g.pw + 1) / 2;
  if (jlo < 1) jlo = 1;
  i64 jhi = g.W - 2 + g.pw >= 0 ? (g.W - 2 + g.pw) / 2 + 1 : 0;
  if (jhi > g.OW) jhi = g.OW;
  if (jhi < jlo) jhi = jlo;
  const bool vec = jhi - jlo >= kVW;
  const i64 iw_lo = vec ? 2 * jlo - g.pw : g.W, iw_hi = vec ? 2 * jhi - g.pw : g.W;
  for (i64 ih = 0; ih < g.H; ++ih) {
    const float* rows[2];
    const float* wr[2];
    int nr = 0;
    for (int kh = 0; kh < 3; ++kh) {
      const i64 t = ih + g.ph - kh;
      if (t >= 0 && t % 2 == 0 && t / 2 < g.OH) {
        rows[nr] = dy + t / 2 * g.OW;
        wr[nr] = w9 + 3 * kh;
        ++nr;
      }
    }
    float* xr = dx + ih * g.W;
    auto scalar_at = [&](i64 iw) {
      float s = 0.0f;
      for (int r = 0; r < nr; ++r)
        for (int kw = 0; kw < 3; ++kw) {
          const i64 u = iw + g.pw - kw;
          if (u >= 0 && u % 2 == 0 && u / 2 < g.OW) s += wr[r][kw] * rows[r][u / 2];
        }
      xr[iw] = acc ? xr[iw] + s : s;
    };
    if (!vec || nr == 0) {
      for (i64 iw = 0; iw < g.W; ++iw) scalar_at(iw);
      continue;
    }
    for (i64 iw = 0; iw < iw_lo; ++iw) scalar_at(iw);
    for (i64 iw = iw_hi; iw < g.W; ++iw) scalar_at(iw);
    V wv[2][3];
    for (int r = 0; r < nr; ++r)
      for (int kw = 0; kw < 3; ++kw) wv[r][kw] = vset(wr[r][kw]);
    auto block = [&](i64 j, V& e, V& o) {
      e = vset(0.0f);
      o = vset(0.0f);
      for (int r = 0; r < nr; ++r) {
        const V d0 = vload(rows[r] + j), d1 = vload(rows[r] + j - 1);
        e = vfma(wv[r][0], d0, e);
        e = vfma(wv[r][2], d1, e);
        o = vfma(wv[r][1], d0, o);
      }
    };
    i64 j = jlo;
    for (; j + kVW <= jhi; j += kVW) {
      V e, o;
      block(j, e, o);
      float* p = xr + 2 * j - g.pw;
      if (acc) {
        V pe, po;
        vdeint(p, pe, po);
        e = vadd(e, pe);
        o = vadd(o, po);
      }
      vst_int(p, e, o);
    }
    if (j < jhi) {
      alignas(64) float te[kVW], to[kVW];
      V e, o;
      const i64 base = jhi - kVW;
      block(base, e, o);
      vstore(te, e);
      vstore(to, o);
      for (i64 q = j; q < jhi; ++q) {
        float* p = xr + 2 * q - g.pw;
        p[0] = acc ? p[0] + te[q - base] : te[q - base];
        p[1] = acc ? p[1] + to[q - base] : to[q - base];
      }
    }
  }
}

// s9[t] += the lanes of av[t] (double), av = 0.
inline void flush9(V (&av)[3][3], double* s9) {
  for (int kh = 0; kh < 3; ++kh)
    for (int kw = 0; kw < 3; ++kw) {
      s9[kh * 3 + kw] += hsum(av[kh][kw]);
      av[kh][kw] = vset(0.0f);
    }
}

// s9[kh*3 + kw] += sum over (oh, ow) of dy[oh, ow] * x[oh*S - ph + kh, ow*S - pw + kw].
template <int S>
void plane3_bwd_weight(const float* __restrict dy, const float* __restrict x, const Plane& g, double* s9) {
  const Range ir = interior_cols(S, g.pw, g.W, g.OW);
  const bool vec = ir.hi - ir.lo >= kVW;
  V av[3][3];
  for (int kh = 0; kh < 3; ++kh)
    for (int kw = 0; kw < 3; ++kw) av[kh][kw] = vset(0.0f);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    if (oh % 4 == 0 && oh > 0) flush9(av, s9);  // bounded float partial sums
    const float* dr = dy + oh * g.OW;
    const float* rows[3] = {nullptr, nullptr, nullptr};
    for (int kh = 0; kh < 3; ++kh) {
      const i64 ih = oh * S - g.ph + kh;
      if (ih >= 0 && ih < g.H) rows[kh] = x + ih * g.W;
    }
    auto scalar_at = [&](i64 ow) {
      const float d = dr[ow];
      for (int kh = 0; kh < 3; ++kh) {
        if (rows[kh] == nullptr) continue;
        for (int kw = 0; kw < 3; ++kw) {
          const i64 iw = ow * S - g.pw + kw;
          if (iw >= 0 && iw < g.W) s9[kh * 3 + kw] += d * rows[kh][iw];
        }
      }
    };
    if (!vec) {
      for (i64 ow = 0; ow < g.OW; ++ow) scalar_at(ow);
      continue;
    }
    for (i64 ow = 0; ow < ir.lo; ++ow) scalar_at(ow);
    for (i64 ow = ir.hi; ow < g.OW; ++ow) scalar_at(ow);
    auto block = [&](i64 ow, V d) {
      for (int kh = 0; kh < 3; ++kh) {
        if (rows[kh] == nullptr) continue;
        const float* q = rows[kh] + ow * S - g.pw;
        if (S == 1) {
          av[kh][0] = vfma(d, vload(q), av[kh][0]);
          av[kh][1] = vfma(d, vload(q + 1), av[kh][1]);
          av[kh][2] = vfma(d, vload(q + 2), av[kh][2]);
        } else {
          V e, o, o2, e2;
          vdeint(q, e, o);
          vdeint(q + 1, o2, e2);
          av[kh][0] = vfma(d, e, av[kh][0]);
          av[kh][1] = vfma(d, o, av[kh][1]);
          av[kh][2] = vfma(d, e2, av[kh][2]);
        }
      }
    };
    i64 ow = ir.lo;
    for (; ow + kVW <= ir.hi; ow += kVW) block(ow, vload(dr + ow));
    if (ow < ir.hi) {  // overlapping last vector with the old lanes of dy zeroed
      alignas(64) float t[kVW];
      const i64 base = ir.hi - kVW;
      for (i64 q = 0; q < kVW; ++q) t[q] = base + q >= ow ? dr[base + q] : 0.0f;
      block(base, vload(t));
    }
  }
  flush9(av, s9);
}

// ---- 3x3 plane kernels on a zero-padded copy ("flat" form), for planes that fit
//
// The input plane is copied into a zero-padded stack buffer of row pitch P
// (>= S*(OW-1) + 3): row ih sits at buffer row ih + ph, column iw at iw + pw.
// Output (oh, ow) is flat position q = oh*P + ow, and its tap (kh, kw) reads
// buffer[S*q + kh*P + kw], so every output -- edges included -- is one
// vectorised multiply-add chain over q (the P - OW columns past each row
// are computed and dropped).
constexpr i64 kFlatMax = 10240;  // floats per stack buffer (40 KB)

struct Flat {
  i64 P, nq, in_size;
};
inline Flat flat_of(i64 S, const Plane& g) {
  Flat f;
  f.P = S * (g.OW - 1) + 3;
  if (f.P < g.W + g.pw) f.P = g.W + g.pw;
  f.nq = (g.OH * f.P + kVW - 1) / kVW * kVW;
  const i64 rows = g.H + g.ph > S * (g.OH - 1) + 3 ? g.H + g.ph : S * (g.OH - 1) + 3;
  const i64 reach = S * f.nq + 2 * f.P + 2 * kVW + 4;
  f.in_size = rows * f.P + 2 * kVW > reach ? rows * f.P + 2 * kVW : reach;
  return f;
}
inline bool flat_fits(i64 S, const Plane& g) {
  const Flat f = flat_of(S, g);
  return g.OW > 0 && g.OH > 0 && f.in_size <= kFlatMax && f.nq + kVW <= kFlatMax;
}

inline void zero_buf(float* b, i64 n) {
  const V z = vset(0.0f);
  i64 i = 0;
  for (; i + kVW <= n; i += kVW) vstore(b + i, z);
  for (; i < n; ++i) b[i] = 0.0f;
}
inline void copy_row(const float* __restrict s, float* __restrict d, i64 n) {
  i64 i = 0;
  for (; i + kVW <= n; i += kVW) vstore(d + i, vload(s + i));
  for (; i < n; ++i) d[i] = s[i];
}
// buf = zero-padded plane x (H x W), pitch P, offsets (ph, pw).
void load_padded(const float* x, const Plane& g, const Flat& f, float* buf) {
  zero_buf(buf, f.in_size);
  const i64 cols = g.W < f.P - g.pw ? g.W : f.P - g.pw;
  for (i64 ih = 0; ih < g.H; ++ih) copy_row(x + ih * g.W, buf + (ih + g.ph) * f.P + g.pw, cols);
}

// The 3x3 correlation of buf at flat positions [q, q + kVW).
template <int S>
inline V flat_taps(const float* buf, i64 P, i64 q, const V* wv) {
  V s = vset(0.0f);
  for (int kh = 0; kh < 3; ++kh) {
    const float* r = buf + S * q + kh * P;
    if (S == 1) {
      s = vfma(wv[3 * kh], vload(r), s);
      s = vfma(wv[3 * kh + 1], vload(r + 1), s);
      s = vfma(wv[3 * kh + 2], vload(r + 2), s);
    } else {
      V e, o, o2, e2;
      vdeint(r, e, o);
      vdeint(r + 1, o2, e2);
      s = vfma(wv[3 * kh], e, s);
      s = vfma(wv[3 * kh + 1], o, s);
      s = vfma(wv[3 * kh + 2], e2, s);
    }
  }
  return s;
}

template <int S>
void flat3_fwd(const float* x, const float* w9, float* y, const Plane& g, float bias, bool acc, Act act) {
  const Flat f = flat_of(S, g);
  alignas(64) float buf[kFlatMax];
  alignas(64) float out[kFlatMax];
  load_padded(x, g, f, buf);
  V wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = vset(w9[t]);
  for (i64 q = 0; q < f.nq; q += kVW) vstore(out + q, flat_taps<S>(buf, f.P, q, wv));
  const V vb = vset(bias);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    const float* s = out + oh * f.P;
    float* d = y + oh * g.OW;
    i64 ow = 0;
    for (; ow + kVW <= g.OW; ow += kVW) vstore(d + ow, actv(vadd(acc ? vload(d + ow) : vb, vload(s + ow)), act));
    for (; ow < g.OW; ++ow) d[ow] = act1((acc ? d[ow] : bias) + s[ow], act);
  }
}

// s9 += per-tap sums of dy * x (dy copied with pitch P, zero past each row).
template <int S>
void flat3_bwd_weight(const float* dy, const float* x, const Plane& g, double* s9) {
  const Flat f = flat_of(S, g);
  alignas(64) float buf[kFlatMax];
  alignas(64) float d[kFlatMax];
  load_padded(x, g, f, buf);
  zero_buf(d, f.nq);
  for (i64 oh = 0; oh < g.OH; ++oh) copy_row(dy + oh * g.OW, d + oh * f.P, g.OW);
  V av[9];
  for (int t = 0; t < 9; ++t) av[t] = vset(0.0f);
  for (i64 q = 0; q < f.nq; q += kVW) {
    if (q % (16 * kVW) == 0 && q > 0)  // bounded float partial sums
      for (int t = 0; t < 9; ++t) {
        s9[t] += hsum(av[t]);
        av[t] = vset(0.0f);
      }
    const V dv = vload(d + q);
    for (int kh = 0; kh < 3; ++kh) {
      const float* r = buf + S * q + kh * f.P;
      if (S == 1) {
        av[3 * kh] = vfma(dv, vload(r), av[3 * kh]);
        av[3 * kh + 1] = vfma(dv, vload(r + 1), av[3 * kh + 1]);
        av[3 * kh + 2] = vfma(dv, vload(r + 2), av[3 * kh + 2]);
      } else {
        V e, o, o2, e2;
        vdeint(r, e, o);
        vdeint(r + 1, o2, e2);
        av[3 * kh] = vfma(dv, e, av[3 * kh]);
        av[3 * kh + 1] = vfma(dv, o, av[3 * kh + 1]);
        av[3 * kh + 2] = vfma(dv, e2, av[3 * kh + 2]);
      }
    }
  }
  for (int t = 0; t < 9; ++t) s9[t] += hsum(av[t]);
}

// Stride-2 input gradient: scatter form on a padded dx buffer (pitch P):
// dxbuf[2q + kh*P + kw] += w[kh, kw] * dy[q], as (even, odd) pairs
// (w0*dy[q] + w2*dy[q-1], w1*dy[q]) at 2q + kh*P.
void flat3_bwd_input_s2(const float* dy, const float* w9, float* dx, const Plane& g, bool acc) {
  const Flat f = flat_of(2, g);
  alignas(64) float dbuf[kFlatMax];  // dy at 1 + q (a zero in front for dy[q-1])
  alignas(64) float xb[kFlatMax];
  zero_buf(dbuf, f.nq + kVW + 1);
  for (i64 oh = 0; oh < g.OH; ++oh) copy_row(dy + oh * g.OW, dbuf + 1 + oh * f.P, g.OW);
  zero_buf(xb, f.in_size);
  for (int kh = 0; kh < 3; ++kh) {
    const V w0 = vset(w9[3 * kh]), w1 = vset(w9[3 * kh + 1]), w2 = vset(w9[3 * kh + 2]);
    for (i64 q = 0; q < f.nq; q += kVW) {
      const V d0 = vload(dbuf + 1 + q), dm = vload(dbuf + q);
      float* p = xb + 2 * q + kh * f.P;
      V pe, po;
      vdeint(p, pe, po);
      vst_int(p, vfma(w2, dm, vfma(w0, d0, pe)), vfma(w1, d0, po));
    }
  }
  for (i64 ih = 0; ih < g.H; ++ih) {
    const float* s = xb + (ih + g.ph) * f.P + g.pw;
    float* d = dx + ih * g.W;
    i64 iw = 0;
    if (acc) {
      for (; iw + kVW <= g.W; iw += kVW) vstore(d + iw, vadd(vload(d + iw), vload(s + iw)));
      for (; iw < g.W; ++iw) d[iw] += s[iw];
    } else {
      copy_row(s, d, g.W);
    }
  }
}

// The 3x3 plane kernels apply: dilation 1, equal strides of 1 or 2.
bool is_3x3_plane(const Conv2dParams& p) {
  return p.KH == 3 && p.KW == 3 && p.dil_h == 1 && p.dil_w == 1 && p.stride_h == p.stride_w &&
         (p.stride_h == 1 || p.stride_h == 2) && p.pad_h >= 0 && p.pad_w >= 0 && p.pad_h <= 2 && p.pad_w <= 2;
}
inline Plane plane_of(const Conv2dParams& p) { return Plane{p.H, p.W, p.OH, p.OW, p.pad_h, p.pad_w}; }

// Measured on AVX-512: the flat form wins for every stride-1 plane that fits;
// at stride 2 it computes ~2x the outputs, so rows of two or more vectors
// (OW >= 2*kVW) are better served by the row form.
#ifndef PK_FLAT_MAX_OW1
#define PK_FLAT_MAX_OW1 (1 << 30)
#endif
#ifndef PK_FLAT_MAX_OW2
#define PK_FLAT_MAX_OW2 (2 * kVW - 1)
#endif
// The flat form where the plane fits its stack buffers and is narrow enough
// that the row form's scalar edges / partial vectors would dominate.
inline bool use_flat(i64 S, const Plane& g) {
  return g.OW <= (S == 1 ? PK_FLAT_MAX_OW1 : PK_FLAT_MAX_OW2) && flat_fits(S, g);
}

void plane3_fwd_any(i64 S, const float* x, const float* w9, float* y, const Plane& g, float bias, bool acc,
                    Act act) {
  if (S == 1)
    use_flat(1, g) ? flat3_fwd<1>(x, w9, y, g, bias, acc, act) : plane3_fwd<1>(x, w9, y, g, bias, acc, act);
  else
    use_flat(2, g) ? flat3_fwd<2>(x, w9, y, g, bias, acc, act) : plane3_fwd<2>(x, w9, y, g, bias, acc, act);
}
void plane3_bwd_weight_any(i64 S, const float* dy, const float* x, const Plane& g, double* s9) {
  if (S == 1)
    use_flat(1, g) ? flat3_bwd_weight<1>(dy, x, g, s9) : plane3_bwd_weight<1>(dy, x, g, s9);
  else
    use_flat(2, g) ? flat3_bwd_weight<2>(dy, x, g, s9) : plane3_bwd_weight<2>(dy, x, g, s9);
}

// dx (H x W) (= or +=) the transposed 3x3 convolution of dy, stride S.
void plane3_bwd_input(i64 S, const float* dy, const float* w9, float* dx, const Plane& g, bool acc) {
  if (S == 2) {
    use_flat(2, g) ? flat3_bwd_input_s2(dy, w9, dx, g, acc) : plane3_bwd_input_s2(dy, w9, dx, g, acc);
    return;
  }
  // stride 1: a forward correlation of dy with the flipped kernel, padding 2 - p.
  float wf[9];
  for (int t = 0; t < 9; ++t) wf[t] = w9[8 - t];
  const Plane t{g.OH, g.OW, g.H, g.W, 2 - g.ph, 2 - g.pw};
  plane3_fwd_any(1, dy, wf, dx, t, 0.0f, acc, Act::None);
}

// Items per parallel chunk so that a chunk holds at least ~32K multiply-adds.
inline i64 grain_for(i64 work_per_item) {
  constexpr i64 kMinWork = 1 << 15;
  return work_per_item >= kMinWork ? 1 : (kMinWork + work_per_item - 1) / (work_per_item < 1 ? 1 : work_per_item);
}

inline void fill_bias(float* yp, i64 n, float v) {
  for (i64 i = 0; i < n; ++i) yp[i] = v;
}

void conv2d_fwd_impl(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  const i64 G = p.groups, Cg = p.C / G, Og = p.O / G;
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW, KHW = p.KH * p.KW;
  if (p.N <= 0 || p.O <= 0) return;
  if (is_3x3_plane(p) && Cg == 1 && Og == 1) {
    // depthwise 3x3: one vectorised pass per output plane
    const Plane g = plane_of(p);
    parallel_for(p.N * p.C, grain_for(9 * OHW), [&](i64 b0, i64 b1) {
      for (i64 pl = b0; pl < b1; ++pl) {
        const i64 c = pl % p.C;
        plane3_fwd_any(p.stride_h, x + pl * HW, w + c * 9, y + pl * OHW, g, b != nullptr ? b[c] : 0.0f, false, act);
      }
    });
    return;
  }
  if (is_pointwise(p)) {
    // y_n[g] [Og, HW] = w[g] [Og, Cg] @ x_n[g] [Cg, HW] (+ bias), one GEMM per image and group
    parallel_for(p.N, grain_for(p.O * Cg * HW), [&](i64 n0, i64 n1) {
      for (i64 g = 0; g < G; ++g) {
        if (b != nullptr)
          for (i64 n = n0; n < n1; ++n)
            for (i64 o = g * Og; o < (g + 1) * Og; ++o) fill_bias(y + (n * p.O + o) * OHW, OHW, b[o]);
        const GemmParams gp{n1 - n0, Og, HW, Cg, false, false, 0, p.C * HW, p.O * HW, b != nullptr ? 1.0f : 0.0f};
        gemm(w + g * Og * Cg, x + (n0 * p.C + g * Cg) * HW, y + (n0 * p.O + g * Og) * HW, gp);
      }
      act_inplace(y + n0 * p.O * OHW, (n1 - n0) * p.O * OHW, act);
    });
    return;
  }
  if (Og >= kGemmMinRows) {
    // y_n[g] [Og, OHW] = w[g] [Og, Cg*KHW] @ im2col(x_n[g]) [Cg*KHW, OHW] (+ bias), per image
    parallel_for(p.N, 1, [&](i64 n0, i64 n1) {
      for (i64 n = n0; n < n1; ++n) {
        for (i64 g = 0; g < G; ++g) {
          float* yg = y + (n * p.O + g * Og) * OHW;
          if (b != nullptr)
            for (i64 o = 0; o < Og; ++o) fill_bias(yg + o * OHW, OHW, b[g * Og + o]);
          const ConvCtx ctx{&p, x + (n * p.C + g * Cg) * HW, nullptr, nullptr};
          const TransposedCtx wt{w + g * Og * Cg * KHW, Cg * KHW};
          detail::gemm_readers(read_transposed, &wt, read_im2col, &ctx, yg, OHW, Og, OHW, Cg * KHW, b != nullptr);
        }
        act_inplace(y + n * p.O * OHW, p.O * OHW, act);
      }
    });
    return;
  }
  if (is_3x3_plane(p)) {
    // few output channels per group: y[n,o] = bias + sum over c of a 3x3 plane pass
    const Plane g = plane_of(p);
    parallel_for(p.N * p.O, grain_for(Cg * 9 * OHW), [&](i64 b0, i64 b1) {
      for (i64 no = b0; no < b1; ++no) {
        const i64 n = no / p.O, o = no % p.O, gi = o / Og;
        for (i64 c = 0; c < Cg; ++c)
          plane3_fwd_any(p.stride_h, x + (n * p.C + gi * Cg + c) * HW, w + (o * Cg + c) * 9, y + no * OHW, g,
                         b != nullptr ? b[o] : 0.0f, c > 0, c == Cg - 1 ? act : Act::None);
      }
    });
    return;
  }
  parallel_for(p.N * p.O, grain_for(Cg * KHW * OHW), [&](i64 b0, i64 b1) {
    for (i64 no = b0; no < b1; ++no) {
      const i64 n = no / p.O, o = no % p.O, g = o / Og;
      float* yp = y + no * OHW;
      fill_bias(yp, OHW, b != nullptr ? b[o] : 0.0f);
      for (i64 c = 0; c < Cg; ++c) {
        const float* xp = x + (n * p.C + g * Cg + c) * HW;
        const float* wp = w + (o * Cg + c) * KHW;
        for (i64 kh = 0; kh < p.KH; ++kh) {
          const i64 off_h = kh * p.dil_h - p.pad_h;
          const Range rh = valid_range(off_h, p.stride_h, p.H, p.OH);
          for (i64 kw = 0; kw < p.KW; ++kw) {
            const i64 off_w = kw * p.dil_w - p.pad_w;
            const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
            const float wv = wp[kh * p.KW + kw];
            for (i64 oh = rh.lo; oh < rh.hi; ++oh) {
              const float* xrow = xp + (oh * p.stride_h + off_h) * p.W + (rw.lo * p.stride_w + off_w);
              axpy(rw.hi - rw.lo, wv, xrow, p.stride_w, yp + oh * p.OW + rw.lo);
            }
          }
        }
      }
      act_inplace(yp, OHW, act);
    }
  });
}

}  // namespace

// y[n,o] = b[o] + sum over the group's input channels and taps of w * x.
void conv2d_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p) {
  conv2d_fwd_impl(x, w, b, y, p, Act::None);
}

// y = act(conv2d(x, w) + b), the activation applied as y is written.
void conv2d_fwd_act(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  conv2d_fwd_impl(x, w, b, y, p, act);
}

// dx[n,c] = sum over the group's output channels and taps of w * dy (scattered
// back to the input positions each tap read).
void conv2d_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p) {
  const i64 G = p.groups, Cg = p.C / G, Og = p.O / G;
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW, KHW = p.KH * p.KW;
  if (p.N <= 0 || p.C <= 0) return;
  if (is_3x3_plane(p) && Cg == 1 && Og == 1) {
    const Plane g = plane_of(p);
    parallel_for(p.N * p.C, grain_for(9 * HW), [&](i64 b0, i64 b1) {
      for (i64 pl = b0; pl < b1; ++pl)
        plane3_bwd_input(p.stride_h, dy + pl * OHW, w + pl % p.C * 9, dx + pl * HW, g, false);
    });
    return;
  }
  if (is_pointwise(p)) {
    // dx_n[g] [Cg, HW] = w[g]^T [Cg, Og] @ dy_n[g] [Og, HW], one GEMM per image and group
    parallel_for(p.N, grain_for(p.O * Cg * HW), [&](i64 n0, i64 n1) {
      for (i64 g = 0; g < G; ++g) {
        const GemmParams gp{n1 - n0, Cg, HW, Og, true, false, 0, p.O * HW, p.C * HW, 0.0f};
        gemm(w + g * Og * Cg, dy + (n0 * p.O + g * Og) * HW, dx + (n0 * p.C + g * Cg) * HW, gp);
      }
    });
    return;
  }
  if (Cg >= kGemmMinRows) {
    // dx_n[g] [Cg, HW] = w[g]^T [Cg, Og*KHW] @ col2im(dy_n[g]) [Og*KHW, HW], per image
    parallel_for(p.N, 1, [&](i64 n0, i64 n1) {
      for (i64 n = n0; n < n1; ++n)
        for (i64 g = 0; g < G; ++g) {
          const ConvCtx ctx{&p, nullptr, dy + (n * p.O + g * Og) * OHW, w + g * Og * Cg * KHW};
          detail::gemm_readers(read_weight_t, &ctx, read_col2im, &ctx, dx + (n * p.C + g * Cg) * HW, HW, Cg, HW,
                               Og * KHW, false);
        }
    });
    return;
  }
  if (is_3x3_plane(p)) {
    // few input channels per group: dx[n,c] = sum over o of a transposed 3x3 plane pass
    const Plane g = plane_of(p);
    parallel_for(p.N * p.C, grain_for(Og * 9 * HW), [&](i64 b0, i64 b1) {
      for (i64 nc = b0; nc < b1; ++nc) {
        const i64 n = nc / p.C, ci = nc % p.C, gi = ci / Cg, c = ci % Cg;
        for (i64 o = 0; o < Og; ++o)
          plane3_bwd_input(p.stride_h, dy + (n * p.O + gi * Og + o) * OHW, w + ((gi * Og + o) * Cg + c) * 9,
                           dx + nc * HW, g, o > 0);
        if (Og == 0) fill_bias(dx + nc * HW, HW, 0.0f);
      }
    });
    return;
  }
  parallel_for(p.N * p.C, grain_for(Og * KHW * HW), [&](i64 b0, i64 b1) {
    for (i64 nc = b0; nc < b1; ++nc) {
      const i64 n = nc / p.C, ci = nc % p.C;
      const i64 g = ci / Cg, c = ci % Cg;
      float* dxp = dx + nc * HW;
      for (i64 i = 0; i < HW; ++i) dxp[i] = 0.0f;
      for (i64 o = g * Og; o < (g + 1) * Og; ++o) {
        const float* dyp = dy + (n * p.O + o) * OHW;
        const float* wp = w + (o * Cg + c) * KHW;
        for (i64 kh = 0; kh < p.KH; ++kh) {
          const i64 off_h = kh * p.dil_h - p.pad_h;
          const Range rh = valid_range(off_h, p.stride_h, p.H, p.OH);
          for (i64 kw = 0; kw < p.KW; ++kw) {
            const i64 off_w = kw * p.dil_w - p.pad_w;
            const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
            const float wv = wp[kh * p.KW + kw];
            for (i64 oh = rh.lo; oh < rh.hi; ++oh) {
              float* dxrow = dxp + (oh * p.stride_h + off_h) * p.W + (rw.lo * p.stride_w + off_w);
              axpy_scatter(rw.hi - rw.lo, wv, dyp + oh * p.OW + rw.lo, dxrow, p.stride_w);
            }
          }
        }
      }
    }
  });
}

// dw[o, c, kh, kw] for the first k input channels of each group:
//   sum over n, oh, ow of dy[n,o,oh,ow] * x[n, xch, ih, iw],
// where xch = g*(C/groups) + c when x holds all C channels, or c when x was
// already sliced to its first k channels (xc == k, groups == 1).
void conv2d_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc) {
  const i64 G = p.groups, Og = p.O / G;
  const i64 x_group_channels = G == 1 ? 0 : xc / G;  // channel offset of group g in x is g * this
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW, KHW = p.KH * p.KW;
  if (k <= 0) return;
  if (p.N == 0) {  // no images: the gradient is zero
    for (i64 i = 0; i < p.O * k * KHW; ++i) dw[i] = 0.0f;
    return;
  }
  if (is_3x3_plane(p) && Og < kGemmMinRows) {
    // depthwise / few output channels: per (o, c) pair, 9 vectorised sums per image plane
    const Plane g = plane_of(p);
    parallel_for(p.O * k, grain_for(p.N * 9 * OHW), [&](i64 b0, i64 b1) {
      for (i64 oc = b0; oc < b1; ++oc) {
        const i64 o = oc / k, c = oc % k, gi = o / Og;
        double acc[9] = {};
        for (i64 n = 0; n < p.N; ++n)
          plane3_bwd_weight_any(p.stride_h, dy + (n * p.O + o) * OHW, x + (n * xc + gi * x_group_channels + c) * HW,
                                g, acc);
        for (int t = 0; t < 9; ++t) dw[oc * 9 + t] = static_cast<float>(acc[t]);
      }
    });
    return;
  }
  if (is_pointwise(p)) {
    // dw[g] [Og, k] = sum_n dy_n[g] [Og, HW] @ x_n[g, 0:k]^T [HW, k], split over output-channel rows
    for (i64 g = 0; g < G; ++g) {
      parallel_for(Og, grain_for(p.N * k * HW), [&](i64 o0, i64 o1) {
        const float* dyg = dy + (g * Og + o0) * HW;
        const float* xg = x + g * x_group_channels * HW;
        float* dwg = dw + (g * Og + o0) * k;
        GemmParams gp{1, o1 - o0, k, HW, false, true, p.O * HW, xc * HW, 0, 0.0f};
        gemm(dyg, xg, dwg, gp);  // image 0 overwrites
        if (p.N > 1) {
          gp.batch = p.N - 1;
          gp.beta = 1.0f;  // the other images accumulate into the same dw (sc = 0)
          gemm(dyg + p.O * HW, xg + xc * HW, dwg, gp);
        }
      });
    }
    return;
  }
  if (Og >= kGemmMinRows) {
    // dw[g] [Og, k*KHW] = sum_n dy_n[g] [Og, OHW] @ im2col(x_n[g, 0:k])^T [OHW, k*KHW]
    for (i64 g = 0; g < G; ++g)
      parallel_for(Og, grain_for(p.N * k * KHW * OHW), [&](i64 o0, i64 o1) {
        for (i64 n = 0; n < p.N; ++n) {
          const ConvCtx ctx{&p, x + (n * xc + g * x_group_channels) * HW, nullptr, nullptr};
          const TransposedCtx dyt{dy + (n * p.O + g * Og + o0) * OHW, OHW};
          detail::gemm_readers(read_transposed, &dyt, read_im2col_t, &ctx, dw + (g * Og + o0) * k * KHW, k * KHW,
                               o1 - o0, k * KHW, OHW, n > 0);
        }
      });
    return;
  }
  parallel_for(p.O, grain_for(k * KHW * p.N * OHW), [&](i64 o0, i64 o1) {
    for (i64 o = o0; o < o1; ++o) {
      const i64 g = o / Og;
      for (i64 c = 0; c < k; ++c) {
        const i64 xch = g * x_group_channels + c;
        for (i64 kh = 0; kh < p.KH; ++kh) {
          const i64 off_h = kh * p.dil_h - p.pad_h;
          const Range rh = valid_range(off_h, p.stride_h, p.H, p.OH);
          for (i64 kw = 0; kw < p.KW; ++kw) {
            const i64 off_w = kw * p.dil_w - p.pad_w;
            const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
            double acc = 0.0;
            for (i64 n = 0; n < p.N; ++n) {
              const float* dyp = dy + (n * p.O + o) * OHW;
              const float* xp = x + (n * xc + xch) * HW;
              for (i64 oh = rh.lo; oh < rh.hi; ++oh) {
                const float* xrow = xp + (oh * p.stride_h + off_h) * p.W + (rw.lo * p.stride_w + off_w);
                acc += dot(rw.hi - rw.lo, dyp + oh * p.OW + rw.lo, xrow, p.stride_w);
              }
            }
            dw[(o * k + c) * KHW + kh * p.KW + kw] = static_cast<float>(acc);
          }
        }
      }
    }
  });
}

// db[o] = sum over n, oh, ow of dy[n, o, oh, ow] (double accumulation).
void conv2d_bwd_bias(const float* dy, float* db, const Conv2dParams& p) {
  const i64 OHW = p.OH * p.OW;
  parallel_for(p.O, grain_for(p.N * OHW), [&](i64 o0, i64 o1) {
    for (i64 o = o0; o < o1; ++o) {
      double acc = 0.0;
      for (i64 n = 0; n < p.N; ++n) {
        const float* dyp = dy + (n * p.O + o) * OHW;
        for (i64 i = 0; i < OHW; ++i) acc += dyp[i];
      }
      db[o] = static_cast<float>(acc);
    }
  });
}

}  // namespace pk
