// layer_norm.cpp — layer normalisation over the last `cols` values of each row,
// forward (saving mean / rstd per row) and backward.  Row statistics and the
// parameter-gradient sums are accumulated in double.
#include <cmath>

#include "pock_kernels.h"

namespace pk {

// y = (x - mean) * rstd * w + b per row; w, b nullable (1 and 0).
// mean[r], rstd[r] = 1/sqrt(biased var + eps) are saved for the backward.
void layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                    i64 rows, i64 cols, float eps) {
  for (i64 r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double sum = 0.0;
    for (i64 c = 0; c < cols; ++c) sum += xr[c];
    const double mu = cols > 0 ? sum / static_cast<double>(cols) : 0.0;
    double sq = 0.0;
    for (i64 c = 0; c < cols; ++c) {
      const double d = xr[c] - mu;
      sq += d * d;
    }
    const double var = cols > 0 ? sq / static_cast<double>(cols) : 0.0;
    const float m = static_cast<float>(mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    if (mean != nullptr) mean[r] = m;
    if (rstd != nullptr) rstd[r] = rs;
    for (i64 c = 0; c < cols; ++c) {
      float v = (xr[c] - m) * rs;
      if (w != nullptr) v *= w[c];
      if (b != nullptr) v += b[c];
      yr[c] = v;
    }
  }
}

// With xhat = (x - mean) * rstd and g = dy * w (w nullable = 1):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (per row)
//   dw[c] = sum_r dy * xhat,  db[c] = sum_r dy            (overwritten)
// dx, dw, db are each nullable (not wanted).
void layer_norm_bwd(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                    float* dx, float* dw, float* db, i64 rows, i64 cols) {
  if (dx != nullptr) {
    const double inv_cols = cols > 0 ? 1.0 / static_cast<double>(cols) : 0.0;
    for (i64 r = 0; r < rows; ++r) {
      const float* dyr = dy + r * cols;
      const float* xr = x + r * cols;
      const float m = mean[r], rs = rstd[r];
      double sum_g = 0.0, sum_gx = 0.0;
      for (i64 c = 0; c < cols; ++c) {
        const float g = w != nullptr ? dyr[c] * w[c] : dyr[c];
        sum_g += g;
        sum_gx += static_cast<double>(g) * ((xr[c] - m) * rs);
      }
      const float mean_g = static_cast<float>(sum_g * inv_cols);
      const float mean_gx = static_cast<float>(sum_gx * inv_cols);
      float* dxr = dx + r * cols;
      for (i64 c = 0; c < cols; ++c) {
        const float g = w != nullptr ? dyr[c] * w[c] : dyr[c];
        const float xhat = (xr[c] - m) * rs;
        dxr[c] = rs * (g - mean_g - xhat * mean_gx);
      }
    }
  }
  if (dw == nullptr && db == nullptr) return;
  // Column sums over rows, one block of columns at a time (stack accumulators).
  constexpr i64 kBlock = 256;
  double acc_w[kBlock], acc_b[kBlock];
  for (i64 c0 = 0; c0 < cols; c0 += kBlock) {
    const i64 nb = cols - c0 < kBlock ? cols - c0 : kBlock;
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
}

}  // namespace pk
