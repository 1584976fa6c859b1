// threads_shim.cpp — extern "C" access to the runtime's thread pool
// (threadpool.cpp) and to the threaded dense kernels, for test_threads*.py,
// test_gemm_perf*.py and the pointwise tests (pointwise_lib.py).  Built with every
// kernel, threadpool.cpp and the generated kernel shims.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "runtime_internal.h"

using pk::i64;
using pock_rt::PoolScope;
using pock_rt::ThreadPool;

extern "C" {

void* shim_pool_create(int threads) { return pock_rt::pool_create(threads); }
void shim_pool_destroy(void* pool) { pock_rt::pool_destroy(static_cast<ThreadPool*>(pool)); }
int shim_default_threads() { return pock_rt::default_num_threads(); }
// Threads for the kernel calls that follow on the calling thread (as inside a step):
// a pool of n threads made current there; n <= 1 drops it (kernels run inline again).
void shim_use_threads(int n) {
  static thread_local ThreadPool* pool = nullptr;
  static thread_local PoolScope* scope = nullptr;
  delete scope;
  scope = nullptr;
  pock_rt::pool_destroy(pool);
  pool = nullptr;
  if (n > 1) {
    pool = pock_rt::pool_create(n);
    scope = new PoolScope(pool);
  }
}
int shim_num_threads() { return pk::num_threads(); }

// The pool's debug counters: parallel regions that reached it, and those handed to its workers.
i64 shim_pool_regions(void* pool) { return pock_rt::pool_regions(static_cast<ThreadPool*>(pool)); }
i64 shim_pool_dispatches(void* pool) { return pock_rt::pool_dispatches(static_cast<ThreadPool*>(pool)); }
void shim_pool_back_off_for(void* pool, i64 ns) { pock_rt::pool_back_off_for(static_cast<ThreadPool*>(pool), ns); }
i64 shim_pool_backoffs(void* pool) { return pock_rt::pool_backoffs(static_cast<ThreadPool*>(pool)); }
void shim_pool_note_window(void* pool, int busy) { pock_rt::pool_note_window(static_cast<ThreadPool*>(pool), busy != 0); }
int shim_pool_backed_off(void* pool) { return pock_rt::pool_backed_off(static_cast<ThreadPool*>(pool)) ? 1 : 0; }
int shim_parallel_now(void* pool) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  return pk::parallel_now() ? 1 : 0;
}

// relu_fwd over n floats on `pool` (as inside a step).
void shim_relu_pool(void* pool, const float* x, float* y, i64 n) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  pk::relu_fwd(x, y, n);
}

// parallel_for(n, grain) on `pool` (nullptr: no pool current): counts[i] += 1 for
// each index visited; chunk_len[c] = length of the c-th chunk (up to max_chunks);
// returns the number of chunks.  *threads_seen = distinct threads that ran chunks
// (by comparing thread ids to the caller's).  With nested != 0 each chunk runs a
// nested parallel_for over its range, which must run inline on the same thread.
int shim_parallel_for(void* pool, i64 n, i64 grain, int32_t* counts, i64* chunk_len, int max_chunks, int nested,
                      int* threads_seen, int* nested_ok, int* nthreads) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  *nthreads = pk::num_threads();
  std::atomic<int> chunks{0}, other{0}, ok{1};
  const std::thread::id caller = std::this_thread::get_id();
  pk::parallel_for(n, grain, [&](i64 b, i64 e) {
    const int c = chunks.fetch_add(1);
    if (c < max_chunks) chunk_len[c] = e - b;
    if (std::this_thread::get_id() != caller) other.store(1);
    if (pk::num_threads() != 1) ok.store(0);
    if (nested) {
      const std::thread::id me = std::this_thread::get_id();
      pk::parallel_for(e - b, 1, [&](i64 nb, i64 ne) {
        if (std::this_thread::get_id() != me || nb != 0 || ne != e - b) ok.store(0);
        for (i64 i = b + nb; i < b + ne; ++i) __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
      });
    } else {
      for (i64 i = b; i < e; ++i) __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
    }
  });
  *threads_seen = 1 + other.load();
  *nested_ok = ok.load();
  return chunks.load();
}

void shim_gemm_pool(void* pool, const float* A, const float* B, float* C, i64 batch, i64 M, i64 N, i64 K, int ta,
                    int tb, i64 sa, i64 sb, i64 sc, float beta) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  pk::gemm(A, B, C, pk::GemmParams{batch, M, N, K, ta != 0, tb != 0, sa, sb, sc, beta});
}

void shim_linear_fwd_act_pool(void* pool, const float* x, const float* w, const float* b, float* y, i64 M, i64 N,
                              i64 K, int act) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  pk::linear_fwd_act(x, w, b, y, M, N, K, static_cast<pk::Act>(act));
}

void shim_linear_bwd_pool(void* pool, const float* dy, const float* x, const float* w, float* dx, float* dw,
                          float* db, i64 M, i64 N, i64 K) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  pk::linear_bwd_input(dy, w, dx, M, N, K);
  pk::linear_bwd_weight(dy, x, dw, M, N, K, K);
  pk::bias_bwd(dy, db, M, N);
}

// embedding_bwd (embedding.cpp: the table's zeroing is threaded) on `pool`; returns its result.
i64 shim_embedding_bwd_pool(void* pool, const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k,
                            i64 padding_idx) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  return pk::embedding_bwd(dy, idx, dw, n, V, D, k, padding_idx);
}

// gemv_lowp (gemv.cpp, generation's decode step) on `pool` (nullptr: none current); with
// reps > 0 also timed: returns the best-of-`reps` seconds after a warm-up call (else 0).
double shim_gemv_lowp_pool(void* pool, const float* x, const void* w, int dt, const float* scale, const float* b,
                           float* y, i64 N, i64 K, int reps) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  pk::gemv_lowp(x, w, static_cast<pk::LowpDtype>(dt), scale, b, y, N, K);
  double best = reps > 0 ? 1e30 : 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pk::gemv_lowp(x, w, static_cast<pk::LowpDtype>(dt), scale, b, y, N, K);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = s < best ? s : best;
  }
  return best;
}

// Best-of-`reps` seconds for one gemm (after a warm-up call).
double shim_time_gemm(void* pool, const float* A, const float* B, float* C, i64 M, i64 N, i64 K, int ta, int tb,
                      int reps) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  const pk::GemmParams p{1, M, N, K, ta != 0, tb != 0, 0, 0, 0, 0.0f};
  pk::gemm(A, B, C, p);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pk::gemm(A, B, C, p);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

// A busy neighbour: `n` threads spinning (pure arithmetic, no memory traffic),
// thread i pinned to core i % cores, at the default priority, until
// shim_neighbours_stop.  Returns a handle.
struct Neighbours {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
};
void* shim_neighbours_start(int n) {
  auto* nb = new Neighbours;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 0; i < n; ++i) {
    nb->threads.emplace_back([nb] {
      volatile double x = 1.0;
      while (!nb->stop.load(std::memory_order_relaxed))
        for (int k = 0; k < 1000; ++k) x = x * 1.0000001 + 1e-9;
    });
    if (cores > 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(i % cores, &set);
      pthread_setaffinity_np(nb->threads.back().native_handle(), sizeof(set), &set);
    }
  }
  return nb;
}
void shim_neighbours_stop(void* handle) {
  auto* nb = static_cast<Neighbours*>(handle);
  nb->stop.store(true);
  for (auto& t : nb->threads) t.join();
  delete nb;
}

// Seconds for `reps` threaded GEMMs (A: M x K, B: K x N) back to back on `pool`:
// the parallel regions of a step.
double shim_run_gemms(void* pool, const float* A, const float* B, float* C, i64 M, i64 N, i64 K, int reps) {
  PoolScope scope(static_cast<ThreadPool*>(pool));
  const pk::GemmParams p{1, M, N, K, false, false, 0, 0, 0, 0.0f};
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) pk::gemm(A, B, C, p);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // extern "C"
