// softmax.cpp — softmax / log_softmax over the middle axis of [outer, dim, inner].
//
// Numerically stable (the row max is subtracted before exp); the sums of
// exponentials are accumulated in double.  inner == 1 walks contiguous rows;
// inner > 1 processes blocks of the inner axis with stack accumulators so the
// loops over the contiguous inner axis vectorize.  Every kernel reads its
// inputs before writing the same position, so y may alias x (and dx dy).
//
// exp is fast_exp from fast_math.h (Cody-Waite reduction + the Cephes expf polynomial,
// 1 ulp, branch-free so the loops vectorize; the same function as in
// activation.cpp).  Row maxima and double sums use independent lanes so they
// vectorize too.  Threads: the (outer, inner-block) units are split with
// pk::parallel_for; each unit's arithmetic does not depend on the split, so
// results are bit-identical for any thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fast_math.h"
#include "pock_kernels.h"
#include "pock_parallel.h"
#include "row_reduce.h"

namespace pk {

namespace {

constexpr i64 kBlock = 128;
constexpr i64 kGrain = 1 << 14;  // elements per chunk, at least
constexpr i64 kTmp = 256;        // stack chunk for log-softmax exponentials

inline i64 block_len(i64 inner, i64 j0) { return inner - j0 < kBlock ? inner - j0 : kBlock; }

using fastmath::dot_f64;
using fastmath::fast_exp;
using fastmath::row_max;
using fastmath::sum_f64;

// Column max over dim for a block of `m` inner positions (stride `inner`).
inline void block_max(const float* x, float* mx, i64 dim, i64 inner, i64 m) {
  for (i64 j = 0; j < m; ++j) mx[j] = -std::numeric_limits<float>::infinity();
  for (i64 d = 0; d < dim; ++d) {
    const float* xr = x + d * inner;
    for (i64 j = 0; j < m; ++j) mx[j] = xr[j] > mx[j] ? xr[j] : mx[j];
  }
}

// f(o, j0) for every unit (row o, inner block starting at j0), threaded.
template <class F>
void for_units(i64 outer, i64 dim, i64 inner, F&& f) {
  const i64 nblk = (inner + kBlock - 1) / kBlock;
  const i64 unit = dim * (inner < kBlock ? inner : kBlock);  // elements per unit
  const i64 grain = unit >= kGrain ? 1 : kGrain / (unit > 0 ? unit : 1);
  parallel_for(outer * nblk, grain, [&](i64 b, i64 e) {
    for (i64 u = b; u < e; ++u) f(u / nblk, (u % nblk) * kBlock);
  });
}

// Shared forward: log == false -> softmax, log == true -> log_softmax.
void softmax_impl(const float* x, float* y, i64 outer, i64 dim, i64 inner, bool log) {
  if (dim == 0 || inner == 0) return;
  for_units(outer, dim, inner, [&](i64 o, i64 j0) {
    const float* xo = x + o * dim * inner;
    float* yo = y + o * dim * inner;
    if (inner == 1) {
      const float m = row_max(xo, dim);
      if (log) {
        float t[kTmp];  // exponentials go through the stack: y may alias x
        double s = 0;
        for (i64 d0 = 0; d0 < dim; d0 += kTmp) {
          const i64 nd = dim - d0 < kTmp ? dim - d0 : kTmp;
          for (i64 d = 0; d < nd; ++d) t[d] = fast_exp(xo[d0 + d] - m);
          s += sum_f64(t, nd);
        }
        const float lse = m + static_cast<float>(std::log(s));
        for (i64 d = 0; d < dim; ++d) yo[d] = xo[d] - lse;
      } else {
        for (i64 d = 0; d < dim; ++d) yo[d] = fast_exp(xo[d] - m);
        const float inv = static_cast<float>(1.0 / sum_f64(yo, dim));
        for (i64 d = 0; d < dim; ++d) yo[d] *= inv;
      }
      return;
    }
    float mx[kBlock];
    double s[kBlock];
    const i64 m = block_len(inner, j0);
    const float* xb = xo + j0;
    float* yb = yo + j0;
    block_max(xb, mx, dim, inner, m);
    for (i64 j = 0; j < m; ++j) s[j] = 0;
    for (i64 d = 0; d < dim; ++d) {
      const float* xr = xb + d * inner;
      float* yr = yb + d * inner;
      float t[kBlock];
      for (i64 j = 0; j < m; ++j) t[j] = fast_exp(xr[j] - mx[j]);
      if (!log)
        for (i64 j = 0; j < m; ++j) yr[j] = t[j];
      for (i64 j = 0; j < m; ++j) s[j] += t[j];
    }
    if (log) {
      for (i64 j = 0; j < m; ++j) mx[j] += static_cast<float>(std::log(s[j]));  // mx := logsumexp
      for (i64 d = 0; d < dim; ++d) {
        const float* xr = xb + d * inner;
        float* yr = yb + d * inner;
        for (i64 j = 0; j < m; ++j) yr[j] = xr[j] - mx[j];
      }
    } else {
      for (i64 j = 0; j < m; ++j) mx[j] = static_cast<float>(1.0 / s[j]);  // mx := 1/sum
      for (i64 d = 0; d < dim; ++d) {
        float* yr = yb + d * inner;
        for (i64 j = 0; j < m; ++j) yr[j] *= mx[j];
      }
    }
  });
}

}  // namespace

// y = exp(x - max) / sum exp(x - max) over dim.
void softmax_fwd(const float* x, float* y, i64 outer, i64 dim, i64 inner) {
  softmax_impl(x, y, outer, dim, inner, false);
}

// y = x - max - log(sum exp(x - max)) over dim.
void log_softmax_fwd(const float* x, float* y, i64 outer, i64 dim, i64 inner) {
  softmax_impl(x, y, outer, dim, inner, true);
}

// dx = y * (dy - sum_dim(dy * y)).
void softmax_bwd(const float* dy, const float* y, float* dx, i64 outer, i64 dim, i64 inner) {
  if (dim == 0 || inner == 0) return;
  for_units(outer, dim, inner, [&](i64 o, i64 j0) {
    const i64 base = o * dim * inner;
    if (inner == 1) {
      const float sf = static_cast<float>(dot_f64(dy + base, y + base, dim));
      for (i64 d = 0; d < dim; ++d) dx[base + d] = y[base + d] * (dy[base + d] - sf);
      return;
    }
    const i64 m = block_len(inner, j0);
    double s[kBlock];
    float sf[kBlock];
    for (i64 j = 0; j < m; ++j) s[j] = 0;
    for (i64 d = 0; d < dim; ++d) {
      const i64 r = base + d * inner + j0;
      for (i64 j = 0; j < m; ++j) s[j] += static_cast<double>(dy[r + j]) * y[r + j];
    }
    for (i64 j = 0; j < m; ++j) sf[j] = static_cast<float>(s[j]);
    for (i64 d = 0; d < dim; ++d) {
      const i64 r = base + d * inner + j0;
      for (i64 j = 0; j < m; ++j) dx[r + j] = y[r + j] * (dy[r + j] - sf[j]);
    }
  });
}

// dx = dy - exp(y) * sum_dim(dy)   (y is the log_softmax output).
void log_softmax_bwd(const float* dy, const float* y, float* dx, i64 outer, i64 dim, i64 inner) {
  if (dim == 0 || inner == 0) return;
  for_units(outer, dim, inner, [&](i64 o, i64 j0) {
    const i64 base = o * dim * inner;
    if (inner == 1) {
      const float sf = static_cast<float>(sum_f64(dy + base, dim));
      for (i64 d = 0; d < dim; ++d) dx[base + d] = dy[base + d] - fast_exp(y[base + d]) * sf;
      return;
    }
    const i64 m = block_len(inner, j0);
    double s[kBlock];
    float sf[kBlock];
    for (i64 j = 0; j < m; ++j) s[j] = 0;
    for (i64 d = 0; d < dim; ++d) {
      const i64 r = base + d * inner + j0;
      for (i64 j = 0; j < m; ++j) s[j] += dy[r + j];
    }
    for (i64 j = 0; j < m; ++j) sf[j] = static_cast<float>(s[j]);
    for (i64 d = 0; d < dim; ++d) {
      const i64 r = base + d * inner + j0;
      for (i64 j = 0; j < m; ++j) dx[r + j] = dy[r + j] - fast_exp(y[r + j]) * sf[j];
    }
  });
}

}  // namespace pk
