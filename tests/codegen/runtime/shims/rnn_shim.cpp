// rnn_shim.cpp — extern "C" wrappers over the LSTM / GRU kernels for the tests.
#include "pock_kernels.h"
#include "runtime_internal.h"

using pk::i64;

namespace {
pk::LstmParams lstm_params(i64 B, i64 T, i64 I, i64 H, i64 P, int has_bias, int has_proj) {
  return pk::LstmParams{B, T, I, H, P, has_bias != 0, has_proj != 0};
}
pk::GruParams gru_params(i64 B, i64 T, i64 I, i64 H, int has_bias) { return pk::GruParams{B, T, I, H, has_bias != 0}; }
}  // namespace

extern "C" {

// Run the following kernel calls on this thread on a pool of `threads` threads
// (as inside a step); 0 drops the pool (kernels run inline again).
void shim_rnn_set_threads(int threads) {
  static pock_rt::ThreadPool* pool = nullptr;
  static pock_rt::PoolScope* scope = nullptr;
  delete scope;
  pock_rt::pool_destroy(pool);
  scope = nullptr;
  pool = nullptr;
  if (threads > 0) {
    pool = pock_rt::pool_create(threads);
    scope = new pock_rt::PoolScope(pool);
  }
}

i64 shim_lstm_bwd_scratch_floats(i64 B, i64 T, i64 I, i64 H, i64 P, int has_bias, int has_proj) {
  return pk::lstm_bwd_scratch_floats(lstm_params(B, T, I, H, P, has_bias, has_proj));
}

void shim_lstm_fwd(const float* x, const float* h0, const float* c0, const float* w_ih, const float* w_hh,
                   const float* b_ih, const float* b_hh, const float* w_hr, float* y, float* hn, float* cn,
                   float* gates, float* cells, float* hraw, i64 B, i64 T, i64 I, i64 H, i64 P, int has_bias,
                   int has_proj) {
  pk::lstm_fwd(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y, hn, cn, gates, cells, hraw,
               lstm_params(B, T, I, H, P, has_bias, has_proj));
}

void shim_lstm_bwd(const float* dy, const float* dhn, const float* dcn, const float* x, const float* h0,
                   const float* c0, const float* w_ih, const float* w_hh, const float* w_hr, const float* y,
                   const float* gates, const float* cells, const float* hraw, float* dx, float* dh0, float* dc0,
                   float* dw_ih, float* dw_hh, float* db_ih, float* db_hh, float* dw_hr, float* scratch, i64 B,
                   i64 T, i64 I, i64 H, i64 P, int has_bias, int has_proj, i64 k_ih, i64 k_hh, i64 k_hr) {
  pk::lstm_bwd(dy, dhn, dcn, x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, hraw, dx, dh0, dc0, dw_ih, dw_hh, db_ih,
               db_hh, dw_hr, scratch, lstm_params(B, T, I, H, P, has_bias, has_proj), k_ih, k_hh, k_hr);
}

i64 shim_gru_bwd_scratch_floats(i64 B, i64 T, i64 I, i64 H, int has_bias) {
  return pk::gru_bwd_scratch_floats(gru_params(B, T, I, H, has_bias));
}

void shim_gru_fwd(const float* x, const float* h0, const float* w_ih, const float* w_hh, const float* b_ih,
                  const float* b_hh, float* y, float* hn, float* saved, i64 B, i64 T, i64 I, i64 H, int has_bias) {
  pk::gru_fwd(x, h0, w_ih, w_hh, b_ih, b_hh, y, hn, saved, gru_params(B, T, I, H, has_bias));
}

void shim_gru_bwd(const float* dy, const float* dhn, const float* x, const float* h0, const float* w_ih,
                  const float* w_hh, const float* y, const float* saved, float* dx, float* dh0, float* dw_ih,
                  float* dw_hh, float* db_ih, float* db_hh, float* scratch, i64 B, i64 T, i64 I, i64 H, int has_bias,
                  i64 k_ih, i64 k_hh) {
  pk::gru_bwd(dy, dhn, x, h0, w_ih, w_hh, y, saved, dx, dh0, dw_ih, dw_hh, db_ih, db_hh, scratch,
              gru_params(B, T, I, H, has_bias), k_ih, k_hh);
}

}  // extern "C"
