// attention.cpp — scaled dot-product attention, forward and backward.
//
// Plain loops (no gemm dependency), one query row at a time:
//   scores[s] = scale * q_l . k_s  (+ float mask | -inf where bool mask == 0
//               or, when causal, s > l)
//   probs     = softmax(scores)     (saved in probs[B,L,S]; required, non-null)
//   out_l     = sum_s probs[s] * v_s
// A row whose positions are all masked gets probs = 0 and out = 0 (PyTorch
// gives NaN there).  Dot products use 8 independent accumulators so they
// vectorize without -ffast-math; the v/k/q updates are contiguous axpys.
#include <cmath>
#include <limits>

#include "pock_kernels.h"

namespace pk {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float dot(const float* a, const float* b, i64 n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float a, const float* x, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void zero(float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = 0.f;
}

}  // namespace

// out[B,L,Ev] = softmax(scale * q k^T + mask) v; probs[B,L,S] saved.
void sdpa_fwd(const float* q, const float* k, const float* v, const void* mask, float* out, float* probs,
              const SdpaParams& p) {
  const i64 L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const uint8_t* bmask = p.mask_kind == 1 ? static_cast<const uint8_t*>(mask) : nullptr;
  const float* fmask = p.mask_kind == 2 ? static_cast<const float*>(mask) : nullptr;
  for (i64 b = 0; b < p.B; ++b) {
    const float* qb = q + b * L * E;
    const float* kb = k + b * S * E;
    const float* vb = v + b * S * Ev;
    for (i64 l = 0; l < L; ++l) {
      const float* ql = qb + l * E;
      float* row = probs + (b * L + l) * S;
      float* ol = out + (b * L + l) * Ev;
      const i64 send = p.causal ? (l + 1 < S ? l + 1 : S) : S;  // positions s >= send are masked
      const i64 moff = b * p.mask_sb + l * p.mask_sl;
      float m = kNegInf;
      for (i64 s = 0; s < send; ++s) {
        float sc;
        if (bmask && !bmask[moff + s * p.mask_ss]) {
          sc = kNegInf;
        } else {
          sc = p.scale * dot(ql, kb + s * E, E);
          if (fmask) sc += fmask[moff + s * p.mask_ss];
        }
        row[s] = sc;
        m = sc > m ? sc : m;
      }
      for (i64 s = send; s < S; ++s) row[s] = 0.f;
      zero(ol, Ev);
      if (m == kNegInf) {  // fully masked row: zeros
        zero(row, send);
        continue;
      }
      double sum = 0;
      for (i64 s = 0; s < send; ++s) {
        const float e = std::exp(row[s] - m);
        row[s] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (i64 s = 0; s < send; ++s) {
        row[s] *= inv;
        if (row[s] != 0.f) axpy(row[s], vb + s * Ev, ol, Ev);
      }
    }
  }
}

// dv = P^T dout;  dP = dout v^T;  dS = P * (dP - rowsum(P*dP));
// dq = scale * dS k;  dk = scale * dS^T q.   Each of dq, dk, dv nullable.
// Uses S floats of scratch (the contract guarantees L*S).
void sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* probs,
              float* dq, float* dk, float* dv, float* scratch, const SdpaParams& p) {
  const i64 L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  for (i64 b = 0; b < p.B; ++b) {
    const float* qb = q + b * L * E;
    const float* kb = k + b * S * E;
    const float* vb = v + b * S * Ev;
    float* dqb = dq ? dq + b * L * E : nullptr;
    float* dkb = dk ? dk + b * S * E : nullptr;
    float* dvb = dv ? dv + b * S * Ev : nullptr;
    if (dkb) zero(dkb, S * E);
    if (dvb) zero(dvb, S * Ev);
    for (i64 l = 0; l < L; ++l) {
      const float* P = probs + (b * L + l) * S;
      const float* gl = dout + (b * L + l) * Ev;
      if (dvb) {
        for (i64 s = 0; s < S; ++s)
          if (P[s] != 0.f) axpy(P[s], gl, dvb + s * Ev, Ev);
      }
      if (!dqb && !dkb) continue;
      float* dS = scratch;
      double rs = 0;
      for (i64 s = 0; s < S; ++s) {
        const float dp = P[s] != 0.f ? dot(gl, vb + s * Ev, Ev) : 0.f;
        dS[s] = dp;
        rs += static_cast<double>(P[s]) * dp;
      }
      const float r = static_cast<float>(rs);
      for (i64 s = 0; s < S; ++s) dS[s] = p.scale * (P[s] * (dS[s] - r));
      if (dqb) {
        float* dql = dqb + l * E;
        zero(dql, E);
        for (i64 s = 0; s < S; ++s)
          if (dS[s] != 0.f) axpy(dS[s], kb + s * E, dql, E);
      }
      if (dkb) {
        const float* ql = qb + l * E;
        for (i64 s = 0; s < S; ++s)
          if (dS[s] != 0.f) axpy(dS[s], ql, dkb + s * E, E);
      }
    }
  }
}

}  // namespace pk
