// activation.cpp — pointwise activations, forward and backward side by side.
//
// Formulas follow PyTorch's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp
// and UnaryOps).  The transcendental ones (sigmoid, tanh, silu, both GELUs) do
// not call <cmath>'s exp/tanh/erf, which GCC cannot vectorize: every kernel is
// written over the native vector of simd.h (AVX-512, AVX2+FMA, NEON) with the
// approximations of vec_math.h (the vector forms of fast_math.h's):
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
// kAlign, and every element (the tail too, zero-padded) goes through the same
// vector instructions, so results are bit-identical for any thread count.
// Outputs may alias inputs (y == x, dx == dy).  tests/native/runtime/
// test_vectorized.py checks the disassembly for vector FMAs in these kernels.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"

namespace pk {

namespace {
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;       // 1/sqrt(2*pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;      // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
// Work thresholds (elements per chunk, at least): a thread hand-off costs a few
// microseconds, so the cheap, memory-bound maps stay on one thread up to 2^17
// elements; the transcendental ones (tens of instructions per vector) split at 2^14.
constexpr i64 kGrainCheap = 1 << 17;
constexpr i64 kGrain = 1 << 14;
constexpr i64 kAlign = 64;

using namespace simd;
using vmath::vexp;
using vmath::vone_plus_erf;
using vmath::vsigmoid;
using vmath::vtanh;

// y[i] = f(x[i]) and dx[i] = f(dy[i], s[i]) over [0, n), threaded; f works on vectors.
template <i64 kG = kGrain, class F>
inline void map1(const float* x, float* y, i64 n, F f) {
  parallel_for_aligned(n, kG, kAlign, [&](i64 b, i64 e) { vmath::map_v(x + b, y + b, e - b, f); });
}
template <i64 kG = kGrain, class F>
inline void map2(const float* dy, const float* s, float* dx, i64 n, F f) {
  parallel_for_aligned(n, kG, kAlign, [&](i64 b, i64 e) { vmath::map2_v(dy + b, s + b, dx + b, e - b, f); });
}

}  // namespace

// y = max(x, 0); NaN propagates (like torch.relu).
void relu_fwd(const float* x, float* y, i64 n) {
  map1<kGrainCheap>(x, y, n, [](V v) { return vmax(vzero(), v); });
}

// dx = dy where y > 0, else 0 (PyTorch threshold_backward on the output).
void relu_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2<kGrainCheap>(dy, y, dx, n, [](V g, V v) { return vsel(vgt(v, vzero()), g, vzero()); });
}

// y = clamp(x, lo, hi) (NaN propagates).
void hardtanh_fwd(const float* x, float* y, i64 n, float lo, float hi) {
  map1<kGrainCheap>(x, y, n, [lo, hi](V v) { return vmin(vbcast(hi), vmax(vbcast(lo), v)); });
}

// dx = dy for lo < x < hi, 0 otherwise (the boundaries get 0, like PyTorch).
void hardtanh_bwd(const float* dy, const float* x, float* dx, i64 n, float lo, float hi) {
  map2<kGrainCheap>(dy, x, dx, n, [lo, hi](V g, V v) {
    return vsel(vgt(v, vbcast(lo)), vsel(vlt(v, vbcast(hi)), g, vzero()), vzero());
  });
}

// y = 1 / (1 + exp(-x)).
void sigmoid_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](V v) { return vsigmoid(v); });
}

// dx = dy * (1 - y) * y.
void sigmoid_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2<kGrainCheap>(dy, y, dx, n, [](V g, V v) { return vmul(vmul(g, vsub(vbcast(1.f), v)), v); });
}

// y = tanh(x).
void tanh_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](V v) { return vtanh(v); });
}

// dx = dy * (1 - y^2).
void tanh_bwd(const float* dy, const float* y, float* dx, i64 n) {
  map2<kGrainCheap>(dy, y, dx, n, [](V g, V v) { return vmul(g, vsub(vbcast(1.f), vmul(v, v))); });
}

// y = x * sigmoid(x).
void silu_fwd(const float* x, float* y, i64 n) {
  map1(x, y, n, [](V v) { return vdiv(v, vadd(vbcast(1.f), vexp(vsub(vzero(), v)))); });
}

// dx = dy * s * (1 + x * (1 - s)),  s = sigmoid(x).
void silu_bwd(const float* dy, const float* x, float* dx, i64 n) {
  map2(dy, x, dx, n, [](V g, V v) {
    const V s = vsigmoid(v);
    return vmul(vmul(g, s), vfma(v, vsub(vbcast(1.f), s), vbcast(1.f)));
  });
}

// erf form:  y = 0.5 x (1 + erf(x / sqrt 2))
// tanh form: y = 0.5 x (1 + tanh(u)) = x * sigmoid(2u),  u = sqrt(2/pi) (x + 0.044715 x^3)
void gelu_fwd(const float* x, float* y, i64 n, bool approximate) {
  if (approximate) {
    map1(x, y, n, [](V v) {
      const V u = vmul(vbcast(kSqrt2OverPi), vfma(vbcast(kGeluC), vmul(vmul(v, v), v), v));
      return vdiv(v, vadd(vbcast(1.f), vexp(vmul(vbcast(-2.f), u))));
    });
  } else {
    map1(x, y, n, [](V v) {
      V e;
      return vmul(vmul(vbcast(0.5f), v), vone_plus_erf(v, &e));
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
    map2(dy, x, dx, n, [](V g, V v) {
      // |x| >= 10: s is exactly 0 or 1 in float; clamping keeps x^3 and u' finite for huge |x|
      // (dx = 0 resp. dy there, also for +-inf; PyTorch's formula gives NaN at +-inf).
      v = vmin(vbcast(10.f), vmax(vbcast(-10.f), v));
      const V v2 = vmul(v, v);
      const V u = vmul(vbcast(kSqrt2OverPi), vfma(vbcast(kGeluC), vmul(v2, v), v));
      const V a = vmin(vbcast(88.f), vmul(vbcast(-2.f), u));
      const V e = vexp(a);
      const V s = vdiv(vbcast(1.f), vadd(vbcast(1.f), e));
      const V dinner = vmul(vbcast(kSqrt2OverPi), vfma(vbcast(3.f * kGeluC), v2, vbcast(1.f)));
      const V t = vmul(vmul(vmul(vbcast(2.f), v), vmul(vmul(e, s), s)), dinner);
      return vmul(g, vadd(s, t));
    });
  } else {
    map2(dy, x, dx, n, [](V g, V v) {
      V e;
      const V cdf = vmul(vbcast(0.5f), vone_plus_erf(v, &e));
      const V pdf = vmul(vbcast(kInvSqrt2Pi), e);
      return vmul(g, vfma(v, pdf, cdf));
    });
  }
}

}  // namespace pk
