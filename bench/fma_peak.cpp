// FP32 FMA throughput of this machine: independent vector FMA chains in registers, on one
// core and on every core. Build: g++ -O3 -march=native -std=c++17 -pthread fma_peak.cpp
// Prints one JSON object: {"isa", "lanes", "single_gflops", "all_gflops", "threads"}.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

#if defined(__AVX512F__)
using vec = __m512;
constexpr int kLanes = 16;
const char* kIsa = "avx512";
constexpr int kChains = 24;  // > FMA latency x FMA ports, so the pipes never wait; < 32 registers
inline vec splat(float x) { return _mm512_set1_ps(x); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__FMA__)
using vec = __m256;
constexpr int kLanes = 8;
const char* kIsa = "avx2-fma";
constexpr int kChains = 12;  // 16 ymm registers: 12 chains + 2 constants, no spills
inline vec splat(float x) { return _mm256_set1_ps(x); }
inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(vec v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}
#else
using vec = float;
constexpr int kLanes = 1;
const char* kIsa = "scalar";
constexpr int kChains = 8;
inline vec splat(float x) { return x; }
inline vec fma(vec a, vec b, vec c) { return a * b + c; }
inline float hsum(vec v) { return v; }
#endif

// kChains * kLanes * 2 flops per iteration
float kernel(long iters, float seed) {
  vec acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = splat(seed + 0.001f * i);
  const vec a = splat(0.999999f), b = splat(1e-6f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < kChains; ++i) acc[i] = fma(acc[i], a, b);
  }
  vec s = acc[0];
  for (int i = 1; i < kChains; ++i) s = s + acc[i];
  return hsum(s);
}

std::atomic<float> sink{0};

// best of `reps` runs of `threads` threads doing `iters` iterations each, in GFLOP/s
double measure(int threads, long iters, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<std::thread> pool;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) {
        }
        float v = kernel(iters, 1.0f + t);
        sink.store(sink.load() + v);
      });
    while (ready.load() < threads) {
    }
    t0 = std::chrono::steady_clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(threads) * iters * kChains * kLanes * 2 / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : int(std::thread::hardware_concurrency());
  long iters = argc > 2 ? std::atol(argv[2]) : 20'000'000L;
  if (threads < 1) threads = 1;
  measure(1, iters / 10, 1);  // wake the core up
  double single = measure(1, iters, 5);
  double all = measure(threads, iters, 5);
  std::printf("{\"isa\": \"%s\", \"lanes\": %d, \"threads\": %d, \"single_gflops\": %.2f, \"all_gflops\": %.2f, "
              "\"sink\": %g}\n",
              kIsa, kLanes, threads, single, all, double(sink.load()) * 0);
  return 0;
}
