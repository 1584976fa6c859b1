// rms_norm.cpp — fused RMSNorm (Llama/Qwen2/Mistral/Gemma, recognised by passes/fuse_norm.py):
//   y = w * (x * r),  r = 1 / sqrt(mean(x^2) + eps)  per row of `cols` values,
// forward (saving r per row) and backward side by side.  Row sums in double, so the
// result is at least as close to fp64 as PyTorch's float pow/mean/rsqrt chain.
//
// Threads (pk::parallel_for): forward and dx split the rows; dw splits the columns, each
// column summing over every row in row order, so results do not depend on the split.
#include <cmath>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {
inline i64 grain(i64 cols) { return grain_for_work(cols, kMinChunkElems); }
}  // namespace

void rms_norm_fwd(const float* x, const float* w, float* y, float* rstd, i64 rows, i64 cols, float eps) {
  parallel_for(rows, grain(cols), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      double sq = 0.0;
      for (i64 j = 0; j < cols; ++j) sq += static_cast<double>(xr[j]) * xr[j];
      const float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + eps));
      rstd[r] = inv;
      for (i64 j = 0; j < cols; ++j) yr[j] = (w != nullptr ? w[j] : 1.0f) * (xr[j] * inv);
    }
  });
}

// dh = dy * w;  dx = r * (dh - h * mean(dh * h)) with h = x * r;  dw[j] = sum_rows dy * h.
void rms_norm_bwd(const float* dy, const float* x, const float* rstd, const float* w, float* dx, float* dw, i64 rows,
                  i64 cols) {
  if (dx != nullptr) {
    parallel_for(rows, grain(cols), [&](i64 r0, i64 r1) {
      for (i64 r = r0; r < r1; ++r) {
        const float* xr = x + r * cols;
        const float* g = dy + r * cols;
        const float inv = rstd[r];
        double dot = 0.0;
        for (i64 j = 0; j < cols; ++j)
          dot += static_cast<double>(g[j] * (w != nullptr ? w[j] : 1.0f)) * (xr[j] * inv);
        const float m = static_cast<float>(dot / static_cast<double>(cols));
        for (i64 j = 0; j < cols; ++j)
          dx[r * cols + j] = inv * (g[j] * (w != nullptr ? w[j] : 1.0f) - (xr[j] * inv) * m);
      }
    });
  }
  if (dw != nullptr) {
    const i64 cgrain = grain_for_work(rows, kMinChunkElems);  // columns per chunk (whole cache lines)
    parallel_for(cols, cgrain < 64 ? 64 : (cgrain + 63) / 64 * 64, [&](i64 c0, i64 c1) {
      for (i64 j = c0; j < c1; ++j) {
        double s = 0.0;
        for (i64 r = 0; r < rows; ++r) s += static_cast<double>(dy[r * cols + j]) * (x[r * cols + j] * rstd[r]);
        dw[j] = static_cast<float>(s);
      }
    });
  }
}

}  // namespace pk
