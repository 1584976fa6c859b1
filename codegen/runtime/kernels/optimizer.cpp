// optimizer.cpp — in-place SGD and AdamW updates over an UpdateRegion.
//
// The element order of every operation follows torch.optim's single-tensor
// (foreach=False) implementation, so results agree with PyTorch to float
// rounding.  Scalars that PyTorch computes in Python (double) — 1-dampening,
// 1-lr*wd, the bias corrections, lr/bc1 — are computed in double here too and
// rounded to float once.  Only param[o*stride + j] for j < inner is touched;
// the rest of the parameter stays bit-identical.
#include <cmath>

#include "pock_kernels.h"

namespace pk {

namespace {

// The double that a short decimal literal for f would give (the shortest
// decimal with <= 9 significant digits that rounds to f).  PyTorch computes
// 1-beta and 1-beta^t from the Python double 0.999, while the contract hands
// us the float 0.999f = 0.99900001287...; 1-beta would then be off by 1.3e-5
// relative.  The recovered value is never farther from f than f's own
// rounding, so for arbitrary (non-decimal) betas this is harmless.
double as_decimal(float f) {
  if (!(f > 0.f) || !std::isfinite(f)) return f;
  const int e10 = static_cast<int>(std::floor(std::log10(static_cast<double>(f))));
  for (int digits = 1; digits <= 9; ++digits) {
    const int k = digits - 1 - e10;  // f ~ N * 10^-k with N having `digits` digits
    if (k > 22 || k < -22) break;    // 10^|k| must be exact in double
    const double p10 = std::pow(10.0, k < 0 ? -k : k);
    const double n = std::nearbyint(k >= 0 ? f * p10 : f / p10);
    const double d = k >= 0 ? n / p10 : n * p10;
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

}  // namespace

// torch.optim.SGD:
//   d = g + wd*p;  buf = first ? d : momentum*buf + (1-dampening)*d;
//   d = nesterov ? d + momentum*buf : buf;  p -= lr*d
void sgd_update(float* p, const float* g, float* buf, const UpdateRegion& r, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step) {
  const float wd = weight_decay;
  const float mom = momentum;
  const float damp1 = static_cast<float>(1.0 - static_cast<double>(dampening));
  const bool use_mom = momentum != 0.f;
  for (i64 o = 0; o < r.outer; ++o) {
    float* pp = p + o * r.stride;
    const float* gg = g + o * r.inner;
    float* bb = use_mom ? buf + o * r.inner : nullptr;
    if (!use_mom) {
      for (i64 j = 0; j < r.inner; ++j) {
        const float d = wd != 0.f ? gg[j] + wd * pp[j] : gg[j];
        pp[j] = pp[j] - lr * d;
      }
    } else if (first_step) {
      for (i64 j = 0; j < r.inner; ++j) {
        float d = wd != 0.f ? gg[j] + wd * pp[j] : gg[j];
        bb[j] = d;
        d = nesterov ? d + mom * d : d;
        pp[j] = pp[j] - lr * d;
      }
    } else {
      for (i64 j = 0; j < r.inner; ++j) {
        float d = wd != 0.f ? gg[j] + wd * pp[j] : gg[j];
        const float nb = bb[j] * mom + damp1 * d;
        bb[j] = nb;
        d = nesterov ? d + mom * nb : nb;
        pp[j] = pp[j] - lr * d;
      }
    }
  }
}

// torch.optim.AdamW (amsgrad=False, maximize=False), step is 1-based:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = v*b2 + (1-b2)*g*g;
//   p += -(lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
void adamw_update(float* p, const float* g, float* m, float* v, const UpdateRegion& r, float lr, float beta1,
                  float beta2, float eps, float weight_decay, i64 step) {
  const double lr_d = lr, b1 = as_decimal(beta1), b2 = as_decimal(beta2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(lr_d / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - lr_d * weight_decay);
  const bool do_decay = weight_decay != 0.f;
  const float w = static_cast<float>(1.0 - b1);   // lerp weight
  const float w_c = 1.f - w;                      // used when w >= 0.5 (torch's lerp)
  const float f2 = static_cast<float>(1.0 - b2);
  const float fb2 = beta2;  // == (float)b2
  const float feps = eps;
  for (i64 o = 0; o < r.outer; ++o) {
    float* pp = p + o * r.stride;
    const float* gg = g + o * r.inner;
    float* mm = m + o * r.inner;
    float* vv = v + o * r.inner;
    for (i64 j = 0; j < r.inner; ++j) {
      float pj = pp[j];
      if (do_decay) pj = pj * decay;
      const float gj = gg[j];
      const float mj = w < 0.5f ? mm[j] + w * (gj - mm[j]) : gj - (gj - mm[j]) * w_c;
      const float vj = vv[j] * fb2 + f2 * gj * gj;
      mm[j] = mj;
      vv[j] = vj;
      const float denom = std::sqrt(vj) / bc2_sqrt + feps;
      pp[j] = pj + neg_step_size * (mj / denom);
    }
  }
}

}  // namespace pk
