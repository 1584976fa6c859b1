// attention.cpp — sdpa forward + backward at SmolLM2's attention shapes, the row-at-a-time kernel
// (git history, compiled with its entry points renamed *_old) against the blocked one, interleaved
// in one process on one thread.  Built and run by bench/attention.py.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pock_kernels.h"

namespace pk {
void sdpa_fwd_old(const float*, const float*, const float*, const void*, float*, float*, const SdpaParams&);
void sdpa_bwd_old(const float*, const float*, const float*, const float*, const float*, float*, float*, float*,
                  float*, const SdpaParams&);
}  // namespace pk

using pk::i64;

int main(int argc, char** argv) {
  const i64 N = 1, H = 9, Hk = 3, T = 128, D = 64, g = H / Hk;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  auto rnd = [](std::vector<float>& v) { for (auto& x : v) x = std::rand() / float(RAND_MAX) - 0.5f; };
  // old: dense [H, T, D] q and k/v already repeated to H heads (the expand copy the graph had)
  std::vector<float> q(N * H * T * D), k(N * H * T * D), v(N * H * T * D), go(N * H * T * D);
  rnd(q), rnd(k), rnd(v), rnd(go);
  std::vector<float> out(q.size()), probs(N * H * T * T), dq(q.size()), dk(q.size()), dv(q.size());
  std::vector<float> scratch(N * H * T * T);
  pk::SdpaParams old{N * H, T, T, D, D, 0.125f, true, 0, 0, 0, 0};
  // new: q, out [N, T, H, D], k, v [N, T, Hk, D] read in place (no permute, no expand)
  pk::SdpaParams nw = old;
  nw.H = H, nw.group = g, nw.scratch_rows = N * H * T;
  nw.q = nw.o = pk::SdpaLayout{T * H * D, D, H * D};
  nw.k = nw.v = pk::SdpaLayout{T * Hk * D, D, Hk * D};
  auto now = [] { return std::chrono::steady_clock::now(); };
  double t_old = 1e30, t_new = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto a = now();
    pk::sdpa_fwd_old(q.data(), k.data(), v.data(), nullptr, out.data(), probs.data(), old);
    pk::sdpa_bwd_old(go.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(), dk.data(), dv.data(),
                     scratch.data(), old);
    auto b = now();
    pk::sdpa_fwd(q.data(), k.data(), v.data(), nullptr, out.data(), probs.data(), nw);
    pk::sdpa_bwd(go.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(), dk.data(), dv.data(),
                 scratch.data(), nw);
    auto c = now();
    t_old = std::min(t_old, std::chrono::duration<double, std::milli>(b - a).count());
    t_new = std::min(t_new, std::chrono::duration<double, std::milli>(c - b).count());
  }
  std::printf("{\"old_ms\": %.4f, \"new_ms\": %.4f, \"speedup\": %.2f}\n", t_old, t_new, t_old / t_new);
  return 0;
}
