// vec_math.h — internal to the kernels (not part of the public runtime API): the
// fast_math.h approximations (exp, tanh, sigmoid, 1 + erf) written over the
// native vector V of simd.h, so the hot transcendental loops run on AVX-512,
// AVX2+FMA and NEON explicitly (GCC does not vectorize the scalar versions on
// AVX2 or NEON).  Same algorithms and constants as fast_math.h, evaluated with
// fused multiply-adds: within the same error bounds (see activation.cpp), not
// necessarily bit-identical to the scalar functions, so a kernel must send
// every element through one of the two (map_v below sends all through V).
#pragma once

#include <cstring>

#include "pock_kernels.h"
#include "simd.h"

namespace pk {
namespace vmath {

using simd::kW;
using simd::V;
using simd::vbcast;

// e^x within 1 ulp; +inf above ~88.72, 0 below ~-103.9, NaN propagates.
inline V vexp(V x) {
  using namespace simd;
  x = vmax(vbcast(-104.f), x);  // maxps semantics: a NaN x comes through
  x = vmin(vbcast(89.f), x);
  const V kShift = vbcast(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = vsub(vfma(x, vbcast(1.44269504088896341f), kShift), kShift);
  V r = vfma(n, vbcast(-0.693359375f), x);  // Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4
  r = vfma(n, vbcast(2.12194440e-4f), r);
  V p = vbcast(1.9875691500e-4f);
  p = vfma(p, r, vbcast(1.3981999507e-3f));
  p = vfma(p, r, vbcast(8.3334519073e-3f));
  p = vfma(p, r, vbcast(4.1665795894e-2f));
  p = vfma(p, r, vbcast(1.6666665459e-1f));
  p = vfma(p, r, vbcast(5.0000001201e-1f));
  const V er = vadd(vfma(p, vmul(r, r), r), vbcast(1.f));
  return vscale2(er, n);
}

// tanh(x): odd polynomial below |x| = 0.625, 1 - 2 / (e^{2|x|} + 1) with x's sign above.
inline V vtanh(V x) {
  using namespace simd;
  const V ax = vabs(x);
  const V z = vmul(x, x);
  V p = vbcast(-5.70498872745e-3f);
  p = vfma(p, z, vbcast(2.06390887954e-2f));
  p = vfma(p, z, vbcast(-5.37397155531e-2f));
  p = vfma(p, z, vbcast(1.33314422036e-1f));
  p = vfma(p, z, vbcast(-3.33332819422e-1f));
  const V small = vfma(x, vmul(z, p), x);
  const V one = vbcast(1.f);
  const V big = vsub(one, vdiv(vbcast(2.f), vadd(vexp(vadd(ax, ax)), one)));  // +inf -> 1, NaN stays
  return vsel(vlt(ax, vbcast(0.625f)), small, vxorsign(big, x));  // big >= 0: flip by x's sign
}

// 1 / (1 + e^-x)
inline V vsigmoid(V x) {
  using namespace simd;
  const V one = vbcast(1.f);
  return vdiv(one, vadd(one, vexp(vsub(vzero(), x))));
}

// q = 1 + erf(x / sqrt 2) (A&S 7.1.26); *e = exp(-x^2/2).
inline V vone_plus_erf(V x, V* e) {
  using namespace simd;
  const V z = vmul(vabs(x), vbcast(0.70710678118654752440f));
  const V t = vdiv(vbcast(1.f), vfma(z, vbcast(0.3275911f), vbcast(1.f)));
  V p = vbcast(1.061405429f);
  p = vfma(p, t, vbcast(-1.453152027f));
  p = vfma(p, t, vbcast(1.421413741f));
  p = vfma(p, t, vbcast(-0.284496736f));
  p = vfma(p, t, vbcast(0.254829592f));
  const V ez = vexp(vsub(vzero(), vmul(z, z)));
  *e = ez;
  const V erfc = vmul(vmul(p, t), ez);  // erfc(|x|/sqrt2)
  return vsel(vlt(x, vzero()), erfc, vsub(vbcast(2.f), erfc));
}

// y[0:n] = f(x[0:n]) with f: V -> V; the tail goes through f too (zero-padded),
// so every element gets the same instructions wherever a thread split falls.
template <class F>
inline void map_v(const float* x, float* y, i64 n, F&& f) {
  i64 i = 0;
  for (; i + kW <= n; i += kW) simd::vstore(y + i, f(simd::vload(x + i)));
  if (i < n) {
    float t[kW] = {};
    std::memcpy(t, x + i, sizeof(float) * (n - i));
    simd::vstore(t, f(simd::vload(t)));
    std::memcpy(y + i, t, sizeof(float) * (n - i));
  }
}

// z[0:n] = f(x[0:n], y[0:n]) with f: (V, V) -> V; the tail as in map_v.
template <class F>
inline void map2_v(const float* x, const float* y, float* z, i64 n, F&& f) {
  i64 i = 0;
  for (; i + kW <= n; i += kW) simd::vstore(z + i, f(simd::vload(x + i), simd::vload(y + i)));
  if (i < n) {
    float a[kW] = {}, b[kW] = {};
    std::memcpy(a, x + i, sizeof(float) * (n - i));
    std::memcpy(b, y + i, sizeof(float) * (n - i));
    simd::vstore(a, f(simd::vload(a), simd::vload(b)));
    std::memcpy(z + i, a, sizeof(float) * (n - i));
  }
}

// Row max (NaN skipped like a scalar x > m test: vmax(x, m) keeps m when x is NaN).
inline float vrow_max(const float* x, i64 n) {
  using namespace simd;
  const float kNinf = -__builtin_inff();
  V a = vbcast(kNinf), b = vbcast(kNinf);
  i64 i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    a = vmax(vload(x + i), a);
    b = vmax(vload(x + i + kW), b);
  }
  for (; i + kW <= n; i += kW) a = vmax(vload(x + i), a);
  float t[kW];
  vstore(t, vmax(a, b));
  float m = kNinf;
  for (int j = 0; j < kW; ++j) m = t[j] > m ? t[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum of e^(x[i] - m) over a row: float lanes within blocks of 256, blocks added in double.
inline double vsum_exp(const float* x, i64 n, float m) {
  using namespace simd;
  constexpr i64 kBlk = 256;
  const V vm = vbcast(m);
  double s = 0;
  for (i64 i0 = 0; i0 < n; i0 += kBlk) {
    const i64 e = n - i0 < kBlk ? n : i0 + kBlk;
    V a = vzero(), b = vzero();
    i64 i = i0;
    for (; i + 2 * kW <= e; i += 2 * kW) {
      a = vadd(a, vexp(vsub(vload(x + i), vm)));
      b = vadd(b, vexp(vsub(vload(x + i + kW), vm)));
    }
    for (; i + kW <= e; i += kW) a = vadd(a, vexp(vsub(vload(x + i), vm)));
    if (i < e) {  // tail: padded with -inf, whose exp is 0
      float t[kW];
      for (int j = 0; j < kW; ++j) t[j] = i + j < e ? x[i + j] : -__builtin_inff();
      b = vadd(b, vexp(vsub(vload(t), vm)));
    }
    s += static_cast<double>(vsum(vadd(a, b)));
  }
  return s;
}

// y[i] = e^(x[i] - m) for i < n (y may alias x); returns their sum (float lanes within
// blocks of 256, the blocks added in double).  Every element goes through vexp.
inline double vexp_store_sum(const float* x, float* y, i64 n, float m) {
  using namespace simd;
  constexpr i64 kBlk = 256;
  const V vm = vbcast(m);
  double s = 0;
  for (i64 i0 = 0; i0 < n; i0 += kBlk) {
    const i64 e = n - i0 < kBlk ? n : i0 + kBlk;
    V a = vzero(), b = vzero();
    i64 i = i0;
    for (; i + 2 * kW <= e; i += 2 * kW) {
      const V p = vexp(vsub(vload(x + i), vm)), q = vexp(vsub(vload(x + i + kW), vm));
      vstore(y + i, p);
      vstore(y + i + kW, q);
      a = vadd(a, p);
      b = vadd(b, q);
    }
    for (; i + kW <= e; i += kW) {
      const V p = vexp(vsub(vload(x + i), vm));
      vstore(y + i, p);
      a = vadd(a, p);
    }
    if (i < e) {  // tail: padded with -inf, whose exp is 0
      float t[kW];
      for (int j = 0; j < kW; ++j) t[j] = i + j < e ? x[i + j] : -__builtin_inff();
      const V p = vexp(vsub(vload(t), vm));
      vstore(t, p);
      for (i64 j = 0; j < e - i; ++j) y[i + j] = t[j];
      b = vadd(b, p);
    }
    s += static_cast<double>(vsum(vadd(a, b)));
  }
  return s;
}

// Sum of x[0:n]: float lanes within blocks of 256, the blocks added in double.
inline double vsum_blocks(const float* x, i64 n) {
  using namespace simd;
  constexpr i64 kBlk = 256;
  double s = 0;
  for (i64 i0 = 0; i0 < n; i0 += kBlk) {
    const i64 e = n - i0 < kBlk ? n : i0 + kBlk;
    V a = vzero(), b = vzero();
    i64 i = i0;
    for (; i + 2 * kW <= e; i += 2 * kW) {
      a = vadd(a, vload(x + i));
      b = vadd(b, vload(x + i + kW));
    }
    for (; i + kW <= e; i += kW) a = vadd(a, vload(x + i));
    float r = vsum(vadd(a, b));
    for (; i < e; ++i) r += x[i];
    s += static_cast<double>(r);
  }
  return s;
}

}  // namespace vmath
}  // namespace pk
