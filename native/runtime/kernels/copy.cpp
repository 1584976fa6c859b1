// copy.cpp — strided_copy and fill, the data-movement kernels.
//
// strided_copy coalesces the iteration space first (size-1 dims dropped,
// neighbouring dims merged when both the input and the output are contiguous
// across them), so contiguous copies, slices of whole rows and cat become a
// few big memcpy calls; a non-unit inner stride falls back to a plain loop.
// Explicitly instantiated for float, int64_t, int32_t and uint8_t.
// fill is split over the threads (pk::parallel_for); strided_copy is pure data
// movement and stays on the calling thread.
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

// y[out_offset + sum i_d*out_strides[d]] = x[in_offset + sum i_d*in_strides[d]]
template <typename T>
void strided_copy(const T* x, T* y, const StridedCopy& p) {
  int nd = 0;
  i64 sh[kMaxDims], si[kMaxDims], so[kMaxDims];
  for (int d = 0; d < p.ndim; ++d) {
    if (p.shape[d] == 0) return;
    if (p.shape[d] == 1) continue;
    if (nd > 0 && si[nd - 1] == p.in_strides[d] * p.shape[d] && so[nd - 1] == p.out_strides[d] * p.shape[d]) {
      sh[nd - 1] *= p.shape[d];
      si[nd - 1] = p.in_strides[d];
      so[nd - 1] = p.out_strides[d];
      continue;
    }
    sh[nd] = p.shape[d];
    si[nd] = p.in_strides[d];
    so[nd] = p.out_strides[d];
    ++nd;
  }
  x += p.in_offset;
  y += p.out_offset;
  if (nd == 0) {
    y[0] = x[0];
    return;
  }
  const i64 n = sh[nd - 1], sin = si[nd - 1], sout = so[nd - 1];
  i64 idx[kMaxDims] = {0};
  i64 oi = 0, oo = 0;
  for (;;) {
    const T* src = x + oi;
    T* dst = y + oo;
    if (sin == 1 && sout == 1) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
    } else if (sin == 0) {  // expand of the innermost dim: a broadcast fill
      const T v = *src;
      if (sout == 1) {
        for (i64 i = 0; i < n; ++i) dst[i] = v;
      } else {
        for (i64 i = 0; i < n; ++i) dst[i * sout] = v;
      }
    } else if (sout == 1) {
      for (i64 i = 0; i < n; ++i) dst[i] = src[i * sin];
    } else {
      for (i64 i = 0; i < n; ++i) dst[i * sout] = src[i * sin];
    }
    int d = nd - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < sh[d]) {
        oi += si[d];
        oo += so[d];
        break;
      }
      oi -= si[d] * (sh[d] - 1);
      oo -= so[d] * (sh[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// y[0:n] = value
template <typename T>
void fill(T* y, i64 n, T value) {
  parallel_for(n, i64{1} << 16, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) y[i] = value;
  });
}

template void strided_copy<float>(const float*, float*, const StridedCopy&);
template void strided_copy<int64_t>(const int64_t*, int64_t*, const StridedCopy&);
template void strided_copy<int32_t>(const int32_t*, int32_t*, const StridedCopy&);
template void strided_copy<uint8_t>(const uint8_t*, uint8_t*, const StridedCopy&);
template void fill<float>(float*, i64, float);
template void fill<int64_t>(int64_t*, i64, int64_t);
template void fill<int32_t>(int32_t*, i64, int32_t);
template void fill<uint8_t>(uint8_t*, i64, uint8_t);

}  // namespace pk
