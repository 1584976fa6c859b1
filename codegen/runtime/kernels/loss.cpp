// loss.cpp — cross_entropy, nll_loss and mse_loss (reduction="mean"), fwd + bwd.
//
// cross_entropy follows F.cross_entropy with class-index targets:
//   loss = (1-ls) * mean_i(-logp[i,t_i]) + (ls/C) * mean_i(-sum_c logp[i,c])
// where both means run over the rows whose target != ignore_index.
// Deviation from PyTorch: when every target is ignored PyTorch returns NaN
// (0/0); here the loss is 0 and every gradient is 0, so one all-padding batch
// cannot poison the parameters.  Targets outside [0, C) that are not
// ignore_index are invalid input (the C API validates them); they are skipped
// like ignored rows instead of reading out of bounds.
#include <cmath>

#include "pock_kernels.h"

namespace pk {

namespace {

inline bool valid_target(int64_t t, i64 C, i64 ignore_index) { return t != ignore_index && t >= 0 && t < C; }

// log(sum(exp(row))) computed stably, in double.
double row_logsumexp(const float* row, i64 C) {
  float m = row[0];
  for (i64 c = 1; c < C; ++c) m = row[c] > m ? row[c] : m;
  double s = 0;
  for (i64 c = 0; c < C; ++c) s += std::exp(static_cast<double>(row[c]) - m);
  return m + std::log(s);
}

i64 count_valid(const int64_t* target, i64 N, i64 C, i64 ignore_index) {
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) cnt += valid_target(target[i], C, ignore_index) ? 1 : 0;
  return cnt;
}

}  // namespace

// loss[0] = F.cross_entropy(logits[N,C], target[N], ignore_index, label_smoothing)
void cross_entropy_fwd(const float* logits, const int64_t* target, float* loss, i64 N, i64 C,
                       i64 ignore_index, float label_smoothing) {
  double nll = 0, smooth = 0;
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    if (!valid_target(t, C, ignore_index)) continue;
    ++cnt;
    const float* row = logits + i * C;
    const double lse = row_logsumexp(row, C);
    nll += lse - row[t];
    if (label_smoothing != 0.f) {
      double sx = 0;
      for (i64 c = 0; c < C; ++c) sx += row[c];
      smooth += C * lse - sx;  // -sum_c logp[i,c]
    }
  }
  if (cnt == 0) {  // PyTorch: NaN; we return 0 (see the file comment)
    loss[0] = 0.f;
    return;
  }
  const double ls = label_smoothing;
  loss[0] = static_cast<float>(((1.0 - ls) * nll + ls / C * smooth) / cnt);
}

// dlogits[i,c] = dloss/cnt * (softmax[i,c] - (1-ls)*[c==t_i] - ls/C) on valid rows, 0 elsewhere.
void cross_entropy_bwd(const float* dloss, const float* logits, const int64_t* target, float* dlogits,
                       i64 N, i64 C, i64 ignore_index, float label_smoothing) {
  const i64 cnt = count_valid(target, N, C, ignore_index);
  const float g = cnt > 0 ? static_cast<float>(static_cast<double>(dloss[0]) / cnt) : 0.f;
  const float off = g * label_smoothing / static_cast<float>(C);
  const float on = g * (1.f - label_smoothing);
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    float* d = dlogits + i * C;
    if (cnt == 0 || !valid_target(t, C, ignore_index)) {
      for (i64 c = 0; c < C; ++c) d[c] = 0.f;
      continue;
    }
    const float* row = logits + i * C;
    const float lse = static_cast<float>(row_logsumexp(row, C));
    for (i64 c = 0; c < C; ++c) d[c] = g * std::exp(row[c] - lse) - off;
    d[t] -= on;
  }
}

// loss[0] = -mean over valid rows of logp[i, t_i]
void nll_loss_fwd(const float* logp, const int64_t* target, float* loss, i64 N, i64 C, i64 ignore_index) {
  double s = 0;
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    if (!valid_target(t, C, ignore_index)) continue;
    ++cnt;
    s -= logp[i * C + t];
  }
  loss[0] = cnt > 0 ? static_cast<float>(s / cnt) : 0.f;  // PyTorch: NaN when cnt == 0
}

// dlogp = 0 except dlogp[i, t_i] = -dloss/cnt on valid rows.
void nll_loss_bwd(const float* dloss, const int64_t* target, float* dlogp, i64 N, i64 C, i64 ignore_index) {
  const i64 cnt = count_valid(target, N, C, ignore_index);
  for (i64 i = 0; i < N * C; ++i) dlogp[i] = 0.f;
  if (cnt == 0) return;
  const float g = -static_cast<float>(static_cast<double>(dloss[0]) / cnt);
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    if (valid_target(t, C, ignore_index)) dlogp[i * C + t] = g;
  }
}

// loss[0] = mean((a-b)^2), accumulated in double.
void mse_loss_fwd(const float* a, const float* b, float* loss, i64 n) {
  double acc[4] = {0, 0, 0, 0};
  i64 i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) {
      const double d = static_cast<double>(a[i + j]) - b[i + j];
      acc[j] += d * d;
    }
  double s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  loss[0] = n > 0 ? static_cast<float>(s / n) : 0.f;
}

// da = dloss * 2 (a-b) / n;  db = -da  (da, db nullable)
void mse_loss_bwd(const float* dloss, const float* a, const float* b, float* da, float* db, i64 n) {
  if (n == 0) return;
  const float g = static_cast<float>(2.0 * dloss[0] / n);
  if (da && db) {
    for (i64 i = 0; i < n; ++i) {
      const float v = g * (a[i] - b[i]);
      da[i] = v;
      db[i] = -v;
    }
  } else if (da) {
    for (i64 i = 0; i < n; ++i) da[i] = g * (a[i] - b[i]);
  } else if (db) {
    for (i64 i = 0; i < n; ++i) db[i] = -g * (a[i] - b[i]);
  }
}

}  // namespace pk
