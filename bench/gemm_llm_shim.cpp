// gemm_llm_shim.cpp — extern "C" timers over the dense kernels for bench/gemm_llm.py:
// best-of-`reps` seconds of one call (after a warm-up call), on a pool of `threads`.
#include <chrono>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "runtime_internal.h"

using pk::i64;

namespace {
template <class F>
double best_of(int threads, int reps, F f) {
  pock_rt::ThreadPool* pool = threads > 1 ? pock_rt::pool_create(threads) : nullptr;
  double best = 1e30;
  {
    pock_rt::PoolScope scope(pool);
    f();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < best) best = s;
    }
  }
  if (pool) pock_rt::pool_destroy(pool);
  return best;
}
}  // namespace

extern "C" {
// op: 0 linear_fwd y = x w^T, 1 linear_bwd_input dx = dy w, 2 linear_bwd_weight dw = dy^T x,
// 3 linear_fwd_lowp, 4 linear_bwd_input_lowp (w low precision of dtype dt, scale as lowp.cpp)
double bench_linear(int op, int threads, int reps, const float* x, const void* w, float* y, i64 M, i64 N, i64 K,
                    int dt, const float* scale) {
  const auto d = static_cast<pk::LowpDtype>(dt);
  switch (op) {
    case 0: return best_of(threads, reps, [&] { pk::linear_fwd(x, static_cast<const float*>(w), nullptr, y, M, N, K); });
    case 1: return best_of(threads, reps, [&] { pk::linear_bwd_input(x, static_cast<const float*>(w), y, M, N, K); });
    case 2: return best_of(threads, reps, [&] { pk::linear_bwd_weight(x, static_cast<const float*>(w), y, M, N, K, K); });
    case 3: return best_of(threads, reps, [&] { pk::linear_fwd_lowp(x, w, d, scale, nullptr, y, M, N, K, pk::Act::None); });
    default: return best_of(threads, reps, [&] { pk::linear_bwd_input_lowp(x, w, d, scale, y, M, N, K); });
  }
}
void* bench_pool(int threads) { return threads > 1 ? pock_rt::pool_create(threads) : nullptr; }
// Seconds of one bench_linear-style call (no warm-up) on `pool` (from bench_pool).
double bench_linear_once(void* pool, int op, const float* x, const void* w, float* y, i64 M, i64 N, i64 K) {
  pock_rt::PoolScope scope(static_cast<pock_rt::ThreadPool*>(pool));
  const float* wf = static_cast<const float*>(w);
  const auto t0 = std::chrono::steady_clock::now();
  if (op == 0) pk::linear_fwd(x, wf, nullptr, y, M, N, K);
  else if (op == 1) pk::linear_bwd_input(x, wf, y, M, N, K);
  else pk::linear_bwd_weight(x, wf, y, M, N, K, K);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
// batched pk::gemm (attention-style): C_b[M,N] = op(A_b) op(B_b)
double bench_gemm(int threads, int reps, const float* A, const float* B, float* C, i64 batch, i64 M, i64 N, i64 K,
                  int ta, int tb) {
  const pk::GemmParams p{batch, M, N, K, ta != 0, tb != 0, M * K, K * N, M * N, 0.0f};
  return best_of(threads, reps, [&] { pk::gemm(A, B, C, p); });
}
}  // extern "C"
