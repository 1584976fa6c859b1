// row_reduce.h — internal to loss.cpp, reduce.cpp and softmax.cpp (not part of the public
// runtime API): row reductions over a contiguous float row with independent
// lanes, so they vectorize without -ffast-math, and a result that does not
// depend on how the caller splits its work over threads.
#pragma once

#include <limits>

#include "pock_kernels.h"

namespace pk {
namespace fastmath {

// Row max of a contiguous row (16 lanes; NaN is skipped like the scalar x > m test).
inline float row_max(const float* x, i64 n) {
  constexpr float kNinf = -std::numeric_limits<float>::infinity();
  float a[16];
  for (int j = 0; j < 16; ++j) a[j] = kNinf;
  i64 i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) a[j] = x[i + j] > a[j] ? x[i + j] : a[j];
  float m = kNinf;
  for (int j = 0; j < 16; ++j) m = a[j] > m ? a[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum of x[i] (resp. x[i]*y[i]) in double, 8 lanes.
inline double sum_f64(const float* x, i64 n) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += static_cast<double>(x[i + j]);
  double s = 0;
  for (; i < n; ++i) s += static_cast<double>(x[i]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + s;
}
inline double dot_f64(const float* x, const float* y, i64 n) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += static_cast<double>(x[i + j]) * static_cast<double>(y[i + j]);
  double s = 0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(y[i]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + s;
}

}  // namespace fastmath
}  // namespace pk
