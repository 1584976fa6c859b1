// guards.cpp — the checks the generated step runs at the boundary of a gather
// and before an optimizer update: cheap scans that keep bad data from turning
// into out-of-bounds reads or poisoned weights.
#include <cmath>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

i64 first_bad_index(const int64_t* idx, i64 n, i64 lo, i64 hi, i64 ignore_index, bool has_ignore) {
  for (i64 i = 0; i < n; ++i) {
    const int64_t v = idx[i];
    if ((v < lo || v >= hi) && !(has_ignore && v == ignore_index)) return i;
  }
  return -1;
}

// NaN and inf are the floats whose exponent bits are all ones: test the bits
// (no FP compare, so -ffast-math cannot fold it away) and OR the verdicts, so
// the loop has no branch and vectorises.
bool all_finite(const float* x, i64 n) {
  if (n <= 0) return true;
  constexpr i64 kGrain = 1 << 16;
  if (n <= kGrain) {
    uint32_t bad = 0;
    for (i64 i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, x + i, 4);
      bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
    return bad == 0;
  }
  constexpr int kParts = 64;
  const i64 per = (n + kParts - 1) / kParts;
  uint32_t part_bad[kParts] = {};
  parallel_for(kParts, 1, [&](i64 b, i64 e) {
    for (i64 k = b; k < e; ++k) {
      const i64 lo = k * per, hi = lo + per < n ? lo + per : n;
      uint32_t bad = 0;
      for (i64 i = lo; i < hi; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
      }
      part_bad[k] = bad;
    }
  });
  uint32_t bad = 0;
  for (int k = 0; k < kParts; ++k) bad |= part_bad[k];
  return bad == 0;
}

}  // namespace pk
