// layer_norm.cpp — layer normalisation over the last `cols` values of each row,
// forward (saving mean / rstd per row) and backward, over the native vector of
// simd.h (AVX-512, AVX2+FMA, NEON).  Row statistics are summed in float lanes
// within blocks of 256 columns and the blocks in double; the parameter-gradient
// column sums in float lanes over blocks of 64 rows, the blocks in double.  Tails
// are zero-padded through the same vector code.
//
// Threads (pk::parallel_for): the forward and dx split the rows; dw/db split
// the columns, each column summing over every row in row order.  No value
// depends on the split, so results are bit-identical for any thread count.
#include <cmath>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"

namespace pk {

namespace {

using namespace simd;

constexpr i64 kGrain = kMinChunkElems;  // elements per chunk, at least (pock_parallel.h)
constexpr i64 kColBlock = 64;    // dw/db columns per unit (stack accumulators)
constexpr i64 kRowBlock = 64;    // dw/db rows summed in float before the double sum
constexpr i64 kBlk = 256;        // row-statistics columns summed in float

inline i64 rows_grain(i64 cols) { return cols >= kGrain ? 1 : kGrain / (cols > 0 ? cols : 1); }

inline V load_or(const float* p, i64 n, float dflt) { return p ? load_part(p, n) : vbcast(dflt); }

// Sum over the row of f(c, n), the vector of columns [c, c + n) (n < kW only at the
// end): float lanes per block of kBlk columns, the blocks in double.
template <class F>
inline double row_sum(i64 cols, F&& f) {
  double s = 0;
  for (i64 c0 = 0; c0 < cols; c0 += kBlk) {
    const i64 e = cols - c0 < kBlk ? cols : c0 + kBlk;
    V a = vzero();
    for (i64 c = c0; c < e; c += kW) a = vadd(a, f(c, e - c < kW ? e - c : kW));
    s += static_cast<double>(vsum(a));
  }
  return s;
}

}  // namespace

// y = (x - mean) * rstd * w + b per row; w, b nullable (1 and 0).
// mean[r], rstd[r] = 1/sqrt(biased var + eps) are saved for the backward.
void layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                    i64 rows, i64 cols, float eps) {
  parallel_for(rows, rows_grain(cols), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const double mu = cols > 0 ? row_sum(cols, [&](i64 c, i64 n) { return load_part(xr + c, n); }) / cols : 0.0;
      const float m = static_cast<float>(mu);
      const V vm = vbcast(m);
      const double sq = row_sum(cols, [&](i64 c, i64 n) {
        V d = vsub(load_part(xr + c, n), vm);
        if (n < kW) {  // padded lanes add 0
          float t[kW];
          vstore(t, d);
          for (i64 j = n; j < kW; ++j) t[j] = 0.f;
          d = vload(t);
        }
        return vmul(d, d);
      });
      const double var = cols > 0 ? sq / static_cast<double>(cols) : 0.0;
      const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      if (mean != nullptr) mean[r] = m;
      if (rstd != nullptr) rstd[r] = rs;
      const V vrs = vbcast(rs);
      for (i64 c = 0; c < cols; c += kW) {
        const i64 n = cols - c < kW ? cols - c : kW;
        const V xh = vmul(vsub(load_part(xr + c, n), vm), vrs);
        store_part(yr + c, vfma(xh, load_or(w ? w + c : nullptr, n, 1.f), load_or(b ? b + c : nullptr, n, 0.f)), n);
      }
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
  // Column sums over rows, one block of columns per unit: float vector lanes over
  // kRowBlock rows, then added into double accumulators (stack).
  const i64 nblk = (cols + kColBlock - 1) / kColBlock;
  const i64 unit = rows * kColBlock;
  constexpr int kNV = kColBlock / kW;
  parallel_for(nblk, unit >= kGrain ? 1 : kGrain / (unit > 0 ? unit : 1), [&](i64 k0, i64 k1) {
    double acc_w[kColBlock], acc_b[kColBlock];
    for (i64 k = k0; k < k1; ++k) {
      const i64 c0 = k * kColBlock;
      const i64 nb = cols - c0 < kColBlock ? cols - c0 : kColBlock;
      for (i64 j = 0; j < kColBlock; ++j) acc_w[j] = acc_b[j] = 0.0;
      for (i64 rb = 0; rb < rows; rb += kRowBlock) {
        const i64 re = rows - rb < kRowBlock ? rows : rb + kRowBlock;
        V fw[kNV], fb[kNV];
        for (int v = 0; v < kNV; ++v) fw[v] = fb[v] = vzero();
        for (i64 r = rb; r < re; ++r) {
          const float* dyr = dy + r * cols + c0;
          const float* xr = x + r * cols + c0;
          const V vm = vbcast(mean[r]), vrs = vbcast(rstd[r]);
          for (int v = 0; v < kNV && v * kW < nb; ++v) {
            const i64 n = nb - v * kW < kW ? nb - v * kW : kW;
            const V g = load_part(dyr + v * kW, n);
            fw[v] = vfma(g, vmul(vsub(load_part(xr + v * kW, n), vm), vrs), fw[v]);
            fb[v] = vadd(fb[v], g);
          }
        }
        float tw[kColBlock], tb[kColBlock];
        for (int v = 0; v < kNV; ++v) {
          vstore(tw + v * kW, fw[v]);
          vstore(tb + v * kW, fb[v]);
        }
        for (i64 j = 0; j < nb; ++j) {
          acc_w[j] += tw[j];
          acc_b[j] += tb[j];
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
