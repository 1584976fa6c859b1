// reduce.cpp — reduce_sum over any subset of dims, accumulated in double.
//
// The shape is first coalesced: size-1 dims are dropped and neighbouring dims
// with the same reduce flag are merged, so e.g. reducing the last dims becomes
// [K, R] and reducing the leading dims becomes [R, K].  Then:
//   * innermost dim reduced  -> each output is a sum of contiguous rows
//     (8 double accumulators, vectorizes);
//   * innermost dim kept     -> each output row is a column sum over the
//     reduced rows, accumulated into a stack block of doubles (vectorizes).
// Both cases cover arbitrary interleavings like [K, R, K, R].
#include "pock_kernels.h"

namespace pk {

namespace {

constexpr i64 kBlock = 256;  // doubles of column accumulators on the stack

// Odometer over a list of dims (size, stride), tracking the flat offset.
struct Odometer {
  int n = 0;
  i64 size[kMaxDims];
  i64 stride[kMaxDims];
  i64 idx[kMaxDims] = {0};
  i64 off = 0;
  void reset() {
    for (int d = 0; d < n; ++d) idx[d] = 0;
    off = 0;
  }
  // Advances to the next index; false after the last one (offset back to 0).
  bool next() {
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < size[d]) {
        off += stride[d];
        return true;
      }
      off -= stride[d] * (size[d] - 1);
      idx[d] = 0;
    }
    return false;
  }
};

// Sum of a contiguous float row in double with 8 independent accumulators.
double row_sum(const float* x, i64 n) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += static_cast<double>(x[i + j]);
  double s = 0;
  for (; i < n; ++i) s += static_cast<double>(x[i]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + s;
}

}  // namespace

// y = scale * sum of x over the dims with reduce[d]; y is contiguous over the kept dims.
void reduce_sum(const float* x, float* y, const Reduce& p) {
  const double scale = p.scale;
  i64 nout = 1, nred = 1;
  for (int d = 0; d < p.ndim; ++d) (p.reduce[d] ? nred : nout) *= p.shape[d];
  if (nout == 0) return;
  if (nred == 0) {  // empty reduction: zeros
    for (i64 i = 0; i < nout; ++i) y[i] = 0.f;
    return;
  }
  // Coalesce.
  int nd = 0;
  i64 sh[kMaxDims];
  bool red[kMaxDims];
  for (int d = 0; d < p.ndim; ++d) {
    if (p.shape[d] == 1) continue;
    if (nd > 0 && red[nd - 1] == p.reduce[d]) {
      sh[nd - 1] *= p.shape[d];
    } else {
      sh[nd] = p.shape[d];
      red[nd] = p.reduce[d];
      ++nd;
    }
  }
  if (nd == 0) {  // a single element
    y[0] = static_cast<float>(scale * x[0]);
    return;
  }
  i64 st[kMaxDims];
  st[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; --d) st[d] = st[d + 1] * sh[d + 1];

  // Outer kept dims and outer reduced dims (the innermost dim is handled apart).
  Odometer kept, rdc;
  for (int d = 0; d < nd - 1; ++d) {
    Odometer& o = red[d] ? rdc : kept;
    o.size[o.n] = sh[d];
    o.stride[o.n] = st[d];
    ++o.n;
  }
  const i64 n = sh[nd - 1];
  float* out = y;
  if (red[nd - 1]) {
    do {
      double acc = 0;
      rdc.reset();
      do {
        acc += row_sum(x + kept.off + rdc.off, n);
      } while (rdc.next());
      *out++ = static_cast<float>(acc * scale);
    } while (kept.next());
  } else {
    double acc[kBlock];
    do {
      for (i64 j0 = 0; j0 < n; j0 += kBlock) {
        const i64 m = n - j0 < kBlock ? n - j0 : kBlock;
        for (i64 j = 0; j < m; ++j) acc[j] = 0;
        rdc.reset();
        do {
          const float* xr = x + kept.off + rdc.off + j0;
          for (i64 j = 0; j < m; ++j) acc[j] += static_cast<double>(xr[j]);
        } while (rdc.next());
        for (i64 j = 0; j < m; ++j) out[j0 + j] = static_cast<float>(acc[j] * scale);
      }
      out += n;
    } while (kept.next());
  }
}

}  // namespace pk
