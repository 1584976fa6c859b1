// rnn_shim.cpp — the LSTM / GRU tests' helpers: a thread pool for the calls and the
// scratch sizes.  The kernels' own shims (shim_lstm_fwd, ...: LstmParams as its fields)
// are generated from the op records (pockengine.ops.kernels).
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

i64 shim_gru_bwd_scratch_floats(i64 B, i64 T, i64 I, i64 H, int has_bias) {
  return pk::gru_bwd_scratch_floats(gru_params(B, T, I, H, has_bias));
}

}  // extern "C"
