// pointwise_shim.cpp — extern "C" wrappers over the pointwise-family kernels
// (activation, elementwise, reduce, copy, softmax, loss, attention, dropout,
// optimizer, layer_norm) taking plain pointers and integers so ctypes can call
// them.  pw_use_threads(n) makes a pool of n threads current on the calling
// thread (threadpool.cpp is linked in), so every wrapper below then runs the
// kernels threaded; pw_use_threads(1) goes back to inline.
#include <cstdint>

#include "pock_kernels.h"
#include "pock_parallel.h"
// Not on the shim's include path (conftest passes only include/): relative to this file.
#include "../../../../codegen/runtime/runtime_internal.h"

using pk::i64;

namespace {
template <class Arr>
void load_dims(int ndim, const i64* src, Arr& dst) {
  for (int d = 0; d < ndim; ++d) dst[d] = src[d];
}
}  // namespace

namespace {
pock_rt::ThreadPool* g_pool = nullptr;
pock_rt::PoolScope* g_scope = nullptr;
}  // namespace

extern "C" {

// Threads for the wrappers below (on the calling thread): n <= 1 runs inline.
void pw_use_threads(int n) {
  delete g_scope;
  g_scope = nullptr;
  pock_rt::pool_destroy(g_pool);
  g_pool = nullptr;
  if (n > 1) {
    g_pool = pock_rt::pool_create(n);
    g_scope = new pock_rt::PoolScope(g_pool);
  }
}
int pw_num_threads() { return pk::num_threads(); }

void pw_layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, i64 rows,
                       i64 cols, float eps) {
  pk::layer_norm_fwd(x, w, b, y, mean, rstd, rows, cols, eps);
}
void pw_layer_norm_bwd(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                       float* dx, float* dw, float* db, i64 rows, i64 cols) {
  pk::layer_norm_bwd(dy, x, mean, rstd, w, dx, dw, db, rows, cols);
}

// op: 0 relu, 1 hardtanh(a,b), 2 sigmoid, 3 tanh, 4 silu, 5 gelu(erf), 6 gelu(tanh)
void pw_act_fwd(int op, const float* x, float* y, i64 n, float a, float b) {
  switch (op) {
    case 0: pk::relu_fwd(x, y, n); break;
    case 1: pk::hardtanh_fwd(x, y, n, a, b); break;
    case 2: pk::sigmoid_fwd(x, y, n); break;
    case 3: pk::tanh_fwd(x, y, n); break;
    case 4: pk::silu_fwd(x, y, n); break;
    case 5: pk::gelu_fwd(x, y, n, false); break;
    case 6: pk::gelu_fwd(x, y, n, true); break;
  }
}

// saved is y for relu/sigmoid/tanh and x for the others.
void pw_act_bwd(int op, const float* dy, const float* saved, float* dx, i64 n, float a, float b) {
  switch (op) {
    case 0: pk::relu_bwd(dy, saved, dx, n); break;
    case 1: pk::hardtanh_bwd(dy, saved, dx, n, a, b); break;
    case 2: pk::sigmoid_bwd(dy, saved, dx, n); break;
    case 3: pk::tanh_bwd(dy, saved, dx, n); break;
    case 4: pk::silu_bwd(dy, saved, dx, n); break;
    case 5: pk::gelu_bwd(dy, saved, dx, n, false); break;
    case 6: pk::gelu_bwd(dy, saved, dx, n, true); break;
  }
}

void pw_unary(int op, const float* x, float* y, i64 n) { pk::unary(static_cast<pk::Unary>(op), x, y, n); }

// op: 0 add, 1 mul, 2 rsub, 3 pow
void pw_scalar(int op, const float* x, float* y, i64 n, float c) {
  switch (op) {
    case 0: pk::add_scalar(x, y, n, c); break;
    case 1: pk::mul_scalar(x, y, n, c); break;
    case 2: pk::rsub_scalar(x, y, n, c); break;
    case 3: pk::pow_scalar(x, y, n, c); break;
  }
}

void pw_pow_bwd(const float* dy, const float* x, float* dx, i64 n, float e) { pk::pow_scalar_bwd(dy, x, dx, n, e); }

void pw_binary(int op, const float* a, const float* b, float* out, int ndim, const i64* shape, const i64* sa,
               const i64* sb) {
  pk::Broadcast p{};
  p.ndim = ndim;
  load_dims(ndim, shape, p.shape);
  load_dims(ndim, sa, p.sa);
  load_dims(ndim, sb, p.sb);
  pk::binary(static_cast<pk::Binary>(op), a, b, out, p);
}

void pw_where(const uint8_t* c, const float* a, const float* b, float* out, int ndim, const i64* shape,
              const i64* sc, const i64* sa, const i64* sb) {
  pk::Where p{};
  p.ndim = ndim;
  load_dims(ndim, shape, p.shape);
  load_dims(ndim, sc, p.sc);
  load_dims(ndim, sa, p.sa);
  load_dims(ndim, sb, p.sb);
  pk::where(c, a, b, out, p);
}

void pw_reduce_sum(const float* x, float* y, int ndim, const i64* shape, const uint8_t* reduce, float scale) {
  pk::Reduce p{};
  p.ndim = ndim;
  load_dims(ndim, shape, p.shape);
  for (int d = 0; d < ndim; ++d) p.reduce[d] = reduce[d] != 0;
  p.scale = scale;
  pk::reduce_sum(x, y, p);
}

// dtype: 0 float, 1 int64, 2 int32, 3 uint8
void pw_strided_copy(int dtype, const void* x, void* y, int ndim, const i64* shape, const i64* in_strides,
                     i64 in_offset, const i64* out_strides, i64 out_offset) {
  pk::StridedCopy p{};
  p.ndim = ndim;
  load_dims(ndim, shape, p.shape);
  load_dims(ndim, in_strides, p.in_strides);
  load_dims(ndim, out_strides, p.out_strides);
  p.in_offset = in_offset;
  p.out_offset = out_offset;
  switch (dtype) {
    case 0: pk::strided_copy<float>(static_cast<const float*>(x), static_cast<float*>(y), p); break;
    case 1: pk::strided_copy<int64_t>(static_cast<const int64_t*>(x), static_cast<int64_t*>(y), p); break;
    case 2: pk::strided_copy<int32_t>(static_cast<const int32_t*>(x), static_cast<int32_t*>(y), p); break;
    case 3: pk::strided_copy<uint8_t>(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), p); break;
  }
}

void pw_fill(int dtype, void* y, i64 n, double fv, i64 iv) {
  switch (dtype) {
    case 0: pk::fill<float>(static_cast<float*>(y), n, static_cast<float>(fv)); break;
    case 1: pk::fill<int64_t>(static_cast<int64_t*>(y), n, iv); break;
    case 2: pk::fill<int32_t>(static_cast<int32_t*>(y), n, static_cast<int32_t>(iv)); break;
    case 3: pk::fill<uint8_t>(static_cast<uint8_t*>(y), n, static_cast<uint8_t>(iv)); break;
  }
}

// fwd: (x, -, y); bwd: (dy, y, dx)
void pw_softmax(int log, int bwd, const float* a, const float* b, float* out, i64 outer, i64 dim, i64 inner) {
  if (!bwd) {
    if (log) pk::log_softmax_fwd(a, out, outer, dim, inner);
    else pk::softmax_fwd(a, out, outer, dim, inner);
  } else {
    if (log) pk::log_softmax_bwd(a, b, out, outer, dim, inner);
    else pk::softmax_bwd(a, b, out, outer, dim, inner);
  }
}

void pw_ce_fwd(const float* logits, const int64_t* t, float* loss, i64 N, i64 C, i64 ign, float ls) {
  pk::cross_entropy_fwd(logits, t, loss, N, C, ign, ls);
}
void pw_ce_bwd(const float* dloss, const float* logits, const int64_t* t, float* d, i64 N, i64 C, i64 ign, float ls) {
  pk::cross_entropy_bwd(dloss, logits, t, d, N, C, ign, ls);
}
void pw_nll_fwd(const float* logp, const int64_t* t, float* loss, i64 N, i64 C, i64 ign) {
  pk::nll_loss_fwd(logp, t, loss, N, C, ign);
}
void pw_nll_bwd(const float* dloss, const int64_t* t, float* d, i64 N, i64 C, i64 ign) {
  pk::nll_loss_bwd(dloss, t, d, N, C, ign);
}
void pw_mse_fwd(const float* a, const float* b, float* loss, i64 n) { pk::mse_loss_fwd(a, b, loss, n); }
void pw_mse_bwd(const float* dloss, const float* a, const float* b, float* da, float* db, i64 n) {
  pk::mse_loss_bwd(dloss, a, b, da, db, n);
}

// dims = {B, L, S, E, Ev, mask_sb, mask_sl, mask_ss}
static pk::SdpaParams sdpa_params(const i64* dims, float scale, int causal, int mask_kind) {
  pk::SdpaParams p{};
  p.B = dims[0];
  p.L = dims[1];
  p.S = dims[2];
  p.E = dims[3];
  p.Ev = dims[4];
  p.mask_sb = dims[5];
  p.mask_sl = dims[6];
  p.mask_ss = dims[7];
  p.scale = scale;
  p.causal = causal != 0;
  p.mask_kind = mask_kind;
  return p;
}
void pw_sdpa_fwd(const float* q, const float* k, const float* v, const void* mask, float* out, float* probs,
                 const i64* dims, float scale, int causal, int mask_kind) {
  pk::sdpa_fwd(q, k, v, mask, out, probs, sdpa_params(dims, scale, causal, mask_kind));
}
void pw_sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* probs, float* dq,
                 float* dk, float* dv, float* scratch, const i64* dims, float scale, int causal, int mask_kind) {
  pk::sdpa_bwd(dout, q, k, v, probs, dq, dk, dv, scratch, sdpa_params(dims, scale, causal, mask_kind));
}

// dims: B, L, S, E, Ev, mask_sb, mask_sl, mask_ss, H, group, then {sb, sh, sr} of q, k, v, out, then
// scratch_rows (23 values): the full SdpaParams (heads, grouped-query attention, strided layouts).
static pk::SdpaParams sdpa_params_ex(const i64* d, float scale, int causal, int mask_kind) {
  pk::SdpaParams p = sdpa_params(d, scale, causal, mask_kind);
  p.H = d[8];
  p.group = d[9];
  pk::SdpaLayout* l[4] = {&p.q, &p.k, &p.v, &p.o};
  for (int i = 0; i < 4; ++i) *l[i] = pk::SdpaLayout{d[10 + 3 * i], d[11 + 3 * i], d[12 + 3 * i]};
  p.scratch_rows = d[22];
  return p;
}
void pw_sdpa_fwd_ex(const float* q, const float* k, const float* v, const void* mask, float* out, float* probs,
                    const i64* dims, float scale, int causal, int mask_kind) {
  pk::sdpa_fwd(q, k, v, mask, out, probs, sdpa_params_ex(dims, scale, causal, mask_kind));
}
void pw_sdpa_bwd_ex(const float* dout, const float* q, const float* k, const float* v, const float* probs,
                    float* dq, float* dk, float* dv, float* scratch, const i64* dims, float scale, int causal,
                    int mask_kind) {
  pk::sdpa_bwd(dout, q, k, v, probs, dq, dk, dv, scratch, sdpa_params_ex(dims, scale, causal, mask_kind));
}

void pw_dropout_fwd(const float* x, float* y, uint8_t* mask, i64 n, float p, uint64_t seed) {
  pk::dropout_fwd(x, y, mask, n, p, seed);
}
void pw_dropout_bwd(const float* dy, const uint8_t* mask, float* dx, i64 n, float p) {
  pk::dropout_bwd(dy, mask, dx, n, p);
}

void pw_sgd(float* p, const float* g, float* buf, i64 outer, i64 inner, i64 stride, float lr, float momentum,
            float dampening, float wd, int nesterov, int first) {
  pk::sgd_update(p, g, buf, pk::UpdateRegion{outer, inner, stride}, lr, momentum, dampening, wd, nesterov != 0,
                 first != 0);
}
void pw_adamw(float* p, const float* g, float* m, float* v, i64 outer, i64 inner, i64 stride, float lr, float b1,
              float b2, float eps, float wd, i64 step) {
  pk::adamw_update(p, g, m, v, pk::UpdateRegion{outer, inner, stride}, lr, b1, b2, eps, wd, step);
}

}  // extern "C"
