// batch_norm.cpp — batch normalisation over x[N, C, S] (S = product of the
// spatial dims), per channel c: train mode (batch statistics, running-stat
// update) and eval mode (running statistics), forward and backward.
// Channel statistics and gradient sums are accumulated per row [n, c, :] in
// 16 float lanes (fixed-size chunks the compiler vectorises) and across rows
// in double.  Every kernel is parallel over channels (pk::parallel_for).
// The *_act forward variants apply relu / relu6 as y is written.
#include <cmath>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {
namespace {

constexpr int kLanes = 16;

// Channels per parallel chunk: at least ~32K elements of work.
inline i64 channel_grain(i64 N, i64 S) {
  const i64 per = N * S < 1 ? 1 : N * S;
  return per >= (1 << 15) ? 1 : ((1 << 15) + per - 1) / per;
}

inline double lanes_total(const float* part) {
  double t = 0.0;
  for (int j = 0; j < kLanes; ++j) t += part[j];
  return t;
}

// sum of p[0:n)
inline double row_sum(const float* __restrict p, i64 n) {
  float part[kLanes] = {};
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += p[i + j];
  double t = lanes_total(part);
  for (; i < n; ++i) t += p[i];
  return t;
}

// sum of (p - m)^2 over p[0:n)
inline double row_sq_dev(const float* __restrict p, i64 n, float m) {
  float part[kLanes] = {};
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float d = p[i + j] - m;
      part[j] += d * d;
    }
  double t = lanes_total(part);
  for (; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - m;
    t += d * d;
  }
  return t;
}

// sum of dy and of dy * (x - m) over [0:n)
inline void row_dy_sums(const float* __restrict dy, const float* __restrict x, i64 n, float m, double& sdy,
                        double& sdyx) {
  float p1[kLanes] = {}, p2[kLanes] = {};
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      p1[j] += dy[i + j];
      p2[j] += dy[i + j] * (x[i + j] - m);
    }
  double a = lanes_total(p1), b = lanes_total(p2);
  for (; i < n; ++i) {
    a += dy[i];
    b += static_cast<double>(dy[i]) * (x[i] - m);
  }
  sdy += a;
  sdyx += b;
}

// y[n, c, :] = act((x - center) * scale + shift). Centering first (rather than folding the mean
// into the shift) keeps the result accurate when |mean| >> std (no cancellation).
void channel_affine(const float* x, float* y, i64 N, i64 C, i64 S, i64 c, float center, float scale, float shift,
                    Act act) {
  for (i64 n = 0; n < N; ++n) {
    const float* __restrict xp = x + (n * C + c) * S;
    float* __restrict yp = y + (n * C + c) * S;
    switch (act) {
      case Act::None:
        for (i64 s = 0; s < S; ++s) yp[s] = (xp[s] - center) * scale + shift;
        break;
      case Act::Relu:
        for (i64 s = 0; s < S; ++s) {
          const float v = (xp[s] - center) * scale + shift;
          yp[s] = v < 0.0f ? 0.0f : v;
        }
        break;
      case Act::Relu6:
        for (i64 s = 0; s < S; ++s) {
          float v = (xp[s] - center) * scale + shift;
          v = v < 0.0f ? 0.0f : v;
          yp[s] = v > 6.0f ? 6.0f : v;
        }
        break;
    }
  }
}

void train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv, float* y,
               float* save_mean, float* save_invstd, float* new_rm, float* new_rv, i64 N, i64 C, i64 S,
               float momentum, float eps, Act act) {
  const i64 count = N * S;
  parallel_for(C, channel_grain(N, S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      double total = 0.0;
      for (i64 n = 0; n < N; ++n) total += row_sum(x + (n * C + c) * S, S);
      const double mu = count > 0 ? total / static_cast<double>(count) : 0.0;
      double sq = 0.0;
      for (i64 n = 0; n < N; ++n) sq += row_sq_dev(x + (n * C + c) * S, S, static_cast<float>(mu));
      // the deviations were taken from mu rounded to float: correct for the offset
      const double off = static_cast<double>(static_cast<float>(mu)) - mu;
      sq -= static_cast<double>(count) * off * off;
      if (sq < 0.0) sq = 0.0;
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
      channel_affine(x, y, N, C, S, c, static_cast<float>(mu), static_cast<float>(scale),
                     b != nullptr ? b[c] : 0.0f, act);
    }
  });
}

void eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv, float* y, i64 N,
              i64 C, i64 S, float eps, Act act) {
  parallel_for(C, channel_grain(N, S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float invstd = 1.0f / std::sqrt(rv[c] + eps);
      const float scale = invstd * (w != nullptr ? w[c] : 1.0f);
      channel_affine(x, y, N, C, S, c, rm[c], scale, b != nullptr ? b[c] : 0.0f, act);
    }
  });
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
  train_fwd(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps, Act::None);
}

// y = act(batch_norm(x)); everything else as batch_norm_train_fwd.
void batch_norm_train_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                              float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                              i64 N, i64 C, i64 S, float momentum, float eps, Act act) {
  train_fwd(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps, act);
}

// Train backward, with xhat = (x - mean) * invstd and cnt = N*S per channel:
//   dx = w * invstd * (dy - sum(dy)/cnt - xhat * sum(dy*xhat)/cnt)
//   dw = sum(dy * xhat),  db = sum(dy).
// w nullable (= 1); dx, dw, db nullable (not wanted).
void batch_norm_train_bwd(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S) {
  const i64 count = N * S;
  parallel_for(C, channel_grain(N, 2 * S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float mu = save_mean[c], invstd = save_invstd[c];
      double sum_dy = 0.0, sum_dy_xmu = 0.0;
      for (i64 n = 0; n < N; ++n) row_dy_sums(dy + (n * C + c) * S, x + (n * C + c) * S, S, mu, sum_dy, sum_dy_xmu);
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
        const float* __restrict dyp = dy + (n * C + c) * S;
        const float* __restrict xp = x + (n * C + c) * S;
        float* __restrict dxp = dx + (n * C + c) * S;
        for (i64 s = 0; s < S; ++s) dxp[s] = (dyp[s] - mean_dy - (xp[s] - mu) * k) * gain;
      }
    }
  });
}

// Eval forward: y = (x - rm) * invstd * w + b with invstd = 1/sqrt(rv + eps).
void batch_norm_eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                         float* y, i64 N, i64 C, i64 S, float eps) {
  eval_fwd(x, w, b, rm, rv, y, N, C, S, eps, Act::None);
}

// y = act(eval batch_norm(x)).
void batch_norm_eval_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                             float* y, i64 N, i64 C, i64 S, float eps, Act act) {
  eval_fwd(x, w, b, rm, rv, y, N, C, S, eps, act);
}

// Eval backward (statistics are constants):
//   dx = dy * w * invstd;  dw = sum dy * (x - rm) * invstd;  db = sum dy.
// w nullable (= 1); dx, dw, db nullable.
void batch_norm_eval_bwd(const float* dy, const float* x, const float* rm, const float* rv, const float* w,
                         float* dx, float* dw, float* db, i64 N, i64 C, i64 S, float eps) {
  parallel_for(C, channel_grain(N, 2 * S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float invstd = 1.0f / std::sqrt(rv[c] + eps);
      if (dx != nullptr) {
        const float gain = invstd * (w != nullptr ? w[c] : 1.0f);
        for (i64 n = 0; n < N; ++n) {
          const float* __restrict dyp = dy + (n * C + c) * S;
          float* __restrict dxp = dx + (n * C + c) * S;
          for (i64 s = 0; s < S; ++s) dxp[s] = dyp[s] * gain;
        }
      }
      if (dw != nullptr || db != nullptr) {
        double sum_dy = 0.0, sum_dy_xmu = 0.0;
        for (i64 n = 0; n < N; ++n)
          row_dy_sums(dy + (n * C + c) * S, x + (n * C + c) * S, S, rm[c], sum_dy, sum_dy_xmu);
        if (dw != nullptr) dw[c] = static_cast<float>(sum_dy_xmu * invstd);
        if (db != nullptr) db[c] = static_cast<float>(sum_dy);
      }
    }
  });
}

}  // namespace pk
