// update_math.h — the element arithmetic of the SGD and AdamW updates, shared by the
// update kernels (optimizer.cpp) and the weight-gradient GEMM's fused update epilogue
// (gemm.cpp via linear.cpp), so a fused update gives the same bits as gradient-then-update.
//
// Every element goes through the same simd.h vector code: whole vectors in place, and a
// tail of fewer than kW elements through a zero-padded vector on the stack (never a
// separate scalar formula that the compiler could contract differently).  Each
// multiply-add is spelled as vfma where PyTorch's formula has one; everything else is
// IEEE add/sub/mul/div/sqrt, so the lane a value sits in does not change its result.
// Scalars that PyTorch computes in Python (double) are made in double and rounded once
// (sgd_consts, adamw_consts).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "pock_kernels.h"
#include "simd.h"

namespace pk {

struct SgdConsts {
  float lr, wd, mom, damp1;
  int key;  // mode * 4 + (wd != 0) * 2 + nesterov; mode 0 no momentum, 1 first momentum step, 2 later
};

struct AdamConsts {
  float neg_step_size, bc2_sqrt, decay, w, w_c, f2, fb2, eps;
  bool lerp_lo;
};

SgdConsts sgd_consts(float lr, float momentum, float dampening, float weight_decay, bool nesterov, bool first_step);
AdamConsts adamw_consts(float lr, float beta1, float beta2, float eps, float weight_decay, i64 step);

namespace upd {
using namespace simd;

// p, b: n elements (b unused without momentum); g: the gradient.
template <int kMode, bool kWd, bool kNest>
inline void sgd_vec(float* p, const float* g, float* b, const SgdConsts& c) {
  const V pv = vload(p);
  V d = vload(g);
  if (kWd) d = vfma(vbcast(c.wd), pv, d);
  if (kMode == 1) {
    vstore(b, d);
    if (kNest) d = vfma(vbcast(c.mom), d, d);
  } else if (kMode == 2) {
    const V nb = vfma(vload(b), vbcast(c.mom), vmul(vbcast(c.damp1), d));
    vstore(b, nb);
    d = kNest ? vfma(vbcast(c.mom), nb, d) : nb;
  }
  vstore(p, vfma(vbcast(-c.lr), d, pv));
}

// f(p, g, b) on kW-element pointers over [0, n): in place, then the tail padded.
template <class F>
inline void spans3(float* p, const float* g, float* b, i64 n, F&& f) {
  i64 j = 0;
  for (; j + kW <= n; j += kW) f(p + j, g + j, b ? b + j : nullptr);
  if (j < n) {
    const i64 r = n - j;
    alignas(64) float tp[kW] = {}, tg[kW] = {}, tb[kW] = {};
    std::memcpy(tp, p + j, r * 4);
    std::memcpy(tg, g + j, r * 4);
    if (b) std::memcpy(tb, b + j, r * 4);
    f(tp, tg, b ? tb : nullptr);
    std::memcpy(p + j, tp, r * 4);
    if (b) std::memcpy(b + j, tb, r * 4);
  }
}

template <int kMode, bool kWd, bool kNest>
inline void sgd_span_t(float* p, const float* g, float* b, i64 n, const SgdConsts& c) {
  spans3(p, g, b, n, [&](float* pp, const float* gg, float* bb) { sgd_vec<kMode, kWd, kNest>(pp, gg, bb, c); });
}

// The SGD update of n contiguous elements (b: the momentum buffer, nullptr without momentum).
inline void sgd_span(float* p, const float* g, float* b, i64 n, const SgdConsts& c) {
  switch (c.key) {
#define PK_SGD_CASE(K) \
  case K: sgd_span_t<(K) / 4, ((K) & 2) != 0, ((K) & 1) != 0>(p, g, b, n, c); break;
    PK_SGD_CASE(0) PK_SGD_CASE(1) PK_SGD_CASE(2) PK_SGD_CASE(3)
    PK_SGD_CASE(4) PK_SGD_CASE(5) PK_SGD_CASE(6) PK_SGD_CASE(7)
    PK_SGD_CASE(8) PK_SGD_CASE(9) PK_SGD_CASE(10) PK_SGD_CASE(11)
#undef PK_SGD_CASE
    default: break;
  }
}

inline void adamw_vec(float* p, const float* g, float* m, float* v, const AdamConsts& c) {
  const V gv = vload(g);
  const V mv = vload(m);
  // torch's lerp: m + w (g - m) for w < 0.5, else g - (g - m)(1 - w)
  const V nm = c.lerp_lo ? vfma(vbcast(c.w), vsub(gv, mv), mv) : vfma(vsub(mv, gv), vbcast(c.w_c), gv);
  vstore(m, nm);
  const V nv = vfma(vload(v), vbcast(c.fb2), vmul(vmul(vbcast(c.f2), gv), gv));
  vstore(v, nv);
  const V den = vadd(vdiv(vsqrt(nv), vbcast(c.bc2_sqrt)), vbcast(c.eps));
  vstore(p, vfma(vload(p), vbcast(c.decay), vmul(vbcast(c.neg_step_size), vdiv(nm, den))));
}

// The AdamW update of n contiguous elements.
inline void adamw_span(float* p, const float* g, float* m, float* v, i64 n, const AdamConsts& c) {
  i64 j = 0;
  for (; j + kW <= n; j += kW) adamw_vec(p + j, g + j, m + j, v + j, c);
  if (j < n) {
    const i64 r = n - j;
    alignas(64) float tp[kW] = {}, tg[kW] = {}, tm[kW] = {}, tv[kW] = {};
    std::memcpy(tp, p + j, r * 4);
    std::memcpy(tg, g + j, r * 4);
    std::memcpy(tm, m + j, r * 4);
    std::memcpy(tv, v + j, r * 4);
    adamw_vec(tp, tg, tm, tv, c);
    std::memcpy(p + j, tp, r * 4);
    std::memcpy(m + j, tm, r * 4);
    std::memcpy(v + j, tv, r * 4);
  }
}

// Whether g[0:n] holds a NaN or inf (exponent all ones: a bit test, so it holds under
// any floating-point flags).
inline bool has_nonfinite(const float* g, i64 n) {
  uint32_t acc = 0;
  for (i64 j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, g + j, 4);
    acc |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
  }
  return acc != 0;
}

}  // namespace upd

// The update a weight-gradient GEMM applies as it stores its last depth block (gemm.cpp):
// the finished gradient tile g (n floats of C at offset `off` = row * ldc + col) updates
// p[row * ldp + col ...] and the optimizer state at the same offset as C (the state is
// laid out like the gradient).  check_finite: a tile holding a NaN/inf is left alone and
// `bad` is set.
struct UpdateEpilogue {
  bool adamw;
  SgdConsts sgd;
  AdamConsts adam;
  float* p;
  i64 ldp, ldc;
  float *buf, *m, *v;
  bool check_finite;
  std::atomic<bool>* bad;

  void apply(i64 off, const float* g, i64 n) const {
    if (check_finite && upd::has_nonfinite(g, n)) {
      bad->store(true, std::memory_order_relaxed);
      return;
    }
    float* pp = p + off / ldc * ldp + off % ldc;
    if (adamw)
      upd::adamw_span(pp, g, m + off, v + off, n, adam);
    else
      upd::sgd_span(pp, g, buf ? buf + off : nullptr, n, sgd);
  }
};

}  // namespace pk
