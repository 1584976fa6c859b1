// dense_shim.cpp — extern "C" wrappers over conv2d and pool2d, whose parameter structs
// the tests pass as one i64 array.  The other dense kernels' shims (gemm, linear,
// embedding, layer_norm, batch_norm, ...) are generated from the op records
// (pockengine.ops.kernels; conftest.build_shim compiles them beside this file).
#include "pock_kernels.h"

using pk::i64;

namespace {
pk::Conv2dParams conv_params(const i64* v) {
  // v: N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups
  return pk::Conv2dParams{v[0], v[1], v[2],  v[3],  v[4],  v[5],  v[6],  v[7],
                          v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]};
}
pk::Pool2dParams pool_params(const i64* v) {
  // v: N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, count_include_pad, divisor_override
  return pk::Pool2dParams{v[0], v[1], v[2],  v[3],  v[4],  v[5],       v[6], v[7],
                          v[8], v[9], v[10], v[11], v[12], v[13], v[14] != 0, v[15]};
}
}  // namespace

extern "C" {

void shim_conv2d_fwd(const float* x, const float* w, const float* b, float* y, const i64* v) {
  pk::conv2d_fwd(x, w, b, y, conv_params(v));
}
void shim_conv2d_fwd_act(const float* x, const float* w, const float* b, float* y, const i64* v, int act) {
  pk::conv2d_fwd_act(x, w, b, y, conv_params(v), static_cast<pk::Act>(act));
}
void shim_conv2d_bwd_input(const float* dy, const float* w, float* dx, const i64* v) {
  pk::conv2d_bwd_input(dy, w, dx, conv_params(v));
}
void shim_conv2d_bwd_weight(const float* dy, const float* x, float* dw, const i64* v, i64 k, i64 xc) {
  pk::conv2d_bwd_weight(dy, x, dw, conv_params(v), k, xc);
}
void shim_conv2d_bwd_bias(const float* dy, float* db, const i64* v) { pk::conv2d_bwd_bias(dy, db, conv_params(v)); }

void shim_max_pool2d_fwd(const float* x, float* y, int32_t* idx, const i64* v) {
  pk::max_pool2d_fwd(x, y, idx, pool_params(v));
}
void shim_max_pool2d_bwd(const float* dy, const int32_t* idx, float* dx, const i64* v) {
  pk::max_pool2d_bwd(dy, idx, dx, pool_params(v));
}
void shim_avg_pool2d_fwd(const float* x, float* y, const i64* v) { pk::avg_pool2d_fwd(x, y, pool_params(v)); }
void shim_avg_pool2d_bwd(const float* dy, float* dx, const i64* v) { pk::avg_pool2d_bwd(dy, dx, pool_params(v)); }

}  // extern "C"
