// vec_rows.h — internal to the kernels (not part of the public runtime API): load_or and sums along
// a contiguous row over the native vector V of simd.h, for the norms (layer_norm.cpp,
// rms_norm.cpp).  Float lanes within blocks of kBlk columns, the blocks added in
// double: accurate (at most kBlk / kW terms per float lane) and a fixed order, so a
// row's sum does not depend on how its caller splits the rows over threads.
#pragma once

#include "pock_kernels.h"
#include "simd.h"

namespace pk {
namespace vrows {

using simd::kW;
using simd::V;

constexpr i64 kBlk = 256;  // columns summed in float lanes before the double sum

// The n <= kW floats at p (zero-padded), or dflt in every lane when p is null (an absent
// weight or bias).
inline V load_or(const float* p, i64 n, float dflt) { return p ? simd::load_part(p, n) : simd::vbcast(dflt); }

// Sum of f(c, n) over the vectors of columns [c0, e) (n < kW only for the last one;
// f must give 0 in the lanes past n) in float lanes: four accumulators, vectors
// 4i..4i+3 into a0..a3, so the adds do not wait on each other.
template <class F>
inline double block_sum(i64 c0, i64 e, F&& f) {
  using namespace simd;
  V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  i64 c = c0;
  for (; c + 4 * kW <= e; c += 4 * kW) {
    a0 = vadd(a0, f(c, kW));
    a1 = vadd(a1, f(c + kW, kW));
    a2 = vadd(a2, f(c + 2 * kW, kW));
    a3 = vadd(a3, f(c + 3 * kW, kW));
  }
  for (; c < e; c += kW) a0 = vadd(a0, f(c, e - c < kW ? e - c : kW));
  return static_cast<double>(vsum(vadd(vadd(a0, a1), vadd(a2, a3))));
}

// Sum over the row of f(c, n): block_sum per block of kBlk columns, the blocks in double.
template <class F>
inline double row_sum(i64 cols, F&& f) {
  double s = 0;
  for (i64 c0 = 0; c0 < cols; c0 += kBlk) s += block_sum(c0, cols - c0 < kBlk ? cols : c0 + kBlk, f);
  return s;
}

}  // namespace vrows
}  // namespace pk
