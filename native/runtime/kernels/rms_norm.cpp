// rms_norm.cpp — fused RMSNorm (Llama/Qwen2/Mistral/Gemma, recognised by passes/fuse_norm.py):
//   y = w * (x * r),  r = 1 / sqrt(mean(x^2) + eps)  per row of `cols` values,
// forward (saving r per row) and backward side by side, over the native vector of simd.h
// (AVX-512, AVX2+FMA, NEON).  Row sums in float lanes within blocks of 256 columns and the
// blocks in double (vec_rows.h), as close to fp64 as PyTorch's float pow/mean/rsqrt chain;
// the weight gradient's column sums in double, the rows streamed in order.  Tails are
// zero-padded through the same vector code.
//
// Threads (pk::parallel_for): forward and dx split the rows; dw splits the columns, each
// column summing over every row in row order, so results do not depend on the split.
#include <cmath>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"
#include "vec_rows.h"

namespace pk {

namespace {
using namespace simd;
using vrows::load_or;
using vrows::row_sum;

inline i64 grain(i64 cols) { return grain_for_work(cols, kMinChunkElems); }

constexpr i64 kColChunk = 256;  // dw columns summed at once (stack accumulators; a multiple of kW)
constexpr i64 kColAlign = 64;   // dw thread splits fall on multiples of this many columns

// One row of the forward; returns r.  Pointers as plain arguments (not a lambda's
// captures), so the stores to y do not make the compiler reload them.  `next`
// (nullable): the next row, fetched into the caches while this one is written (a pass
// that reads no new memory), so its first read does not wait on DRAM alone.
float rms_norm_row(const float* __restrict xr, const float* __restrict w, float* __restrict yr, const float* next,
                   i64 cols, float eps) {
  const double sq = row_sum(cols, [&](i64 c, i64 n) {  // padded lanes: 0 * 0
    const V v = load_part(xr + c, n);
    return vmul(v, v);
  });
  const float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + eps));
  const V vinv = vbcast(inv);
  i64 c = 0;
  if (w != nullptr)
    for (; c + kW <= cols; c += kW) {
      if (next != nullptr && (c & 15) == 0) __builtin_prefetch(next + c, 0, 2);
      vstore(yr + c, vmul(vload(w + c), vmul(vload(xr + c), vinv)));
    }
  for (; c < cols; c += kW) {
    const i64 n = cols - c < kW ? cols - c : kW;
    store_part(yr + c, vmul(load_or(w ? w + c : nullptr, n, 1.f), vmul(load_part(xr + c, n), vinv)), n);
  }
  return inv;
}

// One row of dx = r * (dh - h * mean(dh * h)), dh = dy * w, h = x * r.
void rms_norm_row_bwd(const float* __restrict g, const float* __restrict xr, const float* __restrict w, float inv,
                      float* __restrict dxr, i64 cols) {
  const V vinv = vbcast(inv);
  const double dot = row_sum(cols, [&](i64 c, i64 n) {  // padded lanes: dy = 0
    return vmul(vmul(load_part(g + c, n), load_or(w ? w + c : nullptr, n, 1.f)), vmul(load_part(xr + c, n), vinv));
  });
  const V vm = vbcast(static_cast<float>(dot / static_cast<double>(cols)));
  for (i64 c = 0; c < cols; c += kW) {
    const i64 n = cols - c < kW ? cols - c : kW;
    const V h = vmul(load_part(xr + c, n), vinv);
    const V dh = vmul(load_part(g + c, n), load_or(w ? w + c : nullptr, n, 1.f));
    store_part(dxr + c, vmul(vinv, vsub(dh, vmul(h, vm))), n);
  }
}
}  // namespace

void rms_norm_fwd(const float* x, const float* w, float* y, float* rstd, i64 rows, i64 cols, float eps) {
  if (cols <= 0) return;
  parallel_for(rows, grain(cols), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r)
      rstd[r] = rms_norm_row(x + r * cols, w, y + r * cols, r + 1 < r1 ? x + (r + 1) * cols : nullptr, cols, eps);
  });
}

// dh = dy * w;  dx = r * (dh - h * mean(dh * h)) with h = x * r;  dw[j] = sum_rows dy * h.
void rms_norm_bwd(const float* dy, const float* x, const float* rstd, const float* w, float* dx, float* dw, i64 rows,
                  i64 cols) {
  if (cols <= 0) return;
  if (dx != nullptr) {
    parallel_for(rows, grain(cols), [&](i64 r0, i64 r1) {
      for (i64 r = r0; r < r1; ++r) rms_norm_row_bwd(dy + r * cols, x + r * cols, w, rstd[r], dx + r * cols, cols);
    });
  }
  if (dw != nullptr) {
    // kColChunk columns at a time, the rows streamed in order into double accumulators
    // (float products dy * h widened, as the sum of every column is over all rows).
    const i64 cgrain = grain_for_work(rows, kMinChunkElems);
    parallel_for_aligned(cols, (cgrain + kColAlign - 1) / kColAlign * kColAlign, kColAlign, [&](i64 cb, i64 ce) {
      double acc[kColChunk];
      for (i64 c0 = cb; c0 < ce; c0 += kColChunk) {
        const i64 nb = ce - c0 < kColChunk ? ce - c0 : kColChunk;
        for (i64 j = 0; j < nb; ++j) acc[j] = 0.0;
        for (i64 r = 0; r < rows; ++r) {
          const float* g = dy + r * cols + c0;
          const float* xr = x + r * cols + c0;
          const float inv = rstd[r];
          for (i64 j = 0; j < nb; ++j) acc[j] += static_cast<double>(g[j]) * static_cast<double>(xr[j] * inv);
        }
        for (i64 j = 0; j < nb; ++j) dw[c0 + j] = static_cast<float>(acc[j]);
      }
    });
  }
}

}  // namespace pk
