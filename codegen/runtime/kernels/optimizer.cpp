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
// depend on the thread count.  The loops vectorize; AdamW's sqrt, which GCC
// will not vectorize without -fno-math-errno, runs over a stack block with
// SIMD intrinsics where available (IEEE sqrt is correctly rounded, so every
// path gives the same bits) and std::sqrt otherwise.
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {

constexpr i64 kGrain = 1 << 15;  // elements per chunk, at least
constexpr i64 kAlign = 64;
constexpr i64 kBlock = 256;      // AdamW's stack block

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

// a[0:n] = sqrt(a[0:n]).
inline void sqrt_inplace(float* a, i64 n) {
  i64 i = 0;
#if defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, _mm256_sqrt_ps(_mm256_loadu_ps(a + i)));
#elif defined(__aarch64__) && defined(__ARM_NEON)
  for (; i + 4 <= n; i += 4) vst1q_f32(a + i, vsqrtq_f32(vld1q_f32(a + i)));
#endif
  for (; i < n; ++i) a[i] = std::sqrt(a[i]);
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

// One row of SGD: kMode 0 no momentum, 1 first momentum step, 2 later steps.
template <int kMode, bool kWd, bool kNesterov>
void sgd_row(float* pp, const float* gg, float* bb, i64 j0, i64 j1, float lr, float wd, float mom, float damp1) {
  for (i64 j = j0; j < j1; ++j) {
    float d = kWd ? gg[j] + wd * pp[j] : gg[j];
    if (kMode == 1) {
      bb[j] = d;
      d = kNesterov ? d + mom * d : d;
    } else if (kMode == 2) {
      const float nb = bb[j] * mom + damp1 * d;
      bb[j] = nb;
      d = kNesterov ? d + mom * nb : nb;
    }
    pp[j] = pp[j] - lr * d;
  }
}

}  // namespace

// torch.optim.SGD:
//   d = g + wd*p;  buf = first ? d : momentum*buf + (1-dampening)*d;
//   d = nesterov ? d + momentum*buf : buf;  p -= lr*d
bool sgd_update(float* p, const float* g, float* buf, const UpdateRegion& r, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step, bool check_finite) {
  if (check_finite && region_has_nonfinite(g, r)) return false;
  const float wd = weight_decay;
  const float mom = momentum;
  const float damp1 = static_cast<float>(1.0 - static_cast<double>(dampening));
  const bool use_mom = momentum != 0.f;
  const int mode = !use_mom ? 0 : first_step ? 1 : 2;
  for_region(r, [&](i64 o, i64 j0, i64 j1) {
    float* pp = p + o * r.stride;
    const float* gg = g + o * r.inner;
    float* bb = use_mom ? buf + o * r.inner : nullptr;
    // The loop-invariant switches become template arguments so every variant vectorizes.
    const int key = mode * 4 + (wd != 0.f ? 2 : 0) + (nesterov ? 1 : 0);
    switch (key) {
#define PK_SGD_CASE(K)                                                                   \
  case K:                                                                                \
    sgd_row<(K) / 4, ((K) & 2) != 0, ((K) & 1) != 0>(pp, gg, bb, j0, j1, lr, wd, mom, damp1); \
    break;
      PK_SGD_CASE(0) PK_SGD_CASE(1) PK_SGD_CASE(2) PK_SGD_CASE(3)
      PK_SGD_CASE(4) PK_SGD_CASE(5) PK_SGD_CASE(6) PK_SGD_CASE(7)
      PK_SGD_CASE(8) PK_SGD_CASE(9) PK_SGD_CASE(10) PK_SGD_CASE(11)
#undef PK_SGD_CASE
    }
  });
  return true;
}

// torch.optim.AdamW (amsgrad=False, maximize=False), step is 1-based:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = v*b2 + (1-b2)*g*g;
//   p += -(lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
bool adamw_update(float* p, const float* g, float* m, float* v, const UpdateRegion& r, float lr, float beta1,
                  float beta2, float eps, float weight_decay, i64 step, bool check_finite) {
  if (check_finite && region_has_nonfinite(g, r)) return false;
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
  // decay is exactly 1 without weight decay (pj * 1 == pj), so it is always applied.
  (void)do_decay;
  const bool lerp_lo = w < 0.5f;
  for_region(r, [&](i64 o, i64 j0, i64 j1) {
    float* pp = p + o * r.stride;
    const float* gg = g + o * r.inner;
    float* mm = m + o * r.inner;
    float* vv = v + o * r.inner;
    float den[kBlock];
    for (i64 b0 = j0; b0 < j1; b0 += kBlock) {
      const i64 nb = j1 - b0 < kBlock ? j1 - b0 : kBlock;
      float* pb = pp + b0;
      const float* gb = gg + b0;
      float* mb = mm + b0;
      float* vb = vv + b0;
      if (lerp_lo) {
        for (i64 j = 0; j < nb; ++j) mb[j] = mb[j] + w * (gb[j] - mb[j]);
      } else {
        for (i64 j = 0; j < nb; ++j) mb[j] = gb[j] - (gb[j] - mb[j]) * w_c;
      }
      for (i64 j = 0; j < nb; ++j) {
        const float vj = vb[j] * fb2 + f2 * gb[j] * gb[j];
        vb[j] = vj;
        den[j] = vj;
      }
      sqrt_inplace(den, nb);
      for (i64 j = 0; j < nb; ++j) pb[j] = pb[j] * decay + neg_step_size * (mb[j] / (den[j] / bc2_sqrt + feps));
    }
  });
  return true;
}

}  // namespace pk
