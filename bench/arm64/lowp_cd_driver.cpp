// lowp_cd_driver.cpp — one frozen-weight product, `reps` times, for bench/arm64/lowp_cd_insns.py:
//   lowp_cd_driver KERNEL M N K REPS   KERNEL: fwd_fp32 | fwd_bf16 | fwd_fp16 | bwd_fp32 | bwd_bf16 | bwd_fp16
// the weight [N, K] stored as compile(compute_dtype=...) stores it: bf16 for fp32 and bf16 compute
// (fp32 compute widens it: the frozen_dtype="bf16" product), fp16 for fp16; x [M, K] / dy [M, N].
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pock_kernels.h"

int main(int argc, char** argv) {
  if (argc != 6) return 2;
  const std::string k = argv[1];
  const pk::i64 M = std::atoll(argv[2]), N = std::atoll(argv[3]), K = std::atoll(argv[4]);
  const int reps = std::atoi(argv[5]);
  std::vector<float> x(M * K), dy(M * N), y(M * N), dx(M * K);
  std::vector<uint16_t> w(N * K), wh(N * K);
  uint32_t s = 1;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return static_cast<float>(s >> 8) / 16777216.0f - 0.5f; };
  for (auto& v : x) v = rnd();
  for (auto& v : dy) v = rnd();
  for (auto& v : w) {
    const float f = rnd();
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v = static_cast<uint16_t>(b >> 16);
  }
  for (size_t i = 0; i < w.size(); ++i) {  // the same values in fp16 (bf16's 8 bits fit fp16's 11)
    uint32_t b = static_cast<uint32_t>(w[i]) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    const __fp16 h = static_cast<__fp16>(f);
    std::memcpy(&wh[i], &h, 2);
  }
  const auto bf16 = pk::LowpDtype::BF16;
  for (int r = 0; r < reps; ++r) {
    if (k == "fwd_fp32") pk::linear_fwd_lowp(x.data(), w.data(), bf16, nullptr, nullptr, y.data(), M, N, K, pk::Act::None);
    else if (k == "fwd_bf16") pk::linear_fwd_lowp_cd(x.data(), w.data(), bf16, nullptr, nullptr, y.data(), M, N, K, pk::Act::None, bf16);
    else if (k == "fwd_fp16") pk::linear_fwd_lowp_cd(x.data(), wh.data(), pk::LowpDtype::F16, nullptr, nullptr, y.data(), M, N, K, pk::Act::None, pk::LowpDtype::F16);
    else if (k == "bwd_fp32") pk::linear_bwd_input_lowp(dy.data(), w.data(), bf16, nullptr, dx.data(), M, N, K);
    else if (k == "bwd_bf16") pk::linear_bwd_input_lowp_cd(dy.data(), w.data(), bf16, nullptr, dx.data(), M, N, K, bf16);
    else if (k == "bwd_fp16") pk::linear_bwd_input_lowp_cd(dy.data(), wh.data(), pk::LowpDtype::F16, nullptr, dx.data(), M, N, K, pk::LowpDtype::F16);
    else return 3;
  }
  return 0;
}
