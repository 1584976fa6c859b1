// layer_norm.cpp — layer normalisation over the last `cols` values of each row,
// forward (saving mean / rstd per row) and backward, over the native vector of
// simd.h (AVX-512, AVX2+FMA, NEON).  Row statistics are summed in float lanes
// within blocks of 256 columns and the blocks in double; the parameter-gradient
// column sums in float lanes over blocks of 64 rows, the blocks in double, the rows
// streamed in order (one sequential pass over dy and x).  Tails are zero-padded
// through the same vector code.
//
// Threads (pk::parallel_for): the forward and dx split the rows; dw/db split
// the columns, each column summing over every row in row order.  No value
// depends on the split, so results are bit-identical for any thread count.
#include <cmath>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"
#include "vec_rows.h"

namespace pk {

namespace {

using namespace simd;
using vrows::block_sum;
using vrows::kBlk;
using vrows::load_or;
using vrows::row_sum;

constexpr i64 kGrain = kMinChunkElems;  // elements per chunk, at least (pock_parallel.h)
constexpr i64 kColChunk = 512;   // dw/db columns summed at once (stack accumulators; a multiple of kW)
constexpr i64 kColAlign = 64;    // dw/db thread splits fall on multiples of this many columns
constexpr i64 kRowBlock = 64;    // dw/db rows summed in float before the double sum

inline i64 rows_grain(i64 cols) { return cols >= kGrain ? 1 : kGrain / (cols > 0 ? cols : 1); }

// v with the lanes from n on set to 0 (a row's padded tail)
inline V zero_past(V v, i64 n) {
  float t[kW];
  vstore(t, v);
  for (i64 j = n; j < kW; ++j) t[j] = 0.f;
  return vload(t);
}

// Mean and M2 = sum (x - mean)^2 of a row in one pass over memory: each block of kBlk
// columns is summed (float lanes, four accumulators), then, while it is still in L1,
// its squared deviations from its own mean are summed; the blocks are merged in double
// (Chan, Golub & LeVeque's pairwise update).
inline void row_moments(const float* xr, i64 cols, double& mean, double& m2) {
  double n = 0, mu = 0, M2 = 0;
  for (i64 c0 = 0; c0 < cols; c0 += kBlk) {
    const i64 e = cols - c0 < kBlk ? cols : c0 + kBlk;
    const double nb = static_cast<double>(e - c0);
    // summed about the block's first value, so the float lanes add deviations, not magnitudes
    // (a row of 3000 +- 0.01 keeps its variance)
    const float k0 = xr[c0];
    const V vk0 = vbcast(k0);
    const double mb = static_cast<double>(k0) + block_sum(c0, e, [&](i64 c, i64 k) {
                                                  V d = vsub(load_part(xr + c, k), vk0);
                                                  return k < kW ? zero_past(d, k) : d;
                                                }) / nb;
    const V vmb = vbcast(static_cast<float>(mb));
    const double q = block_sum(c0, e, [&](i64 c, i64 k) {
      const V d = vsub(load_part(xr + c, k), vmb);
      return vmul(d, k < kW ? zero_past(d, k) : d);  // padded lanes add 0
    });
    // q is about the float mean: M2 of the block = q - nb * (mb - float(mb))^2
    const double off = mb - static_cast<double>(static_cast<float>(mb));
    const double m2b = q - nb * off * off;
    const double delta = mb - mu, nn = n + nb;
    mu += delta * nb / nn;
    M2 += m2b + delta * delta * n * nb / nn;
    n = nn;
  }
  mean = mu;
  m2 = M2;
}

// One row of the forward: y = (x - mean) * rstd * w + b; returns {mean, rstd}.  A
// function of its own with the row's pointers as plain arguments, so the stores to y
// do not make the compiler reload them (as it did through the lambda's captures).
// `next` (nullable): the next row, fetched into the caches while this one is written
// (a pass that reads no new memory), so its first read does not wait on DRAM alone.
struct RowStats {
  float mean, rstd;
};
RowStats layer_norm_row(const float* __restrict xr, const float* __restrict w, const float* __restrict b,
                        float* __restrict yr, const float* next, i64 cols, float eps) {
  double mu = 0, m2 = 0;
  if (cols > 0) row_moments(xr, cols, mu, m2);
  const float m = static_cast<float>(mu);
  const V vm = vbcast(m);
  const double var = cols > 0 && m2 > 0 ? m2 / static_cast<double>(cols) : 0.0;  // m2 may round below 0
  const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  const V vrs = vbcast(rs);
  i64 c = 0;
  if (w != nullptr && b != nullptr)  // the common affine case: full vectors, no per-vector tests
    for (; c + kW <= cols; c += kW) {
      if (next != nullptr && (c & 15) == 0) __builtin_prefetch(next + c, 0, 2);
      vstore(yr + c, vfma(vmul(vsub(vload(xr + c), vm), vrs), vload(w + c), vload(b + c)));
    }
  for (; c < cols; c += kW) {
    const i64 n = cols - c < kW ? cols - c : kW;
    const V xh = vmul(vsub(load_part(xr + c, n), vm), vrs);
    store_part(yr + c, vfma(xh, load_or(w ? w + c : nullptr, n, 1.f), load_or(b ? b + c : nullptr, n, 0.f)), n);
  }
  return {m, rs};
}

}  // namespace

// y = (x - mean) * rstd * w + b per row; w, b nullable (1 and 0).
// mean[r], rstd[r] = 1/sqrt(biased var + eps) are saved for the backward.
void layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                    i64 rows, i64 cols, float eps) {
  parallel_for(rows, rows_grain(cols), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const RowStats st = layer_norm_row(x + r * cols, w, b, y + r * cols, r + 1 < r1 ? x + (r + 1) * cols : nullptr,
                                         cols, eps);
      if (mean != nullptr) mean[r] = st.mean;
      if (rstd != nullptr) rstd[r] = st.rstd;
    }
  });
}

// With xhat = (x - mean) * rstd and g = dy * w (w nullable = 1):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (per row)
//   dw[c] = sum_r dy * xhat,  db[c] = sum_r dy            (overwritten)
// dx, dw, db are each nullable (not wanted).
void layer_norm_bwd(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                    float* dx, float* dw, float* db, i64 rows, i64 cols) {
  if (dx != nullptr) {
    const double inv_cols = cols > 0 ? 1.0 / static_cast<double>(cols) : 0.0;
    parallel_for(rows, rows_grain(cols), [&](i64 r0, i64 r1) {
      for (i64 r = r0; r < r1; ++r) {
        const float* dyr = dy + r * cols;
        const float* xr = x + r * cols;
        const V vm = vbcast(mean[r]), vrs = vbcast(rstd[r]);
        // padded lanes: dy = 0, so g = 0 and g * xhat = 0
        auto g_at = [&](i64 c, i64 n) { return vmul(load_part(dyr + c, n), load_or(w ? w + c : nullptr, n, 1.f)); };
        const double sum_g = row_sum(cols, g_at);
        const double sum_gx = row_sum(cols, [&](i64 c, i64 n) {
          return vmul(g_at(c, n), vmul(vsub(load_part(xr + c, n), vm), vrs));
        });
        const V mean_g = vbcast(static_cast<float>(sum_g * inv_cols));
        const V mean_gx = vbcast(static_cast<float>(sum_gx * inv_cols));
        float* dxr = dx + r * cols;
        for (i64 c = 0; c < cols; c += kW) {
          const i64 n = cols - c < kW ? cols - c : kW;
          const V xh = vmul(vsub(load_part(xr + c, n), vm), vrs);
          // rs * (g - mean_g - xhat * mean_gx)
          store_part(dxr + c, vmul(vrs, vsub(vsub(g_at(c, n), mean_g), vmul(xh, mean_gx))), n);
        }
      }
    });
  }
  if (dw == nullptr && db == nullptr) return;
  // Column sums over rows, kColChunk columns at a time: the rows stream through memory in
  // order, each adding its g and g * xhat to the float partial sums of the current block
  // of kRowBlock rows (L1 arrays), which are then added into double accumulators.
  const i64 cgrain = (grain_for_work(rows, kGrain) + kColAlign - 1) / kColAlign * kColAlign;
  parallel_for_aligned(cols, cgrain, kColAlign, [&](i64 cb, i64 ce) {
    alignas(64) float pw[kColChunk], pb[kColChunk];
    double acc_w[kColChunk], acc_b[kColChunk];
    for (i64 c0 = cb; c0 < ce; c0 += kColChunk) {
      const i64 nb = ce - c0 < kColChunk ? ce - c0 : kColChunk;
      for (i64 j = 0; j < nb; ++j) acc_w[j] = acc_b[j] = 0.0;
      for (i64 rb = 0; rb < rows; rb += kRowBlock) {
        const i64 re = rows - rb < kRowBlock ? rows : rb + kRowBlock;
        for (i64 j = 0; j < kColChunk; ++j) pw[j] = pb[j] = 0.f;
        for (i64 r = rb; r < re; ++r) {
          const float* dyr = dy + r * cols + c0;
          const float* xr = x + r * cols + c0;
          const V vm = vbcast(mean[r]), vrs = vbcast(rstd[r]);
          for (i64 c = 0; c < nb; c += kW) {  // the tail vector is zero-padded (g = 0)
            const i64 n = nb - c < kW ? nb - c : kW;
            const V g = load_part(dyr + c, n);
            vstore(pw + c, vfma(g, vmul(vsub(load_part(xr + c, n), vm), vrs), vload(pw + c)));
            vstore(pb + c, vadd(vload(pb + c), g));
          }
        }
        for (i64 j = 0; j < nb; ++j) {
          acc_w[j] += pw[j];
          acc_b[j] += pb[j];
        }
      }
      for (i64 j = 0; j < nb; ++j) {
        if (dw != nullptr) dw[c0 + j] = static_cast<float>(acc_w[j]);
        if (db != nullptr) db[c0 + j] = static_cast<float>(acc_b[j]);
      }
    }
  });
}

}  // namespace pk
