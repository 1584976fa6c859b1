// lowp_shim.cpp — extern "C" wrappers over the low-precision frozen-weight kernels
// (lowp.cpp) for test_kernels_lowp.py; dtype codes as pk::LowpDtype, act as pk::Act.
#include "pock_kernels.h"

using pk::i64;

extern "C" {
void shim_linear_fwd_lowp(const float* x, const void* w, int dt, const float* scale, const float* b, float* y, i64 M,
                          i64 N, i64 K, int act) {
  pk::linear_fwd_lowp(x, w, static_cast<pk::LowpDtype>(dt), scale, b, y, M, N, K, static_cast<pk::Act>(act));
}
void shim_linear_bwd_input_lowp(const float* dy, const void* w, int dt, const float* scale, float* dx, i64 M, i64 N,
                                i64 K) {
  pk::linear_bwd_input_lowp(dy, w, static_cast<pk::LowpDtype>(dt), scale, dx, M, N, K);
}
i64 shim_embedding_fwd_lowp(const void* w, int dt, const float* scale, const int64_t* idx, float* y, i64 n, i64 V,
                            i64 D) {
  return pk::embedding_fwd_lowp(w, static_cast<pk::LowpDtype>(dt), scale, idx, y, n, V, D);
}
}  // extern "C"
