// embedding.cpp — table lookup y[i] = w[idx[i]] and its weight gradient (dense, or onto another gradient).
#include <cstring>

#include "pock_kernels.h"

namespace pk {

// y[i, 0:D] = w[idx[i], 0:D] for i in [0, n).  The generated step checks the
// indices before (first_bad_index); the kernel never reads with one outside
// [0, V) either: that row of y becomes zeros and the first such i is returned
// (-1 when every index is in range).
i64 embedding_fwd(const float* w, const int64_t* idx, float* y, i64 n, i64 V, i64 D) {
  i64 bad = -1;
  for (i64 i = 0; i < n; ++i) {
    const int64_t row = idx[i];
    if (row < 0 || row >= V) {
      std::memset(y + i * D, 0, sizeof(float) * static_cast<size_t>(D));
      if (bad < 0) bad = i;
      continue;
    }
    std::memcpy(y + i * D, w + row * D, sizeof(float) * static_cast<size_t>(D));
  }
  return bad;
}

namespace {
// dw[idx[i], 0:k] += dy[i, 0:k] in index order (the skips and the return of embedding_bwd).
i64 scatter_rows(const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k, i64 padding_idx) {
  i64 bad = -1;
  for (i64 i = 0; i < n; ++i) {
    const i64 row = idx[i];
    if (padding_idx >= 0 && row == padding_idx) continue;  // -1: no padding index (not index -1)
    if (row < 0 || row >= V) {
      if (bad < 0) bad = i;
      continue;
    }
    const float* src = dy + i * D;
    float* dst = dw + row * k;
    for (i64 j = 0; j < k; ++j) dst[j] += src[j];
  }
  return bad;
}
}  // namespace

// dw[V, k] = 0, then dw[idx[i], 0:k] += dy[i, 0:k] in index order, skipping
// rows whose index is padding_idx (-1 = no padding index) or outside [0, V)
// (the first such i is returned, -1 when none).  dy rows are D long.
// The zeroing (the whole table: 8 MB for 8000 x 256, most of the kernel's time) is split over
// the threads; the scatter of the n rows runs on the caller, in index order.
i64 embedding_bwd(const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k,
                   i64 padding_idx) {
  fill(dw, V * k, 0.f);  // copy.cpp's fill, split over the threads
  return scatter_rows(dy, idx, dw, n, V, D, k, padding_idx);
}

// The same rows summed onto base (another gradient of the same table, e.g. a tied
// output head's): dw = base, then the scatter above.  base may be dw itself (the
// usual case: the memory plan gives the sum base's buffer), then nothing is copied
// and only the n rows are touched, not the whole [V, k] table.
i64 embedding_bwd_onto(const float* dy, const int64_t* idx, const float* base, float* dw, i64 n, i64 V, i64 D,
                       i64 k, i64 padding_idx) {
  if (base != dw) std::memcpy(dw, base, sizeof(float) * static_cast<size_t>(V * k));
  return scatter_rows(dy, idx, dw, n, V, D, k, padding_idx);
}

// The rows embedding_bwd(_onto) summed into (the same skips): whether they hold no NaN/inf.
// A row indexed several times is tested again (n rows of k floats, no bookkeeping).
bool embedding_rows_finite(const float* dw, const int64_t* idx, i64 n, i64 V, i64 k, i64 padding_idx) {
  for (i64 i = 0; i < n; ++i) {
    const i64 row = idx[i];
    if ((padding_idx >= 0 && row == padding_idx) || row < 0 || row >= V) continue;
    if (!all_finite(dw + row * k, k)) return false;
  }
  return true;
}

}  // namespace pk
