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
//
// Threads (pk::parallel_for): outputs (resp. column blocks of kCols outputs)
// are split over the threads; an output's sum never depends on the split.
// When there are too few outputs to share (e.g. a full sum), each output's
// reduction is cut into at most kParts fixed parts that depend only on the
// shape (whole reduced rows, or pieces of one long row), the parts' double
// partial sums are formed in parallel and added in part order, so results are
// bit-identical for any thread count.
#include "pock_kernels.h"
#include "row_reduce.h"
#include "pock_parallel.h"

namespace pk {

namespace {

constexpr i64 kBlock = 64;     // doubles of column accumulators on the stack
constexpr i64 kGrain = 1 << 15;  // elements per chunk, at least
constexpr i64 kParts = 64;       // fixed partition of one output's reduction
constexpr i64 kMinPart = 1 << 13;  // elements per part, at least (a multiple of 8)

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
  i64 count() const {
    i64 c = 1;
    for (int d = 0; d < n; ++d) c *= size[d];
    return c;
  }
  // Positions at the k-th index (row-major over the dims).
  void seek(i64 k) {
    off = 0;
    for (int d = n - 1; d >= 0; --d) {
      idx[d] = k % size[d];
      k /= size[d];
      off += idx[d] * stride[d];
    }
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
  const i64 nkept = kept.count(), nrows = rdc.count();
  if (red[nd - 1]) {
    // Each output sums nrows contiguous rows of n.
    const i64 work = nrows * n;
    if (nkept >= 4 || work < 2 * kMinPart) {
      parallel_for(nkept, work >= kGrain ? 1 : kGrain / work, [&](i64 o0, i64 o1) {
        Odometer kp = kept, rd = rdc;
        kp.seek(o0);
        for (i64 o = o0; o < o1; ++o) {
          double acc = 0;
          rd.reset();
          do {
            acc += fastmath::sum_f64(x + kp.off + rd.off, n);
          } while (rd.next());
          y[o] = static_cast<float>(acc * scale);
          kp.next();
        }
      });
      return;
    }
    // Few outputs, long reductions: a fixed partition of each one.
    for (i64 o = 0; o < nkept; ++o) {
      kept.seek(o);
      const i64 koff = kept.off;
      double part[kParts];
      i64 np;
      if (nrows >= 2) {  // whole rows per part
        np = nrows < kParts ? nrows : kParts;
        parallel_for(np, 1, [&](i64 k0, i64 k1) {
          Odometer rd = rdc;
          for (i64 k = k0; k < k1; ++k) {
            const i64 r0 = nrows * k / np, r1 = nrows * (k + 1) / np;
            rd.seek(r0);
            double acc = 0;
            for (i64 r = r0; r < r1; ++r) {
              acc += fastmath::sum_f64(x + koff + rd.off, n);
              rd.next();
            }
            part[k] = acc;
          }
        });
      } else {  // one long row: pieces of at least kMinPart, multiples of 8
        i64 len = (n + kParts - 1) / kParts;
        len = len < kMinPart ? kMinPart : (len + 7) / 8 * 8;
        np = (n + len - 1) / len;
        parallel_for(np, 1, [&](i64 k0, i64 k1) {
          for (i64 k = k0; k < k1; ++k) {
            const i64 b = k * len, e = b + len < n ? b + len : n;
            part[k] = fastmath::sum_f64(x + koff + b, e - b);
          }
        });
      }
      double acc = 0;
      for (i64 k = 0; k < np; ++k) acc += part[k];
      y[o] = static_cast<float>(acc * scale);
    }
    return;
  }
  // Innermost dim kept: units of (kept index, block of kBlock columns).
  const i64 nblk = (n + kBlock - 1) / kBlock;
  const i64 unit = nrows * (n < kBlock ? n : kBlock);
  parallel_for(nkept * nblk, unit >= kGrain ? 1 : kGrain / unit, [&](i64 u0, i64 u1) {
    Odometer kp = kept, rd = rdc;
    double acc[kBlock];
    for (i64 u = u0; u < u1; ++u) {
      const i64 o = u / nblk, j0 = (u % nblk) * kBlock;
      const i64 m = n - j0 < kBlock ? n - j0 : kBlock;
      kp.seek(o);
      for (i64 j = 0; j < m; ++j) acc[j] = 0;
      rd.reset();
      do {
        const float* xr = x + kp.off + rd.off + j0;
        for (i64 j = 0; j < m; ++j) acc[j] += static_cast<double>(xr[j]);
      } while (rd.next());
      float* out = y + o * n + j0;
      for (i64 j = 0; j < m; ++j) out[j] = static_cast<float>(acc[j] * scale);
    }
  });
}

}  // namespace pk
