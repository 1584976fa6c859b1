// rnn_math.h — internal to lstm.cpp and gru.cpp (not part of the public
// runtime API): the gate activations, the small row helpers both recurrent
// kernels use, and (gemm_detail.h) the strided GEMM they multiply with.
#pragma once

#include <cmath>
#include <cstring>

#include "gemm_detail.h"
#include "pock_kernels.h"

namespace pk {
namespace rnn {

// c[0:n] += x[0:n]
inline void add_to(float* __restrict c, const float* __restrict x, i64 n) {
  for (i64 j = 0; j < n; ++j) c[j] += x[j];
}

// db[0:N] = sum of the M rows A[r*lda + 0:N]
inline void col_sum(i64 M, i64 N, const float* A, i64 lda, float* db) {
  std::memset(db, 0, sizeof(float) * N);
  for (i64 r = 0; r < M; ++r) add_to(db, A + r * lda, N);
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
// tanh through one expf (libm's tanhf is several times slower); |error| ~ 1e-7
inline float tanh_f(float x) {
  const float e = std::exp(-2.f * std::fabs(x));
  const float t = (1.f - e) / (1.f + e);
  return x < 0.f ? -t : t;
}

}  // namespace rnn
}  // namespace pk
