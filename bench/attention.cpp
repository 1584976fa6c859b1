// attention.cpp — sdpa forward + backward at SmolLM2's attention shapes (batch 1, 9 query heads,
// 3 kv heads, head dim 64, causal, q/out [T, H, D] and k/v [T, 3, D] read in place): a shared
// library built by bench/attention.py against one revision's runtime (the kernel that keeps
// the probabilities [H, T, T] with -DPOCK_SDPA_PROBS, the flash-style one without), so that
// several revisions load into one process (RTLD_LOCAL, hidden symbols) and their calls
// interleave.
//
//   attn_make(T, threads) -> handle;  attn_step(handle, ms[4]) runs fwd then bwd once and writes
//   {fwd thread-CPU ms, bwd thread-CPU ms, fwd wall ms, bwd wall ms} (CPU time of the calling
//   thread: with threads > 1 only the wall times count the workers);  attn_free(handle).
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "pock_kernels.h"
#include "runtime_internal.h"

using pk::i64;

namespace {
struct Bench {
  i64 T;
  pk::SdpaParams p;
  std::vector<float> q, k, v, go, out, dq, dk, dv, saved, scratch;
  pock_rt::ThreadPool* pool = nullptr;
};

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* attn_make(long T_, int threads) {
  const i64 N = 1, H = 9, Hk = 3, D = 64, g = H / Hk, T = T_;
  auto* b = new Bench;
  b->T = T;
  std::srand(1);
  auto rnd = [](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = std::rand() / float(RAND_MAX) - 0.5f;
  };
  rnd(b->q, N * T * H * D), rnd(b->k, N * T * Hk * D), rnd(b->v, N * T * Hk * D), rnd(b->go, N * T * H * D);
  b->out.resize(b->q.size()), b->dq.resize(b->q.size()), b->dk.resize(b->k.size()), b->dv.resize(b->v.size());
  pk::SdpaParams& p = b->p;
  p = pk::SdpaParams{N * H, T, T, D, D, 0.125f, true, 0, 0, 0, 0};
  p.H = H, p.group = g;
  p.q = p.o = pk::SdpaLayout{T * H * D, D, H * D};
  p.k = p.v = pk::SdpaLayout{T * Hk * D, D, Hk * D};
#ifdef POCK_SDPA_PROBS
  p.scratch_rows = N * H * T;
  b->saved.resize(N * H * T * T), b->scratch.resize(N * H * T * T);
#else
  b->saved.resize(N * H * T), b->scratch.resize(N * H * T * 2 * D);
#endif
  if (threads > 1) b->pool = pock_rt::pool_create(threads);
  return b;
}

extern "C" __attribute__((visibility("default"))) void attn_step(void* h, double* ms) {
  auto* b = static_cast<Bench*>(h);
  pock_rt::PoolScope scope(b->pool);
  const double c0 = cpu_ms(), w0 = wall_ms();
  pk::sdpa_fwd(b->q.data(), b->k.data(), b->v.data(), nullptr, b->out.data(), b->saved.data(), b->p);
  const double c1 = cpu_ms(), w1 = wall_ms();
#ifdef POCK_SDPA_PROBS
  pk::sdpa_bwd(b->go.data(), b->q.data(), b->k.data(), b->v.data(), b->saved.data(), b->dq.data(), b->dk.data(),
               b->dv.data(), b->scratch.data(), b->p);
#else
  pk::sdpa_bwd(b->go.data(), b->q.data(), b->k.data(), b->v.data(), b->out.data(), b->saved.data(), nullptr,
               b->dq.data(), b->dk.data(), b->dv.data(), b->scratch.data(), b->p);
#endif
  const double c2 = cpu_ms(), w2 = wall_ms();
  ms[0] = c1 - c0, ms[1] = c2 - c1, ms[2] = w1 - w0, ms[3] = w2 - w1;
}

// dq, dk, dv of the last step (for checking two kernels against each other): n floats each.
extern "C" __attribute__((visibility("default"))) const float* attn_grad(void* h, int which, long* n) {
  auto* b = static_cast<Bench*>(h);
  const std::vector<float>& x = which == 0 ? b->dq : which == 1 ? b->dk : which == 2 ? b->dv : b->out;
  *n = static_cast<long>(x.size());
  return x.data();
}

extern "C" __attribute__((visibility("default"))) void attn_free(void* h) {
  auto* b = static_cast<Bench*>(h);
  if (b->pool) pock_rt::pool_destroy(b->pool);
  delete b;
}
