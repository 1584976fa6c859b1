// guard_gemm.cpp — what the exact non-finite guard's gradient check costs on a weight
// gradient: pk::linear_bwd_weight followed by a pk::all_finite pass over dw, against
// pk::linear_bwd_weight_finite (the check made as the GEMM stores dw), one thread, the two
// alternated; best of `reps` each, and whether dw came out bit-identical.
//
//   g++ -O3 -march=native -std=c++17 -pthread -I native/runtime/include -I native/runtime \
//       -I native/runtime/kernels bench/guard_gemm.cpp native/runtime/threadpool.cpp \
//       native/runtime/kernels/*.cpp -o /tmp/guard_gemm && /tmp/guard_gemm [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pock_kernels.h"

using pk::i64;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  struct Shape {
    const char* name;
    i64 tokens, out, in;
  } shapes[] = {{"SmolLM2 head", 128, 49152, 576}, {"SmolLM2 up_proj", 128, 1536, 576},
                {"SmolLM2 q_proj", 128, 576, 576},  {"LSTM LM output layer", 16, 10000, 96},
                {"transformer LM head", 512, 8000, 256}, {"transformer fc1", 512, 1024, 256}};
  for (const Shape& s : shapes) {
    std::vector<float> dy(s.tokens * s.out), x(s.tokens * s.in), a(s.out * s.in), b(s.out * s.in);
    for (auto& v : dy) v = std::rand() / (float)RAND_MAX - 0.5f;
    for (auto& v : x) v = std::rand() / (float)RAND_MAX - 0.5f;
    double t_separate = 1e9, t_fused = 1e9;
    bool same = true;
    for (int r = 0; r < reps; ++r) {
      double t0 = now();
      pk::linear_bwd_weight(dy.data(), x.data(), a.data(), s.tokens, s.out, s.in, s.in);
      const bool f0 = pk::all_finite(a.data(), s.out * s.in);
      const double t1 = now();
      const bool f1 = pk::linear_bwd_weight_finite(dy.data(), x.data(), b.data(), s.tokens, s.out, s.in, s.in);
      const double t2 = now();
      t_separate = std::min(t_separate, t1 - t0);
      t_fused = std::min(t_fused, t2 - t1);
      same = same && f0 && f1 && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
    }
    std::printf("%-22s %5lld x %5lld x %4lld  separate %8.3f ms  checked as stored %8.3f ms  (%+.1f%%)  %s\n", s.name,
                (long long)s.tokens, (long long)s.out, (long long)s.in, t_separate * 1e3, t_fused * 1e3,
                100.0 * (t_fused / t_separate - 1.0), same ? "same bits" : "BITS DIFFER");
  }
  return 0;
}
