// dropout.cpp — dropout with a counter-based RNG (not PyTorch's stream).
//
// u_i = top 24 bits of splitmix64(splitmix64(seed) + (i+1) * golden) / 2^24,
// a uniform in [0, 1) that depends only on (seed, i): the result is the same
// on every platform, thread split and call order.  Element i is kept iff
// u_i >= p; kept elements are scaled by 1/(1-p) (p >= 1 drops everything).
// Threads: [0, n) is split with pk::parallel_for (each element depends only on
// its index, so any split gives the same bits); the loops vectorize.
#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr i64 kGrain = 1 << 15;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float scale_for(float p) { return p < 1.f ? 1.f / (1.f - p) : 0.f; }

}  // namespace

// y = x * mask / (1-p),  mask[i] = (u_i >= p)
void dropout_fwd(const float* x, float* y, uint8_t* mask, i64 n, float p, uint64_t seed) {
  const uint64_t base = mix64(seed);
  const float scale = scale_for(p);
  constexpr float kInv24 = 1.f / 16777216.f;
  parallel_for(n, kGrain, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) {
      const uint64_t h = mix64(base + (static_cast<uint64_t>(i) + 1) * kGolden);
      const float u = static_cast<float>(static_cast<uint32_t>(h >> 40)) * kInv24;
      const bool keep = u >= p;
      mask[i] = keep ? 1 : 0;
      y[i] = keep ? x[i] * scale : 0.f;
    }
  });
}

// dx = dy * mask / (1-p)
void dropout_bwd(const float* dy, const uint8_t* mask, float* dx, i64 n, float p) {
  const float scale = scale_for(p);
  parallel_for(n, kGrain, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) dx[i] = mask[i] ? dy[i] * scale : 0.f;
  });
}

}  // namespace pk
