// optimizer.cpp — in-place SGD and AdamW updates over an UpdateRegion.
//
// The element order of every operation follows torch.optim's single-tensor
// (foreach=False) implementation, so results agree with PyTorch to float
// rounding.  Scalars that PyTorch computes in Python (double) — 1-dampening,
// 1-lr*wd, the bias corrections, lr/bc1 — are computed in double here too and
// rounded to float once.  Only param[o*stride + j] for j < inner is touched;
// the rest of the parameter stays bit-identical.
//
// Threads: the region is split with pk::parallel_for (whole rows when outer > 1,
// else [0, inner) in chunks whose boundaries are multiples of kAlign); every
// element's arithmetic is the same whatever the split, so the result does not
// depend on the thread count.  The element arithmetic is update_math.h's, which
// the weight-gradient GEMM's fused update uses too (the same bits either way).
#include <atomic>
#include <cmath>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "update_math.h"

namespace pk {

namespace {

constexpr i64 kGrain = 1 << 15;  // elements per chunk, at least
constexpr i64 kAlign = 64;

// f(o, j0, j1) over the region: rows in parallel, or one row's [0, inner) split.
template <class F>
void for_region(const UpdateRegion& r, F&& f) {
  if (r.outer <= 0 || r.inner <= 0) return;
  if (r.outer == 1) {
    const i64 n = r.inner;
    parallel_for(n, kGrain, [&](i64 b, i64 e) {
      b = (b + kAlign - 1) / kAlign * kAlign;
      e = e == n ? n : (e + kAlign - 1) / kAlign * kAlign;
      if (e > n) e = n;
      if (b < e) f(i64{0}, b, e);
    });
    return;
  }
  const i64 rows_grain = r.inner >= kGrain ? 1 : kGrain / r.inner;
  parallel_for(r.outer, rows_grain, [&](i64 b, i64 e) {
    for (i64 o = b; o < e; ++o) f(o, i64{0}, r.inner);
  });
}

// Whether the region of g (packed: row o at o*inner) holds a NaN or inf: the
// non-finite guard folded into the update.  Same split as the update (for_region),
// so each thread scans the chunk it is about to update and finds it in its cache.
// A bit test (exponent all ones), so it holds under any floating-point flags.
bool region_has_nonfinite(const float* g, const UpdateRegion& r) {
  std::atomic<bool> bad{false};
  for_region(r, [&](i64 o, i64 j0, i64 j1) {
    const float* gg = g + o * r.inner;
    uint32_t acc = 0;
    for (i64 j = j0; j < j1; ++j) {
      uint32_t u;
      std::memcpy(&u, gg + j, 4);
      acc |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
    if (acc) bad.store(true, std::memory_order_relaxed);
  });
  return bad.load(std::memory_order_relaxed);
}

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
SgdConsts sgd_consts(float lr, float momentum, float dampening, float weight_decay, bool nesterov,
                     bool first_step) {
  const int mode = momentum == 0.f ? 0 : first_step ? 1 : 2;
  return SgdConsts{lr, weight_decay, momentum, static_cast<float>(1.0 - static_cast<double>(dampening)),
                   mode * 4 + (weight_decay != 0.f ? 2 : 0) + (nesterov ? 1 : 0)};
}

bool sgd_update(float* p, const float* g, float* buf, const UpdateRegion& r, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step, bool check_finite) {
  if (check_finite && region_has_nonfinite(g, r)) return false;
  const SgdConsts c = sgd_consts(lr, momentum, dampening, weight_decay, nesterov, first_step);
  const bool use_mom = momentum != 0.f;
  for_region(r, [&](i64 o, i64 j0, i64 j1) {
    float* bb = use_mom ? buf + o * r.inner + j0 : nullptr;
    upd::sgd_span(p + o * r.stride + j0, g + o * r.inner + j0, bb, j1 - j0, c);
  });
  return true;
}

// torch.optim.AdamW (amsgrad=False, maximize=False), step is 1-based:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = v*b2 + (1-b2)*g*g;
//   p += -(lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
AdamConsts adamw_consts(float lr, float beta1, float beta2, float eps, float weight_decay, i64 step) {
  const double lr_d = lr, b1 = as_decimal(beta1), b2 = as_decimal(beta2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  AdamConsts c;
  c.neg_step_size = static_cast<float>(-(lr_d / bc1));
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  // exactly 1 without weight decay (p * 1 == p), so it is always applied
  c.decay = static_cast<float>(1.0 - lr_d * weight_decay);
  c.w = static_cast<float>(1.0 - b1);  // lerp weight
  c.w_c = 1.f - c.w;                   // used when w >= 0.5 (torch's lerp)
  c.f2 = static_cast<float>(1.0 - b2);
  c.fb2 = beta2;  // == (float)b2
  c.eps = eps;
  c.lerp_lo = c.w < 0.5f;
  return c;
}

bool adamw_update(float* p, const float* g, float* m, float* v, const UpdateRegion& r, float lr, float beta1,
                  float beta2, float eps, float weight_decay, i64 step, bool check_finite) {
  if (check_finite && region_has_nonfinite(g, r)) return false;
  const AdamConsts c = adamw_consts(lr, beta1, beta2, eps, weight_decay, step);
  for_region(r, [&](i64 o, i64 j0, i64 j1) {
    const i64 s = o * r.inner + j0;
    upd::adamw_span(p + o * r.stride + j0, g + s, m + s, v + s, j1 - j0, c);
  });
  return true;
}

}  // namespace pk
