// conv2d_small_k.cpp — the forward of an ungrouped convolution whose every output
// reads few inputs: K = C*KH*KW <= kSmallK (MobileNetV2's stem, 3 -> 32, 3x3,
// stride 2: K = 27; its 1x1 expansions of 16 and 24 channels).  A GEMM of depth
// K that small spends more on packing its operands (and the stem's im2col) than
// on its multiply-adds, so this kernel skips the packing:
//
//   for each image and block of kCols output positions (flat over OH*OW):
//     col[K][kCols] = the block's im2col (x read in place for a 1x1 convolution:
//                     rows copied; stride-2 rows deinterleaved a vector at a time);
//     for each run of R <= 6 output channels and pair of vectors of positions:
//       R x 2 accumulators = bias, then one multiply-add per tap k (tap order),
//       act applied, stored (a partial vector through a stack tile).
//
// Every output is the same chain (bias, then taps in order) on any number of
// threads: the work is split over (image, position block) only.  Vector code uses
// simd.h's native width (AVX-512 / AVX2+FMA / NEON / portable), one code path.
#include <cstring>

#include "conv_common.h"
#include "pock_parallel.h"

namespace pk {
namespace conv {
namespace {

constexpr i64 kSmallK = 32;
constexpr i64 kCols = 64;  // positions per block: a multiple of 2*kW on every build (kW <= 16)
constexpr int kRows = 6;   // output channels per register tile (12 accumulators)

// col[k][0, kCols) for taps k in [0, K): positions [q0, q0 + nq) of image plane set x
// (C planes of H x W), zero where the tap falls in the padding and past nq.
void fill_col(const float* x, const Conv2dParams& p, i64 q0, i64 nq, float* col) {
  const i64 KHW = p.KH * p.KW, K = p.C * KHW, HW = p.H * p.W;
  for (i64 k = 0; k < K; ++k) {
    const i64 c = k / KHW, kh = k % KHW / p.KW, kw = k % p.KW;
    const i64 off_h = kh * p.dil_h - p.pad_h, off_w = kw * p.dil_w - p.pad_w;
    const Range rw = valid_range(off_w, p.stride_w, p.W, p.OW);
    const float* xp = x + c * HW;
    float* out = col + k * kCols;
    i64 oh = q0 / p.OW, ow = q0 % p.OW;
    for (i64 q = 0; q < nq; ow = 0, ++oh) {
      const i64 run = p.OW - ow < nq - q ? p.OW - ow : nq - q;
      float* dst = out + q;
      q += run;
      const i64 ih = oh * p.stride_h + off_h;
      if (ih < 0 || ih >= p.H) {
        std::memset(dst, 0, run * sizeof(float));
        continue;
      }
      const i64 q1 = ow + run;
      const i64 lo = rw.lo < ow ? ow : (rw.lo > q1 ? q1 : rw.lo);
      const i64 hi = rw.hi < lo ? lo : (rw.hi > q1 ? q1 : rw.hi);
      for (i64 j = ow; j < lo; ++j) dst[j - ow] = 0.0f;
      const float* xrow = xp + ih * p.W + off_w;  // xrow[j * stride_w] for j in [lo, hi)
      i64 j = lo;
      if (p.stride_w == 1) {
        std::memcpy(dst + (lo - ow), xrow + lo, (hi - lo) * sizeof(float));
        j = hi;
      } else if (p.stride_w == 2) {
        // even elements of xrow[2j, 2j + 2*kW): inside the row while 2j + off_w + 2*kW <= W
        for (; j + kW <= hi && 2 * j + off_w + 2 * kW <= p.W; j += kW) {
          V e, o;
          vdeint(xrow + 2 * j, e, o);
          vstore(dst + (j - ow), e);
        }
      }
      for (; j < hi; ++j) dst[j - ow] = xrow[j * p.stride_w];
      for (j = hi; j < q1; ++j) dst[j - ow] = 0.0f;
    }
  }
  for (i64 k = 0; k < K; ++k)
    for (i64 q = nq; q < kCols; ++q) col[k * kCols + q] = 0.0f;
}

// y[r][q0 + j] for r < R, j in [0, nq): act(bias[r] + sum over k of w[r*K + k] * col[k][j]).
template <int R>
void tile_rows(const float* col, i64 K, const float* w, const float* bias, float* y, i64 ld, i64 nq, Act act) {
  for (i64 j = 0; j < nq; j += 2 * kW) {
    V a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = vbcast(bias != nullptr ? bias[r] : 0.0f);
    for (i64 k = 0; k < K; ++k) {
      const V c0 = vload(col + k * kCols + j), c1 = vload(col + k * kCols + j + kW);
      for (int r = 0; r < R; ++r) {
        const V wr = vbcast(w[r * K + k]);
        a0[r] = vfma(wr, c0, a0[r]);
        a1[r] = vfma(wr, c1, a1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* yr = y + r * ld + j;
      if (j + 2 * kW <= nq) {
        vstore(yr, actv(a0[r], act));
        vstore(yr + kW, actv(a1[r], act));
      } else {
        alignas(64) float t[2 * kW];
        vstore(t, actv(a0[r], act));
        vstore(t + kW, actv(a1[r], act));
        for (i64 i = 0; i < nq - j; ++i) yr[i] = t[i];
      }
    }
  }
}

}  // namespace

bool small_k_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  const i64 KHW = p.KH * p.KW, K = p.C * KHW, OHW = p.OH * p.OW, HW = p.H * p.W;
  // a 1x1 convolution stays on the GEMM (its rows need no im2col; no faster here)
  if (p.groups != 1 || K > kSmallK || K <= 0 || KHW == 1 || p.O < 8 || OHW <= 0) return false;
  const i64 blocks = (OHW + kCols - 1) / kCols;
  parallel_for(p.N * blocks, grain_for_work(p.O * K * kCols, kMinChunkMacs), [&](i64 t0, i64 t1) {
    alignas(64) float col[kSmallK * kCols];
    for (i64 t = t0; t < t1; ++t) {
      const i64 n = t / blocks, q0 = t % blocks * kCols;
      const i64 nq = OHW - q0 < kCols ? OHW - q0 : kCols;
      fill_col(x + n * p.C * HW, p, q0, nq, col);
      float* yq = y + n * p.O * OHW + q0;
      i64 o = 0;
      for (; o + kRows <= p.O; o += kRows)
        tile_rows<kRows>(col, K, w + o * K, b != nullptr ? b + o : nullptr, yq + o * OHW, OHW, nq, act);
      const float* bo = b != nullptr ? b + o : nullptr;
      switch (p.O - o) {
        case 5: tile_rows<5>(col, K, w + o * K, bo, yq + o * OHW, OHW, nq, act); break;
        case 4: tile_rows<4>(col, K, w + o * K, bo, yq + o * OHW, OHW, nq, act); break;
        case 3: tile_rows<3>(col, K, w + o * K, bo, yq + o * OHW, OHW, nq, act); break;
        case 2: tile_rows<2>(col, K, w + o * K, bo, yq + o * OHW, OHW, nq, act); break;
        case 1: tile_rows<1>(col, K, w + o * K, bo, yq + o * OHW, OHW, nq, act); break;
        default: break;
      }
    }
  });
  return true;
}

}  // namespace conv
}  // namespace pk
