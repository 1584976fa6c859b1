// kernels_bw.cpp — memory-bound kernels in GB/s against the machine's measured bandwidth,
// and the compute-bound pointwise ones in elements/ns, one thread (bench/kernels_bw.py
// builds and runs it; the kernels are compiled in with the runtime's flags).
//
//   kernels_bw [MiB per array]   -> one JSON object on stdout
//
// Bandwidth: the best of 5 STREAM-style triads a[i] = b[i] + s*c[i] over arrays far larger
// than the caches (12 bytes per element moved; write-allocate traffic not counted, as
// STREAM does).  Each kernel runs 5 times on the same arrays; its bytes are the ones it
// must read and write once (e.g. SGD with momentum: p, g, buf read, p, buf written).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pock_kernels.h"

using pk::i64;

static double best_seconds(const std::function<void()>& f, int reps = 5) {
  f();  // warm: page faults, caches
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return best;
}

int main(int argc, char** argv) {
  const i64 mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const i64 n = mib * (1 << 20) / 4;
  std::vector<float> a(n, 1.f), b(n, 0.5f), c(n, 0.25f), d(n, 0.125f);
  for (i64 i = 0; i < n; ++i) b[i] = static_cast<float>((i * 7919) % 1000) / 500.f - 1.f;
  float* A = a.data();
  float* B = b.data();
  float* C = c.data();
  float* D = d.data();
  const double triad = best_seconds([&] {
    for (i64 i = 0; i < n; ++i) A[i] = B[i] + 0.5f * C[i];
  });
  const double bw = 12.0 * n / triad / 1e9;
  std::printf("{\"bandwidth_gbs\": %.2f, \"elements\": %lld, \"kernels\": [", bw, static_cast<long long>(n));
  struct K {
    const char* name;
    double bytes_per_elem;
    bool memory_bound;
    std::function<void()> f;
  };
  const pk::UpdateRegion region{1, n, n};
  const i64 cols = 8000, rows = n / cols;
  std::vector<int64_t> tgt(rows);
  for (i64 r = 0; r < rows; ++r) tgt[r] = (r * 31) % cols;
  const float dloss = 1.f;
  std::vector<float> mean(rows), rstd(rows), w(cols, 1.f), bias(cols, 0.f);
  const K ks[] = {
      {"relu_fwd", 8, true, [&] { pk::relu_fwd(B, A, n); }},
      {"relu_bwd", 12, true, [&] { pk::relu_bwd(B, C, A, n); }},
      {"add_scalar", 8, true, [&] { pk::add_scalar(B, A, n, 1.f); }},
      {"sgd_update (momentum)", 20, true,
       [&] { pk::sgd_update(A, B, C, region, 1e-3f, 0.9f, 0.f, 0.f, false, false); }},
      {"adamw_update", 28, true,
       [&] { pk::adamw_update(A, B, C, D, region, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3); }},
      {"layer_norm_fwd (8000 cols)", 8, true,
       [&] { pk::layer_norm_fwd(B, w.data(), bias.data(), A, mean.data(), rstd.data(), rows, cols, 1e-5f); }},
      {"rms_norm_fwd (8000 cols)", 8, true, [&] { pk::rms_norm_fwd(B, w.data(), A, rstd.data(), rows, cols, 1e-6f); }},
      {"bias_bwd (8000 cols)", 4, true, [&] { pk::bias_bwd(B, A, rows, cols); }},
      {"gelu_fwd (erf)", 8, false, [&] { pk::gelu_fwd(B, A, n, false); }},
      {"gelu_bwd (erf)", 12, false, [&] { pk::gelu_bwd(C, B, A, n, false); }},
      {"sigmoid_fwd", 8, false, [&] { pk::sigmoid_fwd(B, A, n); }},
      {"tanh_fwd", 8, false, [&] { pk::tanh_fwd(B, A, n); }},
      {"softmax_fwd (8000 cols)", 8, false, [&] { pk::softmax_fwd(B, A, rows, cols, 1); }},
      {"cross_entropy_bwd (8000 classes)", 8, false,
       [&] { pk::cross_entropy_bwd(&dloss, B, tgt.data(), A, rows, cols, -100, 0.f); }},
  };
  bool first = true;
  for (const K& k : ks) {
    const double s = best_seconds(k.f);
    const double gbs = k.bytes_per_elem * n / s / 1e9;
    std::printf("%s\n {\"kernel\": \"%s\", \"memory_bound\": %s, \"gbs\": %.2f, \"pct_bandwidth\": %.1f, "
                "\"elems_per_ns\": %.3f}",
                first ? "" : ",", k.name, k.memory_bound ? "true" : "false", gbs, 100 * gbs / bw, n / s / 1e9);
    first = false;
  }
  std::printf("\n]}\n");
  return 0;
}
