// dense_shim.cpp — extern "C" wrappers over the dense kernels (gemm, linear,
// conv2d, pool2d, embedding, layer_norm, batch_norm) so ctypes can call them
// with plain pointers and integers.  Booleans travel as int.
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

void shim_gemm(const float* A, const float* B, float* C, i64 batch, i64 M, i64 N, i64 K, int ta, int tb, i64 sa,
               i64 sb, i64 sc, float beta) {
  pk::gemm(A, B, C, pk::GemmParams{batch, M, N, K, ta != 0, tb != 0, sa, sb, sc, beta});
}

void shim_linear_fwd(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K) {
  pk::linear_fwd(x, w, b, y, M, N, K);
}
void shim_linear_bwd_input(const float* dy, const float* w, float* dx, i64 M, i64 N, i64 K) {
  pk::linear_bwd_input(dy, w, dx, M, N, K);
}
void shim_linear_bwd_weight(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx) {
  pk::linear_bwd_weight(dy, x, dw, M, N, k, ldx);
}
void shim_bias_bwd(const float* dy, float* db, i64 M, i64 N) { pk::bias_bwd(dy, db, M, N); }

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
void shim_adaptive_avg_pool2d_fwd(const float* x, float* y, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
  pk::adaptive_avg_pool2d_fwd(x, y, N, C, H, W, OH, OW);
}
void shim_adaptive_avg_pool2d_bwd(const float* dy, float* dx, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
  pk::adaptive_avg_pool2d_bwd(dy, dx, N, C, H, W, OH, OW);
}

void shim_embedding_fwd(const float* w, const int64_t* idx, float* y, i64 n, i64 V, i64 D) {
  pk::embedding_fwd(w, idx, y, n, V, D);
}
void shim_embedding_bwd(const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k,
                        i64 padding_idx) {
  pk::embedding_bwd(dy, idx, dw, n, V, D, k, padding_idx);
}

void shim_layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                         i64 rows, i64 cols, float eps) {
  pk::layer_norm_fwd(x, w, b, y, mean, rstd, rows, cols, eps);
}
void shim_layer_norm_bwd(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                         float* dx, float* dw, float* db, i64 rows, i64 cols) {
  pk::layer_norm_bwd(dy, x, mean, rstd, w, dx, dw, db, rows, cols);
}

void shim_batch_norm_train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                               float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv, i64 N,
                               i64 C, i64 S, float momentum, float eps) {
  pk::batch_norm_train_fwd(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps);
}
void shim_batch_norm_train_fwd_act(const float* x, const float* w, const float* b, const float* rm,
                                   const float* rv, float* y, float* save_mean, float* save_invstd, float* new_rm,
                                   float* new_rv, i64 N, i64 C, i64 S, float momentum, float eps, int act) {
  pk::batch_norm_train_fwd_act(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps,
                               static_cast<pk::Act>(act));
}
void shim_batch_norm_train_bwd(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                               const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S) {
  pk::batch_norm_train_bwd(dy, x, save_mean, save_invstd, w, dx, dw, db, N, C, S);
}
void shim_batch_norm_eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                              float* y, i64 N, i64 C, i64 S, float eps) {
  pk::batch_norm_eval_fwd(x, w, b, rm, rv, y, N, C, S, eps);
}
void shim_batch_norm_eval_fwd_act(const float* x, const float* w, const float* b, const float* rm,
                                  const float* rv, float* y, i64 N, i64 C, i64 S, float eps, int act) {
  pk::batch_norm_eval_fwd_act(x, w, b, rm, rv, y, N, C, S, eps, static_cast<pk::Act>(act));
}
void shim_batch_norm_eval_bwd(const float* dy, const float* x, const float* rm, const float* rv, const float* w,
                              float* dx, float* dw, float* db, i64 N, i64 C, i64 S, float eps) {
  pk::batch_norm_eval_bwd(dy, x, rm, rv, w, dx, dw, db, N, C, S, eps);
}
}  // extern "C"
