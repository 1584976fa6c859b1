// activation.cpp — pointwise activations, forward and backward side by side.
//
// Formulas follow PyTorch's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp
// and UnaryOps).  The transcendental ones (sigmoid, tanh, silu, both GELUs) do
// not call <cmath>'s exp/tanh/erf, which GCC cannot vectorize: they use the
// branch-free float approximations in fast_math.h, written with plain arithmetic, bit
// casts and selects so the loops auto-vectorize (AVX2/AVX-512 on x86-64, NEON
// on aarch64) with nothing target-specific in the source:
//
//   fast_exp   Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, with the
//              Cephes expf polynomial for e^r and 2^n applied as two exact
//              power-of-two factors (so subnormal results come out right).
//              Max error 1 ulp against glibc expf over [-103, 89]; overflows to
//              +inf above ~88.72, underflows to 0 below ~-103.9, NaN propagates.
//   fast_tanh  Cephes tanhf: the odd polynomial x + x^3 P(x^2) for |x| < 0.625,
//              1 - 2 / (e^{2|x|} + 1) with the sign of x above (a few ulp).
//   erf        Abramowitz & Stegun 7.1.26 (Hastings' rational approximation):
//              erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^{-z^2},
//              t = 1 / (1 + p z) for z >= 0, max abs error 1.5e-7 (the same
//              approximation as PyTorch's AVX2/AVX-512 Vectorized<float>::erf).
//              GELU needs 1 + erf(x/sqrt2): for x < 0 that is erfc(|x|/sqrt2)
//              itself, so it is used directly (no 1 - (1 - q) cancellation).
//   tanh GELU  0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same
//              value without the cancellation of 1 + tanh(u) for u << 0.
//
// Every kernel splits [0, n) over the threads with pk::parallel_for in chunks
// of at least kGrain elements whose boundaries are rounded to multiples of
// kAlign: element i always goes through the same instructions (vector body,
// never a remainder that a thread split created), so results are bit-identical
// for any thread count.  Outputs may alias inputs (y == x, dx == dy).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fast_math.h"
#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;       // 1/sqrt(2*pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;      // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr i64 kGrain = 1 << 15;
constexpr i64 kAlign = 64;

using fastmath::fast_exp;
using fastmath::fast_sigmoid;
using fastmath::fast_tanh;
using fastmath::one_plus_erf;

// y[i] = f(x[i]) and dx[i] = f(dy[i], s[i]) over [0, n), threaded.
template <class F>
inline void map1(const float* x, float* y, i64 n, F f) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) y[i] = f(x[i]);
  });
}
template <class F>
inline void map2(const float* dy, const float* s, float* dx, i64 n, F f) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) dx[i] = f(dy[i], s[i]);
  });
}

}  // namespace

// y = max(x, 0); NaN propagates (like torch.relu).
void relu_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](float v) { return v < 0.f ? 0.f : v; });
}

// dx = dy where y > 0, else 0 (PyTorch threshold_backward on the output).
void relu_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2(dy, y, dx, n, [](float g, float v) { return v > 0.f ? g : 0.f; });
}

// y = clamp(x, lo, hi).
void hardtanh_fwd(const float* x, float* y, i64 n, float lo, float hi) {
  map1(x, y, n, [lo, hi](float v) {
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
  });
}

// dx = dy for lo < x < hi, 0 otherwise (the boundaries get 0, like PyTorch).
void hardtanh_bwd(const float* dy, const float* x, float* dx, i64 n, float lo, float hi) {
  map2(dy, x, dx, n, [lo, hi](float g, float v) { return (v > lo && v < hi) ? g : 0.f; });
}

// y = 1 / (1 + exp(-x)).
void sigmoid_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](float v) { return fast_sigmoid(v); });
}

// dx = dy * (1 - y) * y.
void sigmoid_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2(dy, y, dx, n, [](float g, float v) { return g * (1.f - v) * v; });
}

// y = tanh(x).
void tanh_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](float v) { return fast_tanh(v); });
}

// dx = dy * (1 - y^2).
void tanh_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2(dy, y, dx, n, [](float g, float v) { return g * (1.f - v * v); });
}

// y = x * sigmoid(x).
void silu_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](float v) { return v / (1.f + fast_exp(-v)); });
}

// dx = dy * s * (1 + x * (1 - s)),  s = sigmoid(x).
void silu_bwd(const float* dy, const float* x, float* dx, i64 n) {
  map2(dy, x, dx, n, [](float g, float v) {
    const float s = fast_sigmoid(v);
    return g * s * (1.f + v * (1.f - s));
  });
}

// erf form:  y = 0.5 x (1 + erf(x / sqrt 2))
// tanh form: y = 0.5 x (1 + tanh(u)) = x * sigmoid(2u),  u = sqrt(2/pi) (x + 0.044715 x^3)
void gelu_fwd(const float* x, float* y, i64 n, bool approximate) {
  if (approximate) {
    map1(x, y, n, [](float v) {
      const float u = kSqrt2OverPi * (v + kGeluC * (v * v * v));
      return v / (1.f + fast_exp(-2.f * u));
    });
  } else {
    map1(x, y, n, [](float v) {
      float e;
      return 0.5f * v * one_plus_erf(v, &e);
    });
  }
}

// erf form:  dx = dy * (Phi(x) + x * phi(x))
// tanh form: dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2)),
//            t = tanh(u); with s = sigmoid(2u) = 0.5 (1 + t) and 1 - t^2 = 4 s (1 - s):
//            dx = dy * (s + 2 x s (1 - s) u'),  s (1 - s) = e s^2 with e = exp(-2u)
//            (-2u clamped to 88 so e stays finite: s ~ 1e-38 there, the true value ~ 0).
void gelu_bwd(const float* dy, const float* x, float* dx, i64 n, bool approximate) {
  if (approximate) {
    map2(dy, x, dx, n, [](float g, float v) {
      // |x| >= 10: s is exactly 0 or 1 in float; clamping keeps x^3 and u' finite for huge |x|
      // (dx = 0 resp. dy there, also for +-inf; PyTorch's formula gives NaN at +-inf).
      v = v < -10.f ? -10.f : v;
      v = v > 10.f ? 10.f : v;
      const float v2 = v * v;
      const float u = kSqrt2OverPi * (v + kGeluC * (v2 * v));
      float a = -2.f * u;
      a = a > 88.f ? 88.f : a;
      const float e = fast_exp(a);
      const float s = 1.f / (1.f + e);
      const float dinner = kSqrt2OverPi * (1.f + 3.f * kGeluC * v2);
      return g * (s + 2.f * v * ((e * s) * s) * dinner);
    });
  } else {
    map2(dy, x, dx, n, [](float g, float v) {
      float e;
      const float cdf = 0.5f * one_plus_erf(v, &e);
      const float pdf = kInvSqrt2Pi * e;
      return g * (cdf + v * pdf);
    });
  }
}

}  // namespace pk
