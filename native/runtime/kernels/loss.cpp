// loss.cpp — cross_entropy, nll_loss and mse_loss (reduction="mean"), fwd + bwd.
//
// cross_entropy follows F.cross_entropy with class-index targets:
//   loss = (1-ls) * mean_i(-logp[i,t_i]) + (ls/C) * mean_i(-sum_c logp[i,c])
// where both means run over the rows whose target != ignore_index.
// Deviation from PyTorch: when every target is ignored PyTorch returns NaN
// (0/0); here the loss is 0 and every gradient is 0, so one all-padding batch
// cannot poison the parameters.  Targets outside [0, C) that are not
// ignore_index are invalid input (the generated step checks them first); the
// kernels skip them like ignored rows instead of reading out of bounds and
// return the first such row (-1 when none).
//
// Speed: the row max, the sum of exponentials and the backward's softmax run
// over the native vector of simd.h with vec_math.h's vexp (1 ulp; AVX-512,
// AVX2+FMA and NEON explicitly), each row entirely in vector code.  Threads: rows are split with pk::parallel_for.  The loss sums are
// made deterministic by a fixed partition: the rows (elements for mse) are cut
// into at most kParts parts that depend only on N, each part's partial sum is
// formed in order, and the partials are added in part order, so the result is
// bit-identical for any thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "row_reduce.h"
#include "vec_math.h"

namespace pk {

namespace {

constexpr i64 kGrain = 1 << 14;  // elements per chunk, at least
constexpr i64 kParts = 64;       // fixed partition of a loss sum

inline bool valid_target(int64_t t, i64 C, i64 ignore_index) { return t != ignore_index && t >= 0 && t < C; }

using fastmath::sum_f64;

// log(sum(exp(row))) computed stably: float exponentials summed in float lanes per
// block of 256, the blocks in double.
double row_logsumexp(const float* row, i64 C) {
  const float m = vmath::vrow_max(row, C);
  if (!(m > -std::numeric_limits<float>::infinity())) return m;  // all -inf (or NaN): like log(0) + m
  return m + std::log(vmath::vsum_exp(row, C, m));
}

i64 count_valid(const int64_t* target, i64 N, i64 C, i64 ignore_index) {
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) cnt += valid_target(target[i], C, ignore_index) ? 1 : 0;
  return cnt;
}

// The first i whose target is neither ignore_index nor in [0, C) (what the kernels
// report: such rows are skipped, never read with), -1 when none.
i64 first_invalid(const int64_t* target, i64 N, i64 C, i64 ignore_index) {
  for (i64 i = 0; i < N; ++i)
    if (target[i] != ignore_index && !valid_target(target[i], C, ignore_index)) return i;
  return -1;
}

// The fixed partition of [0, n) into parts (depends on n only): part k is
// [n*k/np, n*(k+1)/np).  f(k, b, e) runs for every part, threaded; returns np.
template <class F>
i64 for_parts(i64 n, i64 cost_per_item, F&& f) {
  const i64 np = n < kParts ? n : kParts;
  if (np <= 0) return 0;
  const i64 part_cost = (n / np) * (cost_per_item > 0 ? cost_per_item : 1);
  const i64 grain = part_cost >= kGrain ? 1 : kGrain / (part_cost > 0 ? part_cost : 1);
  parallel_for(np, grain, [&](i64 k0, i64 k1) {
    for (i64 k = k0; k < k1; ++k) f(k, n * k / np, n * (k + 1) / np);
  });
  return np;
}

}  // namespace

// loss[0] = F.cross_entropy(logits[N,C], target[N], ignore_index, label_smoothing)
i64 cross_entropy_fwd(const float* logits, const int64_t* target, float* loss, i64 N, i64 C,
                      i64 ignore_index, float label_smoothing) {
  double nll_p[kParts], smooth_p[kParts];
  i64 cnt_p[kParts];
  const i64 np = for_parts(N, C, [&](i64 k, i64 b, i64 e) {
    double nll = 0, smooth = 0;
    i64 cnt = 0;
    for (i64 i = b; i < e; ++i) {
      const int64_t t = target[i];
      if (!valid_target(t, C, ignore_index)) continue;
      ++cnt;
      const float* row = logits + i * C;
      const double lse = row_logsumexp(row, C);
      nll += lse - row[t];
      if (label_smoothing != 0.f) smooth += C * lse - sum_f64(row, C);  // -sum_c logp[i,c]
    }
    nll_p[k] = nll;
    smooth_p[k] = smooth;
    cnt_p[k] = cnt;
  });
  double nll = 0, smooth = 0;
  i64 cnt = 0;
  for (i64 k = 0; k < np; ++k) {
    nll += nll_p[k];
    smooth += smooth_p[k];
    cnt += cnt_p[k];
  }
  if (cnt == 0) {  // PyTorch: NaN; we return 0 (see the file comment)
    loss[0] = 0.f;
    return first_invalid(target, N, C, ignore_index);
  }
  const double ls = label_smoothing;
  loss[0] = static_cast<float>(((1.0 - ls) * nll + ls / C * smooth) / cnt);
  return first_invalid(target, N, C, ignore_index);
}

// dlogits[i,c] = dloss/cnt * (softmax[i,c] - (1-ls)*[c==t_i] - ls/C) on valid rows, 0 elsewhere.
i64 cross_entropy_bwd(const float* dloss, const float* logits, const int64_t* target, float* dlogits,
                      i64 N, i64 C, i64 ignore_index, float label_smoothing) {
  const i64 cnt = count_valid(target, N, C, ignore_index);
  const float g = cnt > 0 ? static_cast<float>(static_cast<double>(dloss[0]) / cnt) : 0.f;
  const float off = g * label_smoothing / static_cast<float>(C);
  const float on = g * (1.f - label_smoothing);
  if (C <= 0) return first_invalid(target, N, C, ignore_index);
  const i64 grain = C >= kGrain ? 1 : kGrain / C;
  parallel_for(N, grain, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) {
      const int64_t t = target[i];
      float* d = dlogits + i * C;
      if (cnt == 0 || !valid_target(t, C, ignore_index)) {
        for (i64 c = 0; c < C; ++c) d[c] = 0.f;
        continue;
      }
      // softmax = e^(x - max) / sum: one exp per element, stored, then scaled (d may alias logits)
      const float* row = logits + i * C;
      const float m = vmath::vrow_max(row, C);
      if (!(m > -std::numeric_limits<float>::infinity())) {  // all -inf (or NaN): as softmax does
        vmath::map_v(row, d, C, [m](simd::V v) { return simd::vsub(v, simd::vbcast(m)); });
        d[t] -= on;
        continue;
      }
      const double s = vmath::vexp_store_sum(row, d, C, m);
      const float scale = static_cast<float>(static_cast<double>(g) / s);
      vmath::map_v(d, d, C, [scale, off](simd::V v) {
        return simd::vsub(simd::vmul(v, simd::vbcast(scale)), simd::vbcast(off));
      });
      d[t] -= on;
    }
  });
  return first_invalid(target, N, C, ignore_index);
}

// loss[0] = -mean over valid rows of logp[i, t_i]
i64 nll_loss_fwd(const float* logp, const int64_t* target, float* loss, i64 N, i64 C, i64 ignore_index) {
  double s = 0;
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    if (!valid_target(t, C, ignore_index)) continue;
    ++cnt;
    s -= logp[i * C + t];
  }
  loss[0] = cnt > 0 ? static_cast<float>(s / cnt) : 0.f;  // PyTorch: NaN when cnt == 0
  return first_invalid(target, N, C, ignore_index);
}

// dlogp = 0 except dlogp[i, t_i] = -dloss/cnt on valid rows.
i64 nll_loss_bwd(const float* dloss, const int64_t* target, float* dlogp, i64 N, i64 C, i64 ignore_index) {
  const i64 cnt = count_valid(target, N, C, ignore_index);
  for (i64 i = 0; i < N * C; ++i) dlogp[i] = 0.f;
  if (cnt == 0) return first_invalid(target, N, C, ignore_index);
  const float g = -static_cast<float>(static_cast<double>(dloss[0]) / cnt);
  for (i64 i = 0; i < N; ++i) {
    const int64_t t = target[i];
    if (valid_target(t, C, ignore_index)) dlogp[i * C + t] = g;
  }
  return first_invalid(target, N, C, ignore_index);
}

// loss[0] = mean((a-b)^2), accumulated in double (fixed partition, see the file comment).
void mse_loss_fwd(const float* a, const float* b, float* loss, i64 n) {
  double part[kParts];
  const i64 np = for_parts(n, 1, [&](i64 k, i64 b0, i64 b1) {
    double acc[4] = {0, 0, 0, 0};
    i64 i = b0;
    for (; i + 4 <= b1; i += 4)
      for (int j = 0; j < 4; ++j) {
        const double d = static_cast<double>(a[i + j]) - b[i + j];
        acc[j] += d * d;
      }
    double s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; i < b1; ++i) {
      const double d = static_cast<double>(a[i]) - b[i];
      s += d * d;
    }
    part[k] = s;
  });
  double s = 0;
  for (i64 k = 0; k < np; ++k) s += part[k];
  loss[0] = n > 0 ? static_cast<float>(s / n) : 0.f;
}

// da = dloss * 2 (a-b) / n;  db = -da  (da, db nullable)
void mse_loss_bwd(const float* dloss, const float* a, const float* b, float* da, float* db, i64 n) {
  if (n == 0) return;
  const float g = static_cast<float>(2.0 * dloss[0] / n);
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    if (da && db) {
      for (i64 i = b0; i < b1; ++i) {
        const float v = g * (a[i] - b[i]);
        da[i] = v;
        db[i] = -v;
      }
    } else if (da) {
      for (i64 i = b0; i < b1; ++i) da[i] = g * (a[i] - b[i]);
    } else if (db) {
      for (i64 i = b0; i < b1; ++i) db[i] = -g * (a[i] - b[i]);
    }
  });
}

}  // namespace pk
