// batch_norm.cpp — batch normalisation over x[N, C, S] (S = product of the
// spatial dims), per channel c: train mode (batch statistics, running-stat
// update) and eval mode (running statistics), forward and backward.
// Channel statistics and gradient sums are accumulated in double.
#include <cmath>

#include "pock_kernels.h"

namespace pk {
namespace {

// Sum of x[n, c, :] over n (double).
double channel_sum(const float* x, i64 N, i64 C, i64 S, i64 c) {
  double acc = 0.0;
  for (i64 n = 0; n < N; ++n) {
    const float* xp = x + (n * C + c) * S;
    for (i64 s = 0; s < S; ++s) acc += xp[s];
  }
  return acc;
}

// y[n, c, :] = x * scale + shift.
void channel_affine(const float* x, float* y, i64 N, i64 C, i64 S, i64 c, float scale, float shift) {
  for (i64 n = 0; n < N; ++n) {
    const float* xp = x + (n * C + c) * S;
    float* yp = y + (n * C + c) * S;
    for (i64 s = 0; s < S; ++s) yp[s] = xp[s] * scale + shift;
  }
}

}  // namespace

// Train forward: mean / biased var over (N, S) per channel,
//   y = (x - mean) * invstd * w + b,  invstd = 1/sqrt(var + eps);
// saves save_mean/save_invstd and writes the updated running statistics
//   new_rm = (1-m)*rm + m*mean,  new_rv = (1-m)*rv + m*var*cnt/(cnt-1).
// w, b nullable; new_rm/new_rv may alias rm/rv.  Running statistics are
// skipped when rm/rv or new_rm/new_rv are null (no tracked statistics).
void batch_norm_train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                          float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                          i64 N, i64 C, i64 S, float momentum, float eps) {
  const i64 count = N * S;
  for (i64 c = 0; c < C; ++c) {
    const double mu = count > 0 ? channel_sum(x, N, C, S, c) / static_cast<double>(count) : 0.0;
    double sq = 0.0;
    for (i64 n = 0; n < N; ++n) {
      const float* xp = x + (n * C + c) * S;
      for (i64 s = 0; s < S; ++s) {
        const double d = xp[s] - mu;
        sq += d * d;
      }
    }
    const double var = count > 0 ? sq / static_cast<double>(count) : 0.0;
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    if (save_mean != nullptr) save_mean[c] = static_cast<float>(mu);
    if (save_invstd != nullptr) save_invstd[c] = static_cast<float>(invstd);
    if (rm != nullptr && new_rm != nullptr)
      new_rm[c] = static_cast<float>((1.0 - momentum) * rm[c] + static_cast<double>(momentum) * mu);
    if (rv != nullptr && new_rv != nullptr) {
      // PyTorch rejects a single value per channel in training; use the biased var then.
      const double unbiased = count > 1 ? sq / static_cast<double>(count - 1) : var;
      new_rv[c] = static_cast<float>((1.0 - momentum) * rv[c] + static_cast<double>(momentum) * unbiased);
    }
    const double scale = invstd * (w != nullptr ? w[c] : 1.0f);
    const double shift = (b != nullptr ? b[c] : 0.0f) - mu * scale;
    channel_affine(x, y, N, C, S, c, static_cast<float>(scale), static_cast<float>(shift));
  }
}

// Train backward, with xhat = (x - mean) * invstd and cnt = N*S per channel:
//   dx = w * invstd * (dy - sum(dy)/cnt - xhat * sum(dy*xhat)/cnt)
//   dw = sum(dy * xhat),  db = sum(dy).
// w nullable (= 1); dx, dw, db nullable (not wanted).
void batch_norm_train_bwd(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S) {
  const i64 count = N * S;
  for (i64 c = 0; c < C; ++c) {
    const float mu = save_mean[c], invstd = save_invstd[c];
    double sum_dy = 0.0, sum_dy_xmu = 0.0;
    for (i64 n = 0; n < N; ++n) {
      const float* dyp = dy + (n * C + c) * S;
      const float* xp = x + (n * C + c) * S;
      for (i64 s = 0; s < S; ++s) {
        sum_dy += dyp[s];
        sum_dy_xmu += static_cast<double>(dyp[s]) * (xp[s] - mu);
      }
    }
    const double sum_dy_xhat = sum_dy_xmu * invstd;
    if (dw != nullptr) dw[c] = static_cast<float>(sum_dy_xhat);
    if (db != nullptr) db[c] = static_cast<float>(sum_dy);
    if (dx == nullptr || count == 0) continue;
    const float wc = w != nullptr ? w[c] : 1.0f;
    const float mean_dy = static_cast<float>(sum_dy / static_cast<double>(count));
    // xhat * sum(dy*xhat)/cnt = (x - mean) * k with k = invstd^2 * sum(dy*(x-mean))/cnt
    const float k = static_cast<float>(sum_dy_xmu / static_cast<double>(count) * invstd * invstd);
    const float gain = wc * invstd;
    for (i64 n = 0; n < N; ++n) {
      const float* dyp = dy + (n * C + c) * S;
      const float* xp = x + (n * C + c) * S;
      float* dxp = dx + (n * C + c) * S;
      for (i64 s = 0; s < S; ++s) dxp[s] = (dyp[s] - mean_dy - (xp[s] - mu) * k) * gain;
    }
  }
}

// Eval forward: y = (x - rm) * invstd * w + b with invstd = 1/sqrt(rv + eps).
void batch_norm_eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                         float* y, i64 N, i64 C, i64 S, float eps) {
  for (i64 c = 0; c < C; ++c) {
    const float invstd = 1.0f / std::sqrt(rv[c] + eps);
    const float scale = invstd * (w != nullptr ? w[c] : 1.0f);
    const float shift = (b != nullptr ? b[c] : 0.0f) - rm[c] * scale;
    channel_affine(x, y, N, C, S, c, scale, shift);
  }
}

// Eval backward (statistics are constants):
//   dx = dy * w * invstd;  dw = sum dy * (x - rm) * invstd;  db = sum dy.
// w nullable (= 1); dx, dw, db nullable.
void batch_norm_eval_bwd(const float* dy, const float* x, const float* rm, const float* rv, const float* w,
                         float* dx, float* dw, float* db, i64 N, i64 C, i64 S, float eps) {
  for (i64 c = 0; c < C; ++c) {
    const float invstd = 1.0f / std::sqrt(rv[c] + eps);
    if (dx != nullptr) {
      const float gain = invstd * (w != nullptr ? w[c] : 1.0f);
      for (i64 n = 0; n < N; ++n) {
        const float* dyp = dy + (n * C + c) * S;
        float* dxp = dx + (n * C + c) * S;
        for (i64 s = 0; s < S; ++s) dxp[s] = dyp[s] * gain;
      }
    }
    if (dw != nullptr || db != nullptr) {
      const float m = rm[c];
      double sum_dy = 0.0, sum_dy_xmu = 0.0;
      for (i64 n = 0; n < N; ++n) {
        const float* dyp = dy + (n * C + c) * S;
        const float* xp = x + (n * C + c) * S;
        for (i64 s = 0; s < S; ++s) {
          sum_dy += dyp[s];
          sum_dy_xmu += static_cast<double>(dyp[s]) * (xp[s] - m);
        }
      }
      if (dw != nullptr) dw[c] = static_cast<float>(sum_dy_xmu * invstd);
      if (db != nullptr) db[c] = static_cast<float>(sum_dy);
    }
  }
}

}  // namespace pk
