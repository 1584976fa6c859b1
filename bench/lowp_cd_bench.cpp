// lowp_cd_bench.cpp — compute_dtype's bf16/fp16 products (kernels/lowp.cpp *_lowp_cd, weights
// stored bf16/fp16) against the fp32 linear at SmolLM2-135M's shapes (128 tokens), one thread,
// the six variants called in turn (interleaved) per repetition; medians of the calling
// thread's CPU time and their ratios to fp32.
//   rt=native/runtime; g++ -O3 -std=c++17 -march=native -pthread -I $rt/include -I $rt -I $rt/kernels \
//     bench/lowp_cd_bench.cpp $rt/kernels/{lowp,lowp_dot,linear,optimizer,guards,gemm}.cpp $rt/threadpool.cpp \
//     -o /tmp/lowp_cd_bench && /tmp/lowp_cd_bench 30
#include <cstdio>
#include <immintrin.h>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <algorithm>
#include "pock_kernels.h"
using pk::i64;
__attribute__((target("f16c"))) static uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
static double cpu_ms() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6; }
static uint16_t bf(float f) { uint32_t b; memcpy(&b, &f, 4); b += 0x7fff + ((b >> 16) & 1); return b >> 16; }
int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 30;
  struct Shape { i64 M, N, K; const char* name; } shapes[] = {{128, 576, 576, "q/o"}, {128, 1536, 576, "gate/up"}, {128, 576, 1536, "down"}, {128, 192, 576, "k/v"}};
  for (auto s : shapes) {
    std::vector<float> x(s.M * s.K), w(s.N * s.K), y(s.M * s.N), dy(s.M * s.N), dx(s.M * s.K);
    for (auto& v : x) v = rand() / float(RAND_MAX) - .5f;
    for (auto& v : dy) v = rand() / float(RAND_MAX) - .5f;
    std::vector<uint16_t> wb(w.size()), wh(w.size());
    for (size_t i = 0; i < w.size(); ++i) { float v = rand() / float(RAND_MAX) - .5f; wb[i] = bf(v); uint32_t u = uint32_t(wb[i]) << 16; memcpy(&w[i], &u, 4); wh[i] = f2h(w[i]); }
    const int NV = 6; std::vector<double> t[NV];
    for (int r = 0; r < reps; ++r) {
      for (int v = 0; v < NV; ++v) {
        double a = cpu_ms();
        switch (v) {
          case 0: pk::linear_fwd(x.data(), w.data(), nullptr, y.data(), s.M, s.N, s.K); break;
          case 1: pk::linear_fwd_lowp_cd(x.data(), wb.data(), pk::LowpDtype::BF16, nullptr, nullptr, y.data(), s.M, s.N, s.K, pk::Act::None, pk::LowpDtype::BF16); break;
          case 2: pk::linear_fwd_lowp_cd(x.data(), wh.data(), pk::LowpDtype::F16, nullptr, nullptr, y.data(), s.M, s.N, s.K, pk::Act::None, pk::LowpDtype::F16); break;
          case 3: pk::linear_bwd_input(dy.data(), w.data(), dx.data(), s.M, s.N, s.K); break;
          case 4: pk::linear_bwd_input_lowp_cd(dy.data(), wb.data(), pk::LowpDtype::BF16, nullptr, dx.data(), s.M, s.N, s.K, pk::LowpDtype::BF16); break;
          case 5: pk::linear_bwd_input_lowp_cd(dy.data(), wh.data(), pk::LowpDtype::F16, nullptr, dx.data(), s.M, s.N, s.K, pk::LowpDtype::F16); break;
        }
        if (r > 0) t[v].push_back(cpu_ms() - a);
      }
    }
    double med[NV];
    for (int v = 0; v < NV; ++v) { std::sort(t[v].begin(), t[v].end()); med[v] = t[v][t[v].size() / 2]; }
    printf("%-8s M%ld N%ld K%ld  fwd fp32 %.3f ms  bf16 %.3f (%.2fx)  f16 %.3f (%.2fx) | bwd fp32 %.3f  bf16 %.3f (%.2fx)  f16 %.3f (%.2fx)\n", s.name, s.M, s.N, s.K,
           med[0], med[1], med[1] / med[0], med[2], med[2] / med[0], med[3], med[4], med[4] / med[3], med[5], med[5] / med[3]);
  }
}
