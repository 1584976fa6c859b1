// fast_math.h — internal to the kernels (not part of the public runtime API):
// branch-free float approximations of exp / tanh / sigmoid / erf, written with
// plain arithmetic, bit casts and selects so the loops that call them
// auto-vectorize (AVX2/AVX-512 on x86-64, NEON on aarch64) with nothing
// target-specific in the source.  Used by activation.cpp, elementwise.cpp,
// attention.cpp, loss.cpp and softmax.cpp; see activation.cpp for the error
// bounds of each approximation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pk {
namespace fastmath {

constexpr float kSqrt1_2 = 0.70710678118654752440f;  // 1/sqrt(2)

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// e^x within 1 ulp; +inf above ~88.72, 0 below ~-103.9, NaN propagates.
// Branch-free: vectorizes.
inline float fast_exp(float x) {
  x = x < -104.f ? -104.f : x;  // NaN fails both tests and passes through
  x = x > 89.f ? 89.f : x;
  const float kShift = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float z = x * 1.44269504088896341f + kShift;
  const float n = z - kShift;
  float r = x - n * 0.693359375f;  // ln2 = 0.693359375 - 2.12194440e-4 (Cody-Waite)
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.f;
  // n in [-150, 129]: 2^n = 2^n1 * 2^n2 with both halves normal floats.
  const int32_t ni = static_cast<int32_t>(float_to_bits(z) - float_to_bits(kShift));
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  return er * s1 * s2;
}

// tanh(x): Cephes tanhf (odd polynomial below 0.625, 1 - 2 / (e^{2|x|} + 1) above).
inline float fast_tanh(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * (z * p);
  const float big = 1.f - 2.f / (fast_exp(2.f * ax) + 1.f);  // +inf -> 1; NaN stays NaN
  return ax < 0.625f ? small : std::copysign(big, x);
}

inline float fast_sigmoid(float x) { return 1.f / (1.f + fast_exp(-x)); }

// q = 1 + erf(x / sqrt 2) via A&S 7.1.26; *e = exp(-x^2/2) (for the GELU pdf).
inline float one_plus_erf(float x, float* e) {
  const float z = std::fabs(x) * kSqrt1_2;
  const float t = 1.f / (1.f + 0.3275911f * z);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float ez = fast_exp(-(z * z));
  *e = ez;
  const float erfc = (p * t) * ez;  // erfc(|x|/sqrt2)
  return x < 0.f ? erfc : 2.f - erfc;
}

}  // namespace fastmath
}  // namespace pk
