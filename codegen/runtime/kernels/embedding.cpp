// embedding.cpp — table lookup y[i] = w[idx[i]] and its (dense) weight gradient.
#include <cstring>

#include "pock_kernels.h"

namespace pk {

// y[i, 0:D] = w[idx[i], 0:D] for i in [0, n).  Indices were validated by the C
// API (0 <= idx < V) before the step runs.
void embedding_fwd(const float* w, const int64_t* idx, float* y, i64 n, i64 V, i64 D) {
  (void)V;
  for (i64 i = 0; i < n; ++i)
    std::memcpy(y + i * D, w + idx[i] * D, sizeof(float) * static_cast<size_t>(D));
}

// dw[V, k] = 0, then dw[idx[i], 0:k] += dy[i, 0:k] in index order, skipping
// rows whose index is padding_idx (-1 = no padding index).  dy rows are D long.
void embedding_bwd(const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k,
                   i64 padding_idx) {
  for (i64 i = 0; i < V * k; ++i) dw[i] = 0.0f;
  for (i64 i = 0; i < n; ++i) {
    const i64 row = idx[i];
    if (row == padding_idx || row < 0 || row >= V) continue;
    const float* src = dy + i * D;
    float* dst = dw + row * k;
    for (i64 j = 0; j < k; ++j) dst[j] += src[j];
  }
}

}  // namespace pk
