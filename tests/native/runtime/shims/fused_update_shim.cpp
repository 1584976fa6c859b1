// fused_update_shim.cpp — extern "C" wrappers for test_kernels_fused_update.py: the weight
// gradient with its optimizer update fused (linear_bwd_weight_sgd/_adamw) or unfused
// (linear_bwd_weight, then sgd_update/adamw_update), and checked as it is stored
// (linear_bwd_weight_finite) or not, on a pool of any size.
#include "pock_kernels.h"
#include "runtime_internal.h"

using pk::i64;

extern "C" {
void* fu_pool_create(int threads) { return pock_rt::pool_create(threads); }
void fu_pool_destroy(void* pool) { pock_rt::pool_destroy(static_cast<pock_rt::ThreadPool*>(pool)); }

int fu_sgd(void* pool, int fused, const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
           float* buf, i64 outer, i64 inner, i64 stride, float lr, float momentum, float dampening, float wd,
           int nesterov, int first, int check) {
  pock_rt::PoolScope scope(static_cast<pock_rt::ThreadPool*>(pool));
  const pk::UpdateRegion r{outer, inner, stride};
  if (fused)
    return pk::linear_bwd_weight_sgd(dy, x, dw, M, N, k, ldx, p, buf, r, lr, momentum, dampening, wd, nesterov != 0,
                                     first != 0, check != 0);
  pk::linear_bwd_weight(dy, x, dw, M, N, k, ldx);
  return pk::sgd_update(p, dw, buf, r, lr, momentum, dampening, wd, nesterov != 0, first != 0, check != 0);
}

int fu_adamw(void* pool, int fused, const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
             float* m, float* v, i64 outer, i64 inner, i64 stride, float lr, float b1, float b2, float eps, float wd,
             i64 step, int check) {
  pock_rt::PoolScope scope(static_cast<pock_rt::ThreadPool*>(pool));
  const pk::UpdateRegion r{outer, inner, stride};
  if (fused)
    return pk::linear_bwd_weight_adamw(dy, x, dw, M, N, k, ldx, p, m, v, r, lr, b1, b2, eps, wd, step, check != 0);
  pk::linear_bwd_weight(dy, x, dw, M, N, k, ldx);
  return pk::adamw_update(p, dw, m, v, r, lr, b1, b2, eps, wd, step, check != 0);
}

// checked: linear_bwd_weight_finite's verdict; else linear_bwd_weight, 1
int fu_finite(void* pool, int checked, const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx) {
  pock_rt::PoolScope scope(static_cast<pock_rt::ThreadPool*>(pool));
  if (checked) return pk::linear_bwd_weight_finite(dy, x, dw, M, N, k, ldx);
  pk::linear_bwd_weight(dy, x, dw, M, N, k, ldx);
  return 1;
}
}  // extern "C"
