// pointwise.comp — activations and unary maths, forward and backward side by side
// (same formulas as kernels/activation.cpp and kernels/elementwise.cpp).
//   forward  (op < 32): y[i] = f(x[i])
//   backward (op >= 32): dx[i] = f'(dy[i], s[i]), s = the saved input or output
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 op, 1 x0 (dy0), 2 s0, 3 y0 (dx0), 4 n, 5 c0, 6 c1
const float SQRT1_2 = 0.70710678118654752;
const float INV_SQRT_2PI = 0.39894228040143268;
const float SQRT_2_OVER_PI = 0.79788456080286536;
const float GELU_C = 0.044715;

float sigm(float v) { return 1.0 / (1.0 + pexp(-v)); }
// 1 + erf(x / sqrt2) with A&S 7.1.26 (kernels/fast_math.h); e = pexp(-x^2/2).
float one_plus_erf(float x, out float e) {
  float z = abs(x) * SQRT1_2;
  float t = 1.0 / (1.0 + 0.3275911 * z);
  float p = 1.061405429;
  p = p * t - 1.453152027;
  p = p * t + 1.421413741;
  p = p * t - 0.284496736;
  p = p * t + 0.254829592;
  e = pexp(-(z * z));
  float erfc_ = (p * t) * e;
  return x < 0.0 ? erfc_ : 2.0 - erfc_;
}

float forward(uint op, float v, float c0, float c1) {
  float e;
  switch (op) {
    case 0u: return v < 0.0 ? 0.0 : v;                               // relu
    case 1u: return min(max(v, c0), c1);                              // hardtanh / relu6
    case 2u: return sigm(v);                                          // sigmoid
    case 3u: return tanh(v);                                          // tanh
    case 4u: return v / (1.0 + pexp(-v));                              // silu
    case 5u: return 0.5 * v * one_plus_erf(v, e);                     // gelu (erf)
    case 6u: return v / (1.0 + pexp(-2.0 * SQRT_2_OVER_PI * (v + GELU_C * (v * v * v))));  // gelu (tanh)
    case 7u: return pexp(v);
    case 8u: return log(v);
    case 9u: return sqrt(v);
    case 10u: return 1.0 / sqrt(v);
    case 11u: return -v;
    case 12u: return abs(v);
    case 13u: return 1.0 / v;
    case 14u: return v + c0;                                          // add_scalar
    case 15u: return v * c0;                                          // mul_scalar
    case 16u: return c0 - v;                                          // rsub_scalar
  }
  return 0.0;
}

float backward(uint op, float g, float v, float c0, float c1) {
  float e;
  switch (op) {
    case 32u: return v > 0.0 ? g : 0.0;                               // relu (v = y)
    case 33u: return (v > c0 && v < c1) ? g : 0.0;                    // hardtanh (v = x)
    case 34u: return g * (1.0 - v) * v;                               // sigmoid (v = y)
    case 35u: return g * (1.0 - v * v);                               // tanh (v = y)
    case 36u: { float s = sigm(v); return g * s * (1.0 + v * (1.0 - s)); }  // silu (v = x)
    case 37u: { float cdf = 0.5 * one_plus_erf(v, e); return g * (cdf + v * (INV_SQRT_2PI * e)); }
    case 38u: {                                                       // gelu tanh (v = x)
      v = clamp(v, -10.0, 10.0);
      float v2 = v * v;
      float u = SQRT_2_OVER_PI * (v + GELU_C * (v2 * v));
      float ex = pexp(min(-2.0 * u, 88.0));
      float s = 1.0 / (1.0 + ex);
      return g * (s + 2.0 * v * ((ex * s) * s) * (SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * v2)));
    }
  }
  return 0.0;
}

void main() {
  uint i = flat_id();
  if (i >= pc.p[4]) return;
  uint op = pc.p[0];
  float y = op < 32u ? forward(op, ldf(pc.p[1] + i), pf(5), pf(6))
                     : backward(op, ldf(pc.p[1] + i), ldf(pc.p[2] + i), pf(5), pf(6));
  stf(pc.p[3] + i, y);
}
