// pointwise.comp — activations and unary maths, forward and backward side by side
// (same formulas as kernels/activation.cpp and kernels/elementwise.cpp).
//   forward  (op < PW_BACKWARD_BASE): y[i] = f(x[i])
//   backward (op >= PW_BACKWARD_BASE): dx[i] = f'(dy[i], s[i]), s = the saved input or output
// Op codes: op_codes.glsl, generated from backends/vulkan_ops.py.
#version 450
#include "common.glsl"
#include "op_codes.glsl"
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
    case PW_RELU: return v < 0.0 ? 0.0 : v;                               // relu
    case PW_HARDTANH: return min(max(v, c0), c1);                              // hardtanh / relu6
    case PW_SIGMOID: return sigm(v);                                          // sigmoid
    case PW_TANH: return tanh(v);                                          // tanh
    case PW_SILU: return v / (1.0 + pexp(-v));                              // silu
    case PW_GELU: return 0.5 * v * one_plus_erf(v, e);                     // gelu (erf)
    case PW_GELU_TANH: return v / (1.0 + pexp(-2.0 * SQRT_2_OVER_PI * (v + GELU_C * (v * v * v))));  // gelu (tanh)
    case PW_EXP: return pexp(v);
    case PW_LOG: return log(v);
    case PW_SQRT: return sqrt(v);
    case PW_RSQRT: return 1.0 / sqrt(v);
    case PW_NEG: return -v;
    case PW_ABS: return abs(v);
    case PW_RECIPROCAL: return 1.0 / v;
    case PW_ADD_SCALAR: return v + c0;                                          // add_scalar
    case PW_MUL_SCALAR: return v * c0;                                          // mul_scalar
    case PW_RSUB_SCALAR: return c0 - v;                                          // rsub_scalar
  }
  return 0.0;
}

float backward(uint op, float g, float v, float c0, float c1) {
  float e;
  switch (op) {
    case PW_RELU_BWD: return v > 0.0 ? g : 0.0;                               // relu (v = y)
    case PW_HARDTANH_BWD: return (v > c0 && v < c1) ? g : 0.0;                    // hardtanh (v = x)
    case PW_SIGMOID_BWD: return g * (1.0 - v) * v;                               // sigmoid (v = y)
    case PW_TANH_BWD: return g * (1.0 - v * v);                               // tanh (v = y)
    case PW_SILU_BWD: { float s = sigm(v); return g * s * (1.0 + v * (1.0 - s)); }  // silu (v = x)
    case PW_GELU_BWD: { float cdf = 0.5 * one_plus_erf(v, e); return g * (cdf + v * (INV_SQRT_2PI * e)); }
    case PW_GELU_TANH_BWD: {                                                       // gelu tanh (v = x)
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
  float y = op < PW_BACKWARD_BASE ? forward(op, ldf(pc.p[1] + i), pf(5), pf(6))
                     : backward(op, ldf(pc.p[1] + i), ldf(pc.p[2] + i), pf(5), pf(6));
  stf(pc.p[3] + i, y);
}
