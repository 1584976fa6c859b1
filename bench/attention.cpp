// attention.cpp — sdpa forward + backward at SmolLM2's attention shapes (batch 1, 9 query heads,
// 3 kv heads, head dim 64, causal, q/out [T, H, D] and k/v [T, 3, D] read in place), one thread,
// best of N: built by bench/attention.py against one revision's runtime (the kernel that keeps
// the probabilities [H, T, T] with -DPOCK_SDPA_PROBS, the flash-style one without).
//
//   attention T REPS  ->  {"T": .., "fwd_ms": .., "bwd_ms": .., "saved_floats": ..}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pock_kernels.h"

using pk::i64;

int main(int argc, char** argv) {
  const i64 N = 1, H = 9, Hk = 3, D = 64, g = H / Hk;
  const i64 T = argc > 1 ? std::atol(argv[1]) : 128;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  auto rnd = [](std::vector<float>& v) { for (auto& x : v) x = std::rand() / float(RAND_MAX) - 0.5f; };
  std::vector<float> q(N * T * H * D), k(N * T * Hk * D), v(k.size()), go(q.size());
  rnd(q), rnd(k), rnd(v), rnd(go);
  std::vector<float> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  pk::SdpaParams p{N * H, T, T, D, D, 0.125f, true, 0, 0, 0, 0};
  p.H = H, p.group = g;
  p.q = p.o = pk::SdpaLayout{T * H * D, D, H * D};
  p.k = p.v = pk::SdpaLayout{T * Hk * D, D, Hk * D};
#ifdef POCK_SDPA_PROBS
  p.scratch_rows = N * H * T;
  std::vector<float> saved(N * H * T * T), scratch(N * H * T * T);
#else
  std::vector<float> saved(N * H * T), scratch(N * H * T * 2 * D);
#endif
  auto now = [] { return std::chrono::steady_clock::now(); };
  double t_fwd = 1e30, t_bwd = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto a = now();
    pk::sdpa_fwd(q.data(), k.data(), v.data(), nullptr, out.data(), saved.data(), p);
    auto b = now();
#ifdef POCK_SDPA_PROBS
    pk::sdpa_bwd(go.data(), q.data(), k.data(), v.data(), saved.data(), dq.data(), dk.data(), dv.data(),
                 scratch.data(), p);
#else
    pk::sdpa_bwd(go.data(), q.data(), k.data(), v.data(), out.data(), saved.data(), nullptr, dq.data(), dk.data(),
                 dv.data(), scratch.data(), p);
#endif
    auto c = now();
    t_fwd = std::min(t_fwd, std::chrono::duration<double, std::milli>(b - a).count());
    t_bwd = std::min(t_bwd, std::chrono::duration<double, std::milli>(c - b).count());
  }
  std::printf("{\"T\": %ld, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"saved_floats\": %zu}\n", static_cast<long>(T), t_fwd,
              t_bwd, saved.size());
  return 0;
}
