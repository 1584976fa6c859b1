// conv2d.cpp — 2-D convolution (NCHW, weight [O, C/groups, KH, KW]) and its
// gradients.  Stride, padding, dilation and groups (incl. depthwise) are all
// supported.  Paths:
//   * 1x1, stride 1, pad 0: one GEMM per image and group (pk::gemm, batched);
//   * everything else: a direct loop over kernel taps, where each tap is a
//     run of contiguous (stride 1) or strided multiply-adds over an output row
//     whose valid range is computed up front (no per-element padding checks).
// Depthwise (groups == C == O) is the direct loop with one input channel per
// output channel.  No kernel allocates; there is no im2col scratch.
#include "pock_kernels.h"

namespace pk {
namespace {

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
// so the compiler vectorises it at -O2.
inline void axpy(i64 n, float a, const float* __restrict x, i64 xs, float* __restrict y) {
  if (xs == 1) {
    constexpr int kChunk = 16;
    i64 i = 0;
    for (; i + kChunk <= n; i += kChunk)
      for (int j = 0; j < kChunk; ++j) y[i + j] += a * x[i + j];
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

}  // namespace

// y[n,o] = b[o] + sum over the group's input channels and taps of w * x.
void conv2d_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p) {
  const i64 G = p.groups, Cg = p.C / G, Og = p.O / G;
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  for (i64 n = 0; n < p.N; ++n)
    for (i64 o = 0; o < p.O; ++o) {
      float* yp = y + (n * p.O + o) * OHW;
      const float bias = b != nullptr ? b[o] : 0.0f;
      for (i64 i = 0; i < OHW; ++i) yp[i] = bias;
    }
  if (is_pointwise(p)) {
    // y_n[g] [Og, HW] += w[g] [Og, Cg] @ x_n[g] [Cg, HW], batched over images.
    for (i64 g = 0; g < G; ++g) {
      const GemmParams gp{p.N, Og, HW, Cg, false, false, 0, p.C * HW, p.O * HW, 1.0f};
      gemm(w + g * Og * Cg, x + g * Cg * HW, y + g * Og * HW, gp);
    }
    return;
  }
  const i64 KHW = p.KH * p.KW;
  for (i64 n = 0; n < p.N; ++n)
    for (i64 o = 0; o < p.O; ++o) {
      const i64 g = o / Og;
      float* yp = y + (n * p.O + o) * OHW;
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
              const float* xrow = xp + (oh * p.stride_h + off_h) * p.W + off_w;
              axpy(rw.hi - rw.lo, wv, xrow + rw.lo * p.stride_w, p.stride_w, yp + oh * p.OW + rw.lo);
            }
          }
        }
      }
    }
}

// dx[n,c] = sum over the group's output channels and taps of w * dy (scattered
// back to the input positions each tap read).
void conv2d_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p) {
  const i64 G = p.groups, Cg = p.C / G, Og = p.O / G;
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  if (is_pointwise(p)) {
    // dx_n[g] [Cg, HW] = w[g]^T [Cg, Og] @ dy_n[g] [Og, HW], batched over images.
    for (i64 g = 0; g < G; ++g) {
      const GemmParams gp{p.N, Cg, HW, Og, true, false, 0, p.O * HW, p.C * HW, 0.0f};
      gemm(w + g * Og * Cg, dy + g * Og * HW, dx + g * Cg * HW, gp);
    }
    return;
  }
  const i64 KHW = p.KH * p.KW;
  for (i64 n = 0; n < p.N; ++n)
    for (i64 ci = 0; ci < p.C; ++ci) {
      const i64 g = ci / Cg, c = ci % Cg;
      float* dxp = dx + (n * p.C + ci) * HW;
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
              float* dxrow = dxp + (oh * p.stride_h + off_h) * p.W + off_w;
              axpy_scatter(rw.hi - rw.lo, wv, dyp + oh * p.OW + rw.lo, dxrow + rw.lo * p.stride_w, p.stride_w);
            }
          }
        }
      }
    }
}

// dw[o, c, kh, kw] for the first k input channels of each group:
//   sum over n, oh, ow of dy[n,o,oh,ow] * x[n, xch, ih, iw],
// where xch = g*(C/groups) + c when x holds all C channels, or c when x was
// already sliced to its first k channels (xc == k, groups == 1).
void conv2d_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc) {
  const i64 G = p.groups, Og = p.O / G;
  const i64 x_group_channels = G == 1 ? 0 : xc / G;  // channel offset of group g in x is g * this
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  if (k <= 0) return;
  if (is_pointwise(p)) {
    // dw[g] [Og, k] = sum_n dy_n[g] [Og, HW] @ x_n[g, 0:k]^T [HW, k].
    for (i64 g = 0; g < G; ++g) {
      const float* dyg = dy + g * Og * HW;
      const float* xg = x + g * x_group_channels * HW;
      float* dwg = dw + g * Og * k;
      GemmParams gp{1, Og, k, HW, false, true, p.O * HW, xc * HW, 0, 0.0f};
      gemm(dyg, xg, dwg, gp);  // image 0 overwrites
      if (p.N > 1) {
        gp.batch = p.N - 1;
        gp.beta = 1.0f;  // the other images accumulate into the same dw (sc = 0)
        gemm(dyg + p.O * HW, xg + xc * HW, dwg, gp);
      }
    }
    return;
  }
  const i64 KHW = p.KH * p.KW;
  for (i64 o = 0; o < p.O; ++o) {
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
              const float* xrow = xp + (oh * p.stride_h + off_h) * p.W + off_w;
              acc += dot(rw.hi - rw.lo, dyp + oh * p.OW + rw.lo, xrow + rw.lo * p.stride_w, p.stride_w);
            }
          }
          dw[(o * k + c) * KHW + kh * p.KW + kw] = static_cast<float>(acc);
        }
      }
    }
  }
}

// db[o] = sum over n, oh, ow of dy[n, o, oh, ow] (double accumulation).
void conv2d_bwd_bias(const float* dy, float* db, const Conv2dParams& p) {
  const i64 OHW = p.OH * p.OW;
  for (i64 o = 0; o < p.O; ++o) {
    double acc = 0.0;
    for (i64 n = 0; n < p.N; ++n) {
      const float* dyp = dy + (n * p.O + o) * OHW;
      for (i64 i = 0; i < OHW; ++i) acc += dyp[i];
    }
    db[o] = static_cast<float>(acc);
  }
}

}  // namespace pk
