// activation.cpp — pointwise activations, forward and backward side by side.
// Formulas follow PyTorch's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp
// and UnaryOps); transcendental calls go through <cmath>.  The simple loops
// without transcendentals (relu, hardtanh, the *_bwd that use the output)
// auto-vectorize.  Every kernel splits [0, n) over the threads in chunks of
// at least kGrain elements (pk::parallel_for).
#include <cmath>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {
constexpr float kSqrt1_2 = 0.70710678118654752440f;          // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;       // 1/sqrt(2*pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;      // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr i64 kGrain = 1 << 15;
}  // namespace

// y = max(x, 0); NaN propagates (like torch.relu).
void relu_fwd(const float* x, float* y, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) y[i] = x[i] < 0.f ? 0.f : x[i];
  });
}

// dx = dy where y > 0, else 0 (PyTorch threshold_backward on the output).
void relu_bwd(const float* dy, const float* y, float* dx, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
  });
}

// y = clamp(x, lo, hi).
void hardtanh_fwd(const float* x, float* y, i64 n, float lo, float hi) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) {
      float v = x[i] < lo ? lo : x[i];
      y[i] = v > hi ? hi : v;
    }
  });
}

// dx = dy for lo < x < hi, 0 otherwise (the boundaries get 0, like PyTorch).
void hardtanh_bwd(const float* dy, const float* x, float* dx, i64 n, float lo, float hi) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) dx[i] = (x[i] > lo && x[i] < hi) ? dy[i] : 0.f;
  });
}

// y = 1 / (1 + exp(-x)).
void sigmoid_fwd(const float* x, float* y, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) y[i] = 1.f / (1.f + std::exp(-x[i]));
  });
}

// dx = dy * (1 - y) * y.
void sigmoid_bwd(const float* dy, const float* y, float* dx, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) dx[i] = dy[i] * (1.f - y[i]) * y[i];
  });
}

// y = tanh(x).
void tanh_fwd(const float* x, float* y, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) y[i] = std::tanh(x[i]);
  });
}

// dx = dy * (1 - y^2).
void tanh_bwd(const float* dy, const float* y, float* dx, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
  });
}

// y = x * sigmoid(x).
void silu_fwd(const float* x, float* y, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) y[i] = x[i] / (1.f + std::exp(-x[i]));
  });
}

// dx = dy * s * (1 + x * (1 - s)),  s = sigmoid(x).
void silu_bwd(const float* dy, const float* x, float* dx, i64 n) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    for (i64 i = b0; i < b1; ++i) {
      const float s = 1.f / (1.f + std::exp(-x[i]));
      dx[i] = dy[i] * s * (1.f + x[i] * (1.f - s));
    }
  });
}

// erf form:  y = 0.5 x (1 + erf(x / sqrt 2))
// tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_fwd(const float* x, float* y, i64 n, bool approximate) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    if (approximate) {
      for (i64 i = b0; i < b1; ++i) {
        const float v = x[i];
        const float inner = kSqrt2OverPi * (v + kGeluC * v * v * v);
        y[i] = 0.5f * v * (1.f + std::tanh(inner));
      }
    } else {
      for (i64 i = b0; i < b1; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * kSqrt1_2));
    }
  });
}

// erf form:  dx = dy * (Phi(x) + x * phi(x))
// tanh form: dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2)),
//            t = tanh(sqrt(2/pi) (x + 0.044715 x^3))
void gelu_bwd(const float* dy, const float* x, float* dx, i64 n, bool approximate) {
  parallel_for(n, kGrain, [&](i64 b0, i64 b1) {
    if (approximate) {
      for (i64 i = b0; i < b1; ++i) {
        const float v = x[i];
        const float v2 = v * v;
        const float t = std::tanh(kSqrt2OverPi * (v + kGeluC * v2 * v));
        const float dinner = kSqrt2OverPi * (1.f + 3.f * kGeluC * v2);
        dx[i] = dy[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * dinner);
      }
    } else {
      for (i64 i = b0; i < b1; ++i) {
        const float v = x[i];
        const float cdf = 0.5f * (1.f + std::erf(v * kSqrt1_2));
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
      }
    }
  });
}

}  // namespace pk
