// conv2d.cpp — 2-D convolution (NCHW, weight [O, C/groups, KH, KW]) and its
// gradients.  Stride, padding, dilation and groups (incl. depthwise) are all
// supported.  Paths, in order:
//   * ungrouped, C*KH*KW <= 32 taps, kernel larger than 1x1, >= 8 output channels
//     (the stem), forward only: conv2d_small_k.cpp (no packing, no im2col GEMM);
//   * 3x3 depthwise, padding 1, on small planes (<= 16x16, AVX-512): the
//     masked flat form of conv2d_dw_small.cpp;
//   * 3x3, dilation 1, stride 1 or 2, depthwise (groups == C == O): one
//     vectorised pass per image plane (the plane kernels of
//     conv2d_plane3x3.cpp), parallel over N*C planes;
//   * 1x1, stride 1, pad 0: one GEMM per image and group (pk::gemm, the
//     images of a parallel chunk batched in one call); the weight gradient
//     is threaded over pieces fixed by the shape (sum_over_images); on small
//     planes the gradients take the images side by side in one GEMM;
//   * other convolutions whose GEMM would have at least kGemmMinRows rows
//     (output channels per group; input channels per group for the input
//     gradient): an implicit GEMM per image and group, where the im2col
//     (resp. col2im) matrix is generated block by block straight into the
//     GEMM's bounded packing buffers — no scratch memory — parallel over images
//     (the weight gradient: over sum_over_images's pieces);
//   * 3x3 (as above) with few channels per group: sums of the same plane
//     kernels (e.g. the input gradient of a 3-channel stem);
//   * everything else: a direct loop over kernel taps, each tap a run of
//     contiguous (stride 1) or strided multiply-adds over an output row whose
//     valid range is computed up front.
// conv2d_fwd_act applies relu / relu6 as y is written (in the plane kernels)
// or right after each image's GEMM.  No kernel allocates, but for the
// weight gradient's image-group sums and the gradients' side-by-side images: a
// per-thread buffer, made on first use (as gemm.cpp's packing buffer).  The vector code
// uses the native width (conv_common.h: AVX-512 / AVX2+FMA / NEON intrinsics
// behind #if guards, a plain 4-float struct otherwise).
#include <cstring>

#include "conv_common.h"
#include "pock_kernels.h"
#include "pock_parallel.h"
#include "gemm_detail.h"

namespace pk {

using conv::act_inplace;
using conv::im2col_block;
using conv::is_3x3_plane;
using conv::Plane;
using conv::plane3_bwd_input;
using conv::plane3_bwd_weight_any;
using conv::plane3_fwd_any;
using conv::plane_of;
using conv::Range;
using conv::valid_range;
using conv::zero_strided;

namespace {

// Below this many GEMM rows the zero-padded micro-tiles waste most of their
// work and the direct loop is used instead.
constexpr i64 kGemmMinRows = 8;


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

// Forward B = im2col: row (c, kh, kw), column (oh, ow).
void read_im2col(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  im2col_block(ctx.x, *ctx.p, r0, rows, c0, cols, out, ld, 1);
}

// Weight-gradient B = im2col^T: row (oh, ow), column (c, kh, kw).
void read_im2col_t(const void* vctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const auto& ctx = *static_cast<const ConvCtx*>(vctx);
  im2col_block(ctx.x, *ctx.p, c0, cols, r0, rows, out, 1, ld);
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

// Items per parallel chunk so that a chunk holds at least kMinChunkMacs
// multiply-adds (pock_parallel.h): a smaller convolution runs on one thread.
inline i64 grain_for(i64 work_per_item) { return grain_for_work(work_per_item, kMinChunkMacs); }

inline void fill_bias(float* yp, i64 n, float v) {
  for (i64 i = 0; i < n; ++i) yp[i] = v;
}

void conv2d_fwd_impl(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  const i64 G = p.groups, Cg = p.C / G, Og = p.O / G;
  const i64 HW = p.H * p.W, OHW = p.OH * p.OW, KHW = p.KH * p.KW;
  if (p.N <= 0 || p.O <= 0) return;
  if (conv::dw_small_fwd(x, w, b, y, p, act)) return;  // depthwise 3x3 on small planes
  if (conv::small_k_fwd(x, w, b, y, p, act)) return;   // few taps per output (the stem)
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

// ---- the weight gradient as a sum over images of per-image products
//
// product(n, r0, r1, c0, c1, d, ld, acc) writes rows [r0, r1) x columns [c0, c1) of image n's
// product into d (row stride ld), overwriting (acc false) or adding.  The work is cut into
// pieces fixed by the shape, never by the thread count, so every element is the same chain
// of operations on any number of threads:
//   * a small gradient (<= kGroupMaxOut floats): the images in kImageGroups groups, each
//     group summed on one thread into its own buffer (group 0 into dw), the buffers then
//     added in group order;
//   * a larger one: column blocks of kPieceCols (cols_ok; else row blocks of at least
//     kPieceRows rows; a 1x1 convolution on small planes gets here only when its images
//     side by side would pass kConcatMaxFloats), each summed over every image on one
//     thread, so its tiles stay in that core's cache (a GEMM threaded inside, image after image, moved them between
//     the cores' caches every image, repacked B once per row block, and the 4x4-plane
//     layers and the stem ran slower on 2 threads than on 1).
// Within a piece each element is summed in image order exactly as one whole-gradient GEMM
// per image would sum it (the GEMM's chains do not depend on its tiling), so the pieces
// only change where the work runs.
constexpr i64 kGroupMaxOut = i64(1) << 16;
constexpr i64 kImageGroups = 4;
constexpr i64 kPieceCols = 96;  // a multiple of every build's GEMM tile width (12, 16, 32)
constexpr i64 kPieceRows = 24;  // above the GEMM's dot-product rows (<= 8): one path per piece
// A 1x1 convolution's larger gradient from products this shallow (e.g. 4x4 and 8x8 planes)
// is one GEMM over the images laid side by side (conv2d_bwd_weight), when they fit in
// kConcatMaxFloats of scratch.  Its input gradient on such planes likewise, when w^T
// [Cg, Og] is wider than gemm.cpp reads in place (detail::kColMajorInPlace): a GEMM per
// image packed all of w^T for an image's few output columns (MobileNetV2's 4x4
// projections and head).
constexpr i64 kConcatMaxDepth = 64;
constexpr i64 kConcatMaxFloats = i64(1) << 20;

// Whether N images of HW pixels go side by side: shallow per-image products whose `rows`
// planes per image (both operands' together) fit the scratch.
inline bool side_by_side(i64 N, i64 HW, i64 rows) {
  return N > 1 && HW <= kConcatMaxDepth && rows * N * HW <= kConcatMaxFloats;
}

// Per calling thread: the gradients' scratch (image groups' partial sums, images side by
// side), grown on first use.
inline float* scratch_buffer(i64 n) { return detail::thread_scratch<struct ConvScratch>(n); }

// Images side by side: planes [r] of image n (HW floats at img[n] + r * HW, img[n] = base +
// n * stride) <-> columns [n*HW, (n+1)*HW) of row r of side [rows, N*HW]; parallel over images.
void gather_images(const float* base, i64 stride, i64 rows, i64 N, i64 HW, float* side) {
  parallel_for(N, grain_for_work(HW * rows, kMinChunkElems), [&](i64 n0, i64 n1) {
    for (i64 n = n0; n < n1; ++n)
      for (i64 r = 0; r < rows; ++r)
        std::memcpy(side + r * N * HW + n * HW, base + n * stride + r * HW, HW * sizeof(float));
  });
}
void scatter_images(const float* side, i64 rows, i64 N, i64 HW, float* base, i64 stride) {
  parallel_for(N, grain_for_work(HW * rows, kMinChunkElems), [&](i64 n0, i64 n1) {
    for (i64 n = n0; n < n1; ++n)
      for (i64 r = 0; r < rows; ++r)
        std::memcpy(base + n * stride + r * HW, side + r * N * HW + n * HW, HW * sizeof(float));
  });
}

template <class Product>
void sum_over_images(i64 N, i64 rows, i64 cols, i64 depth, bool cols_ok, float* dw, Product&& product) {
  const i64 out = rows * cols;
  const bool big = N * out * depth >= 2 * kMinChunkMacs;  // else every piece on the caller
  if (N >= 2 && out <= kGroupMaxOut) {
    const i64 G = N < kImageGroups ? N : kImageGroups;
    float* part = scratch_buffer((G - 1) * out);
    parallel_for(G, big ? 1 : G, [&](i64 g0, i64 g1) {
      for (i64 g = g0; g < g1; ++g) {
        float* d = g == 0 ? dw : part + (g - 1) * out;
        for (i64 n = N * g / G; n < N * (g + 1) / G; ++n) product(n, 0, rows, 0, cols, d, cols, n > N * g / G);
      }
    });
    for (i64 g = 1; g < G; ++g) {
      const float* s = part + (g - 1) * out;
      for (i64 i = 0; i < out; ++i) dw[i] += s[i];
    }
    return;
  }
  const i64 threads = big && parallel_now() ? num_threads() : 1;
  const bool by_cols = cols_ok && cols >= 2 * kPieceCols;
  i64 pieces = by_cols ? (cols + kPieceCols - 1) / kPieceCols : rows / kPieceRows;
  if (threads <= 1 || pieces < 2) pieces = 1;
  if (!by_cols && pieces > 4 * threads) pieces = 4 * threads;
  parallel_for(pieces, 1, [&](i64 b0, i64 b1) {
    for (i64 b = b0; b < b1; ++b) {
      i64 r0 = 0, r1 = rows, c0 = 0, c1 = cols;
      if (pieces > 1 && by_cols) {
        c0 = b * kPieceCols;
        c1 = cols - c0 < kPieceCols ? cols : c0 + kPieceCols;
      } else if (pieces > 1) {
        r0 = rows * b / pieces;
        r1 = rows * (b + 1) / pieces;
      }
      for (i64 n = 0; n < N; ++n) product(n, r0, r1, c0, c1, dw, cols, n > 0);
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
  if (conv::dw_small_bwd_input(dy, w, dx, p)) return;  // depthwise 3x3 on small planes
  if (is_3x3_plane(p) && Cg == 1 && Og == 1) {
    const Plane g = plane_of(p);
    parallel_for(p.N * p.C, grain_for(9 * HW), [&](i64 b0, i64 b1) {
      for (i64 pl = b0; pl < b1; ++pl)
        plane3_bwd_input(p.stride_h, dy + pl * OHW, w + pl % p.C * 9, dx + pl * HW, g, false);
    });
    return;
  }
  if (is_pointwise(p) && Cg > detail::kColMajorInPlace && side_by_side(p.N, HW, Og + Cg)) {
    // small planes: the images side by side, dx[g] [Cg, N*HW] = w[g]^T @ dy[g] [Og, N*HW] in
    // scratch, so w^T is packed once, not once per image (the same sums, bit for bit)
    const i64 cols = p.N * HW;
    float* dys = scratch_buffer((Og + Cg) * cols);
    float* dxs = dys + Og * cols;
    for (i64 g = 0; g < G; ++g) {
      gather_images(dy + g * Og * HW, p.O * HW, Og, p.N, HW, dys);
      detail::gemm_strided(w + g * Og * Cg, 1, Cg, dys, cols, 1, dxs, cols, Cg, cols, Og, false);
      scatter_images(dxs, Cg, p.N, HW, dx + g * Cg * HW, p.C * HW);
    }
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
  if (conv::dw_small_bwd_weight(dy, x, dw, p, k, xc)) return;  // depthwise 3x3 on small planes
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
    // dw[g] [Og, k] = sum_n dy_n[g] [Og, HW] @ x_n[g, 0:k]^T [HW, k]
    for (i64 g = 0; g < G; ++g) {
      const float* dyg = dy + g * Og * HW;
      const float* xg = x + g * x_group_channels * HW;
      if (Og * k > kGroupMaxOut && side_by_side(p.N, HW, Og + k)) {
        // a large gradient from shallow products (small planes): the images side by side in
        // the depth of one GEMM, [Og, N*HW] @ [N*HW, k], instead of N passes over dw
        const i64 depth = p.N * HW;
        float* a = scratch_buffer((Og + k) * depth);
        float* b = a + Og * depth;
        gather_images(dyg, p.O * HW, Og, p.N, HW, a);
        gather_images(xg, xc * HW, k, p.N, HW, b);
        detail::gemm_strided(a, depth, 1, b, 1, depth, dw + g * Og * k, k, Og, k, depth, false);
        continue;
      }
      sum_over_images(p.N, Og, k, HW, true, dw + g * Og * k,
                      [&](i64 n, i64 r0, i64 r1, i64 c0, i64 c1, float* d, i64 ld, bool acc) {
                        detail::gemm_strided(dyg + n * p.O * HW + r0 * HW, HW, 1, xg + n * xc * HW + c0 * HW, 1, HW,
                                             d + r0 * ld + c0, ld, r1 - r0, c1 - c0, HW, acc);
                      });
    }
    return;
  }
  if (Og >= kGemmMinRows) {
    // dw[g] [Og, k*KHW] = sum_n dy_n[g] [Og, OHW] @ im2col(x_n[g, 0:k])^T [OHW, k*KHW]
    for (i64 g = 0; g < G; ++g)
      sum_over_images(p.N, Og, k * KHW, OHW, false, dw + g * Og * k * KHW,
                      [&](i64 n, i64 r0, i64 r1, i64, i64, float* d, i64 ld, bool acc) {
                        const ConvCtx ctx{&p, x + (n * xc + g * x_group_channels) * HW, nullptr, nullptr};
                        const TransposedCtx dyt{dy + (n * p.O + g * Og + r0) * OHW, OHW};
                        detail::gemm_readers(read_transposed, &dyt, read_im2col_t, &ctx, d + r0 * ld, ld, r1 - r0,
                                             k * KHW, OHW, acc);
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
