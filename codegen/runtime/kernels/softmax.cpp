// softmax.cpp — softmax / log_softmax over the middle axis of [outer, dim, inner].
//
// Numerically stable (the row max is subtracted before exp); the sums of
// exponentials are accumulated in double.  inner == 1 walks contiguous rows;
// inner > 1 processes blocks of the inner axis with stack accumulators so the
// loops over the contiguous inner axis vectorize.  Every kernel reads its
// inputs before writing the same position, so y may alias x (and dx dy).
#include <cmath>
#include <limits>

#include "pock_kernels.h"

namespace pk {

namespace {

constexpr i64 kBlock = 128;

inline i64 block_len(i64 inner, i64 j0) { return inner - j0 < kBlock ? inner - j0 : kBlock; }

// Row max of a contiguous row.
inline float row_max(const float* x, i64 n) {
  float m = -std::numeric_limits<float>::infinity();
  for (i64 i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Column max over dim for a block of `m` inner positions (stride `inner`).
inline void block_max(const float* x, float* mx, i64 dim, i64 inner, i64 m) {
  for (i64 j = 0; j < m; ++j) mx[j] = -std::numeric_limits<float>::infinity();
  for (i64 d = 0; d < dim; ++d) {
    const float* xr = x + d * inner;
    for (i64 j = 0; j < m; ++j) mx[j] = xr[j] > mx[j] ? xr[j] : mx[j];
  }
}

// Shared forward: log == false -> softmax, log == true -> log_softmax.
void softmax_impl(const float* x, float* y, i64 outer, i64 dim, i64 inner, bool log) {
  if (dim == 0) return;
  for (i64 o = 0; o < outer; ++o) {
    const float* xo = x + o * dim * inner;
    float* yo = y + o * dim * inner;
    if (inner == 1) {
      const float m = row_max(xo, dim);
      if (log) {
        double s = 0;
        for (i64 d = 0; d < dim; ++d) s += std::exp(xo[d] - m);
        const float lse = m + static_cast<float>(std::log(s));
        for (i64 d = 0; d < dim; ++d) yo[d] = xo[d] - lse;
      } else {
        double s = 0;
        for (i64 d = 0; d < dim; ++d) {
          const float e = std::exp(xo[d] - m);
          yo[d] = e;
          s += e;
        }
        const float inv = static_cast<float>(1.0 / s);
        for (i64 d = 0; d < dim; ++d) yo[d] *= inv;
      }
      continue;
    }
    float mx[kBlock];
    double s[kBlock];
    for (i64 j0 = 0; j0 < inner; j0 += kBlock) {
      const i64 m = block_len(inner, j0);
      const float* xb = xo + j0;
      float* yb = yo + j0;
      block_max(xb, mx, dim, inner, m);
      for (i64 j = 0; j < m; ++j) s[j] = 0;
      for (i64 d = 0; d < dim; ++d) {
        const float* xr = xb + d * inner;
        float* yr = yb + d * inner;
        if (log) {
          for (i64 j = 0; j < m; ++j) s[j] += std::exp(xr[j] - mx[j]);
        } else {
          for (i64 j = 0; j < m; ++j) {
            const float e = std::exp(xr[j] - mx[j]);
            yr[j] = e;
            s[j] += e;
          }
        }
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
    }
  }
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
  for (i64 o = 0; o < outer; ++o) {
    const i64 base = o * dim * inner;
    if (inner == 1) {
      double s = 0;
      for (i64 d = 0; d < dim; ++d) s += static_cast<double>(dy[base + d]) * y[base + d];
      const float sf = static_cast<float>(s);
      for (i64 d = 0; d < dim; ++d) dx[base + d] = y[base + d] * (dy[base + d] - sf);
      continue;
    }
    for (i64 j0 = 0; j0 < inner; j0 += kBlock) {
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
    }
  }
}

// dx = dy - exp(y) * sum_dim(dy)   (y is the log_softmax output).
void log_softmax_bwd(const float* dy, const float* y, float* dx, i64 outer, i64 dim, i64 inner) {
  for (i64 o = 0; o < outer; ++o) {
    const i64 base = o * dim * inner;
    if (inner == 1) {
      double s = 0;
      for (i64 d = 0; d < dim; ++d) s += dy[base + d];
      const float sf = static_cast<float>(s);
      for (i64 d = 0; d < dim; ++d) dx[base + d] = dy[base + d] - std::exp(y[base + d]) * sf;
      continue;
    }
    for (i64 j0 = 0; j0 < inner; j0 += kBlock) {
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
        for (i64 j = 0; j < m; ++j) dx[r + j] = dy[r + j] - std::exp(y[r + j]) * sf[j];
      }
    }
  }
}

}  // namespace pk
