// conv2d_small_k.cpp — the forward of an ungrouped convolution whose every output
// reads few inputs: K = C*KH*KW <= kSmallK (MobileNetV2's stem, 3 -> 32, 3x3,
// stride 2: K = 27).  A GEMM of depth K that small spends more on packing its
// operands (and the stem's im2col) than on its multiply-adds, so this kernel skips
// the packing:
//
//   for each image and block of kCols output positions (flat over OH*OW):
//     col[K][kCols] = the block's im2col (conv_common.h's im2col_block, the one
//                     conv2d.cpp's implicit GEMM reads: stride-2 rows deinterleaved
//                     a vector at a time);
//     for each run of R <= 6 output channels and pair of vectors of positions:
//       R x 2 accumulators = bias, then one multiply-add per tap k (tap order),
//       act applied, stored (a partial vector through store_part).
//
// 1x1 convolutions stay on the GEMM: MobileNetV2's 16 and 24 channel expansions are
// no faster here, and its projections to 16-32 channels with x's rows read in place
// (no packing) were 1.7-1.9x slower (rows H*W apart: 4 KB strides on 32x32 planes,
// AVX2, one thread).
//
// Every output is the same chain (bias, then taps in order) on any number of
// threads: the work is split over (image, position block) only.  Vector code uses
// simd.h's native width (AVX-512 / AVX2+FMA / NEON / portable), one code path.
#include "conv_common.h"
#include "pock_parallel.h"

namespace pk {
namespace conv {
namespace {

constexpr i64 kSmallK = 32;
constexpr i64 kCols = 64;    // positions per block: a multiple of 2*kW on every build (kW <= 16)
constexpr int kRows = 6;     // output channels per register tile (12 accumulators)

// y[r][j] for r < R, j in [0, nq): act(bias[r] + sum over k of w[r*K + k] * col[k*kCols + j])
// (col zero past nq).
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
    const i64 left = nq - j;
    for (int r = 0; r < R; ++r) {
      float* yr = y + r * ld + j;
      if (left >= 2 * kW) {
        vstore(yr, actv(a0[r], act));
        vstore(yr + kW, actv(a1[r], act));
      } else {  // a partial pair: left < 2 * kW
        store_part(yr, actv(a0[r], act), left < kW ? left : kW);
        if (left > kW) store_part(yr + kW, actv(a1[r], act), left - kW);
      }
    }
  }
}

// Every output channel of positions [0, nq) of one block: runs of kRows, then the rest.
void all_rows(const float* col, i64 K, const float* w, const float* bias, float* y, i64 ld, i64 nq, i64 O,
              Act act) {
  i64 o = 0;
  for (; o + kRows <= O; o += kRows)
    tile_rows<kRows>(col, K, w + o * K, bias != nullptr ? bias + o : nullptr, y + o * ld, ld, nq, act);
  const float* bo = bias != nullptr ? bias + o : nullptr;
  switch (O - o) {
    case 5: tile_rows<5>(col, K, w + o * K, bo, y + o * ld, ld, nq, act); break;
    case 4: tile_rows<4>(col, K, w + o * K, bo, y + o * ld, ld, nq, act); break;
    case 3: tile_rows<3>(col, K, w + o * K, bo, y + o * ld, ld, nq, act); break;
    case 2: tile_rows<2>(col, K, w + o * K, bo, y + o * ld, ld, nq, act); break;
    case 1: tile_rows<1>(col, K, w + o * K, bo, y + o * ld, ld, nq, act); break;
    default: break;
  }
}

}  // namespace

bool small_k_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act) {
  const i64 KHW = p.KH * p.KW, K = p.C * KHW, OHW = p.OH * p.OW, HW = p.H * p.W;
  if (p.groups != 1 || K <= 0 || p.O < 8 || OHW <= 0) return false;
  if (K > kSmallK || KHW == 1) return false;  // 1x1 convolutions stay on the GEMM (see the top)
  const i64 blocks = (OHW + kCols - 1) / kCols;
  parallel_for(p.N * blocks, grain_for_work(p.O * K * kCols, kMinChunkMacs), [&](i64 t0, i64 t1) {
    alignas(64) float col[kSmallK * kCols];
    for (i64 t = t0; t < t1; ++t) {
      const i64 n = t / blocks, q0 = t % blocks * kCols;
      const i64 nq = OHW - q0 < kCols ? OHW - q0 : kCols;
      im2col_block(x + n * p.C * HW, p, 0, K, q0, nq, col, kCols, 1);
      if (nq < kCols)
        for (i64 k = 0; k < K; ++k) zero_strided(col + k * kCols + nq, kCols - nq, 1);
      all_rows(col, K, w, b, y + n * p.O * OHW + q0, OHW, nq, p.O, act);
    }
  });
  return true;
}

}  // namespace conv
}  // namespace pk
