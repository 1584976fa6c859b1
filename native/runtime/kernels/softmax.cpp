// softmax.cpp — softmax / log_softmax over the middle axis of [outer, dim, inner].
//
// Numerically stable (the row max is subtracted before exp); the sums of
// exponentials are accumulated in double.  inner == 1 walks contiguous rows;
// inner > 1 processes blocks of the inner axis with stack accumulators so the
// loops over the contiguous inner axis vectorize.  Every kernel reads its
// inputs before writing the same position, so y may alias x (and dx dy).
//
// exp is vec_math.h's vexp (Cody-Waite reduction + the Cephes expf polynomial,
// 1 ulp) over the native vector of simd.h (AVX-512, AVX2+FMA, NEON); every
// element of a row goes through the vector code (tails zero-padded).  Row
// maxima and sums use independent lanes.  Threads: the (outer, inner-block) units are split with
// pk::parallel_for; each unit's arithmetic does not depend on the split, so
// results are bit-identical for any thread count.
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

constexpr i64 kBlock = 128;
constexpr i64 kGrain = 1 << 14;  // elements per chunk, at least

inline i64 block_len(i64 inner, i64 j0) { return inner - j0 < kBlock ? inner - j0 : kBlock; }

using fastmath::dot_f64;
using fastmath::sum_f64;
using simd::V;
using simd::vbcast;
using simd::vsub;
using vmath::vexp;

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
      const float m = vmath::vrow_max(xo, dim);
      if (log) {
        const float lse = m + static_cast<float>(std::log(vmath::vsum_exp(xo, dim, m)));
        vmath::map_v(xo, yo, dim, [lse](V v) { return vsub(v, vbcast(lse)); });
      } else {
        const float inv = static_cast<float>(1.0 / vmath::vexp_store_sum(xo, yo, dim, m));
        vmath::map_v(yo, yo, dim, [inv](V v) { return simd::vmul(v, vbcast(inv)); });
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
      vmath::map2_v(xr, mx, t, m, [](V a, V b) { return vexp(vsub(a, b)); });
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
      vmath::map2_v(dy + base, y + base, dx + base, dim,
                    [sf](V g, V v) { return vsub(g, simd::vmul(vexp(v), vbcast(sf))); });
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
      float t[kBlock];
      vmath::map_v(y + r, t, m, [](V v) { return vexp(v); });
      for (i64 j = 0; j < m; ++j) dx[r + j] = dy[r + j] - t[j] * sf[j];
    }
  });
}

}  // namespace pk
