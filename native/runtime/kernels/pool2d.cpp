// pool2d.cpp — max / average / adaptive-average 2-D pooling on NCHW planes,
// forward and backward, following PyTorch's CPU kernels window by window
// (padding, dilation for max pooling, ceil_mode windows that run past the
// input, count_include_pad and divisor_override).  OH/OW come from the
// compiler, computed the PyTorch way.  Every kernel is parallel over the
// N*C planes (pk::parallel_for); the backward kernels zero their own planes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {
namespace {
// Planes per parallel chunk: at least kMinChunkElems elements of work.
inline i64 plane_grain(i64 per_plane) { return grain_for_work(per_plane, kMinChunkElems); }
}  // namespace

// Max pooling.  Window (oh, ow) covers rows oh*sh - ph + i*dh (i < KH), clipped
// to the input as PyTorch does (the first row is advanced by whole dilation
// steps until it is inside).  NaN wins (the last NaN in scan order), ties keep
// the first maximum; idx is the flat h*W + w position inside the plane.  An
// empty window gives -inf and the window's first position, as in PyTorch.
void max_pool2d_fwd(const float* x, float* y, int32_t* idx, const Pool2dParams& p) {
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(OHW * p.KH * p.KW), [&](i64 p0, i64 p1) {
  for (i64 plane = p0; plane < p1; ++plane) {
    const float* xp = x + plane * HW;
    float* yp = y + plane * OHW;
    int32_t* ip = idx + plane * OHW;
    for (i64 oh = 0; oh < p.OH; ++oh) {
      i64 h0 = oh * p.stride_h - p.pad_h;
      const i64 h1 = std::min(h0 + (p.KH - 1) * p.dil_h + 1, p.H);
      while (h0 < 0) h0 += p.dil_h;
      for (i64 ow = 0; ow < p.OW; ++ow) {
        i64 w0 = ow * p.stride_w - p.pad_w;
        const i64 w1 = std::min(w0 + (p.KW - 1) * p.dil_w + 1, p.W);
        while (w0 < 0) w0 += p.dil_w;
        i64 best_index = h0 * p.W + w0;
        float best = -std::numeric_limits<float>::infinity();
        for (i64 h = h0; h < h1; h += p.dil_h)
          for (i64 w = w0; w < w1; w += p.dil_w) {
            const float v = xp[h * p.W + w];
            if (v > best || std::isnan(v)) {
              best = v;
              best_index = h * p.W + w;
            }
          }
        yp[oh * p.OW + ow] = best;
        ip[oh * p.OW + ow] = static_cast<int32_t>(best_index);
      }
    }
  }
  });
}

// dx = 0; dx[plane][idx] += dy for every output (indices outside the plane,
// possible only for empty windows, are skipped).
void max_pool2d_bwd(const float* dy, const int32_t* idx, float* dx, const Pool2dParams& p) {
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(HW + OHW), [&](i64 p0, i64 p1) {
    for (i64 i = p0 * HW; i < p1 * HW; ++i) dx[i] = 0.0f;
    for (i64 plane = p0; plane < p1; ++plane) {
      const float* dyp = dy + plane * OHW;
      const int32_t* ip = idx + plane * OHW;
      float* dxp = dx + plane * HW;
      for (i64 o = 0; o < OHW; ++o) {
        const i64 at = ip[o];
        if (at >= 0 && at < HW) dxp[at] += dyp[o];
      }
    }
  });
}

namespace {

// One average-pooling window, clipped to the input, with PyTorch's divisor.
// (Average pooling has no dilation in PyTorch; dil_h/dil_w are ignored.)
struct AvgWindow {
  i64 h0, h1, w0, w1;  // clipped to the input; empty when h0 >= h1 or w0 >= w1
  float divisor;
};

AvgWindow avg_window(const Pool2dParams& p, i64 oh, i64 ow) {
  i64 h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  i64 h1 = std::min(h0 + p.KH, p.H + p.pad_h), w1 = std::min(w0 + p.KW, p.W + p.pad_w);
  const i64 pool_size = (h1 - h0) * (w1 - w0);  // includes padding, not the ceil_mode overhang
  h0 = std::max<i64>(h0, 0);
  w0 = std::max<i64>(w0, 0);
  h1 = std::min(h1, p.H);
  w1 = std::min(w1, p.W);
  i64 divisor;
  if (p.divisor_override != 0)
    divisor = p.divisor_override;
  else if (p.count_include_pad)
    divisor = pool_size;
  else
    divisor = (h1 - h0) * (w1 - w0);
  return AvgWindow{h0, h1, w0, w1, static_cast<float>(divisor)};
}

}  // namespace

// y = (sum of the clipped window) / divisor; empty windows give 0.
void avg_pool2d_fwd(const float* x, float* y, const Pool2dParams& p) {
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(OHW * p.KH * p.KW), [&](i64 p0, i64 p1) {
  for (i64 plane = p0; plane < p1; ++plane) {
    const float* xp = x + plane * HW;
    float* yp = y + plane * OHW;
    for (i64 oh = 0; oh < p.OH; ++oh)
      for (i64 ow = 0; ow < p.OW; ++ow) {
        const AvgWindow win = avg_window(p, oh, ow);
        if (win.h0 >= win.h1 || win.w0 >= win.w1) {
          yp[oh * p.OW + ow] = 0.0f;
          continue;
        }
        float sum = 0.0f;
        for (i64 h = win.h0; h < win.h1; ++h)
          for (i64 w = win.w0; w < win.w1; ++w) sum += xp[h * p.W + w];
        yp[oh * p.OW + ow] = sum / win.divisor;
      }
  }
  });
}

// dx = 0; every input of a window gets dy / divisor.
void avg_pool2d_bwd(const float* dy, float* dx, const Pool2dParams& p) {
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW;
  parallel_for(p.N * p.C, plane_grain(HW + OHW * p.KH * p.KW), [&](i64 p0, i64 p1) {
  for (i64 i = p0 * HW; i < p1 * HW; ++i) dx[i] = 0.0f;
  for (i64 plane = p0; plane < p1; ++plane) {
    const float* dyp = dy + plane * OHW;
    float* dxp = dx + plane * HW;
    for (i64 oh = 0; oh < p.OH; ++oh)
      for (i64 ow = 0; ow < p.OW; ++ow) {
        const AvgWindow win = avg_window(p, oh, ow);
        if (win.h0 >= win.h1 || win.w0 >= win.w1) continue;
        const float g = dyp[oh * p.OW + ow] / win.divisor;
        for (i64 h = win.h0; h < win.h1; ++h)
          for (i64 w = win.w0; w < win.w1; ++w) dxp[h * p.W + w] += g;
      }
  }
  });
}

namespace {
// PyTorch's adaptive window along one axis: [floor(i*in/out), ceil((i+1)*in/out)).
inline i64 adaptive_start(i64 i, i64 in, i64 out) { return (i * in) / out; }
inline i64 adaptive_end(i64 i, i64 in, i64 out) { return ((i + 1) * in + out - 1) / out; }
}  // namespace

// y = mean of the adaptive window.
void adaptive_avg_pool2d_fwd(const float* x, float* y, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
  parallel_for(N * C, plane_grain(H * W + OH * OW), [&](i64 p0, i64 p1) {
  for (i64 plane = p0; plane < p1; ++plane) {
    const float* xp = x + plane * H * W;
    float* yp = y + plane * OH * OW;
    for (i64 oh = 0; oh < OH; ++oh) {
      const i64 h0 = adaptive_start(oh, H, OH), h1 = adaptive_end(oh, H, OH);
      for (i64 ow = 0; ow < OW; ++ow) {
        const i64 w0 = adaptive_start(ow, W, OW), w1 = adaptive_end(ow, W, OW);
        float sum = 0.0f;
        for (i64 h = h0; h < h1; ++h)
          for (i64 w = w0; w < w1; ++w) sum += xp[h * W + w];
        yp[oh * OW + ow] = sum / static_cast<float>(h1 - h0) / static_cast<float>(w1 - w0);
      }
    }
  }
  });
}

// dx = 0; every input of a window gets dy / window size.
void adaptive_avg_pool2d_bwd(const float* dy, float* dx, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
  parallel_for(N * C, plane_grain(H * W + OH * OW), [&](i64 p0, i64 p1) {
  for (i64 i = p0 * H * W; i < p1 * H * W; ++i) dx[i] = 0.0f;
  for (i64 plane = p0; plane < p1; ++plane) {
    const float* dyp = dy + plane * OH * OW;
    float* dxp = dx + plane * H * W;
    for (i64 oh = 0; oh < OH; ++oh) {
      const i64 h0 = adaptive_start(oh, H, OH), h1 = adaptive_end(oh, H, OH);
      for (i64 ow = 0; ow < OW; ++ow) {
        const i64 w0 = adaptive_start(ow, W, OW), w1 = adaptive_end(ow, W, OW);
        const float g = dyp[oh * OW + ow] / static_cast<float>((h1 - h0) * (w1 - w0));
        for (i64 h = h0; h < h1; ++h)
          for (i64 w = w0; w < w1; ++w) dxp[h * W + w] += g;
      }
    }
  }
  });
}

}  // namespace pk
