// layer_norm.cpp — layer normalisation over the last `cols` values of each row,
// forward (saving mean / rstd per row) and backward.  Row statistics and the
// parameter-gradient sums are accumulated in double (8 independent lanes, so
// the sums vectorize).
//
// Threads (pk::parallel_for): the forward and dx split the rows; dw/db split
// the columns, each column summing over every row in row order.  No value
// depends on the split, so results are bit-identical for any thread count.
#include <cmath>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {

constexpr i64 kGrain = 1 << 14;  // elements per chunk, at least
constexpr i64 kColBlock = 64;    // dw/db columns per unit (stack accumulators)

inline i64 rows_grain(i64 cols) { return cols >= kGrain ? 1 : kGrain / (cols > 0 ? cols : 1); }

inline double lanes_sum(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
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
      double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      i64 c = 0;
      for (; c + 8 <= cols; c += 8)
        for (int j = 0; j < 8; ++j) a[j] += static_cast<double>(xr[c + j]);
      double sum = lanes_sum(a);
      for (; c < cols; ++c) sum += xr[c];
      const double mu = cols > 0 ? sum / static_cast<double>(cols) : 0.0;
      for (int j = 0; j < 8; ++j) a[j] = 0;
      c = 0;
      for (; c + 8 <= cols; c += 8)
        for (int j = 0; j < 8; ++j) {
          const double d = xr[c + j] - mu;
          a[j] += d * d;
        }
      double sq = lanes_sum(a);
      for (; c < cols; ++c) {
        const double d = xr[c] - mu;
        sq += d * d;
      }
      const double var = cols > 0 ? sq / static_cast<double>(cols) : 0.0;
      const float m = static_cast<float>(mu);
      const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      if (mean != nullptr) mean[r] = m;
      if (rstd != nullptr) rstd[r] = rs;
      if (w != nullptr && b != nullptr) {
        for (i64 k = 0; k < cols; ++k) yr[k] = ((xr[k] - m) * rs) * w[k] + b[k];
      } else if (w != nullptr) {
        for (i64 k = 0; k < cols; ++k) yr[k] = ((xr[k] - m) * rs) * w[k];
      } else if (b != nullptr) {
        for (i64 k = 0; k < cols; ++k) yr[k] = (xr[k] - m) * rs + b[k];
      } else {
        for (i64 k = 0; k < cols; ++k) yr[k] = (xr[k] - m) * rs;
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
        const float m = mean[r], rs = rstd[r];
        double ag[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ax[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        i64 c = 0;
        for (; c + 8 <= cols; c += 8)
          for (int j = 0; j < 8; ++j) {
            const float g = w != nullptr ? dyr[c + j] * w[c + j] : dyr[c + j];
            ag[j] += g;
            ax[j] += static_cast<double>(g) * ((xr[c + j] - m) * rs);
          }
        double sum_g = lanes_sum(ag), sum_gx = lanes_sum(ax);
        for (; c < cols; ++c) {
          const float g = w != nullptr ? dyr[c] * w[c] : dyr[c];
          sum_g += g;
          sum_gx += static_cast<double>(g) * ((xr[c] - m) * rs);
        }
        const float mean_g = static_cast<float>(sum_g * inv_cols);
        const float mean_gx = static_cast<float>(sum_gx * inv_cols);
        float* dxr = dx + r * cols;
        if (w != nullptr) {
          for (i64 k = 0; k < cols; ++k) dxr[k] = rs * (dyr[k] * w[k] - mean_g - ((xr[k] - m) * rs) * mean_gx);
        } else {
          for (i64 k = 0; k < cols; ++k) dxr[k] = rs * (dyr[k] - mean_g - ((xr[k] - m) * rs) * mean_gx);
        }
      }
    });
  }
  if (dw == nullptr && db == nullptr) return;
  // Column sums over rows, one block of columns per unit (stack accumulators).
  const i64 nblk = (cols + kColBlock - 1) / kColBlock;
  const i64 unit = rows * kColBlock;
  parallel_for(nblk, unit >= kGrain ? 1 : kGrain / (unit > 0 ? unit : 1), [&](i64 k0, i64 k1) {
    double acc_w[kColBlock], acc_b[kColBlock];
    for (i64 k = k0; k < k1; ++k) {
      const i64 c0 = k * kColBlock;
      const i64 nb = cols - c0 < kColBlock ? cols - c0 : kColBlock;
      for (i64 j = 0; j < nb; ++j) acc_w[j] = acc_b[j] = 0.0;
      for (i64 r = 0; r < rows; ++r) {
        const float* dyr = dy + r * cols + c0;
        const float* xr = x + r * cols + c0;
        const float m = mean[r], rs = rstd[r];
        if (dw != nullptr)
          for (i64 j = 0; j < nb; ++j) acc_w[j] += static_cast<double>(dyr[j] * ((xr[j] - m) * rs));
        if (db != nullptr)
          for (i64 j = 0; j < nb; ++j) acc_b[j] += dyr[j];
      }
      for (i64 j = 0; j < nb; ++j) {
        if (dw != nullptr) dw[c0 + j] = static_cast<float>(acc_w[j]);
        if (db != nullptr) db[c0 + j] = static_cast<float>(acc_b[j]);
      }
    }
  });
}

}  // namespace pk
