// attention.cpp — scaled dot-product attention, forward and backward.
//
// Plain loops (no gemm dependency), one query row at a time:
//   scores[s] = scale * q_l . k_s  (+ float mask | -inf where bool mask == 0
//               or, when causal, s > l)
//   probs     = softmax(scores)     (saved in probs[B,L,S]; required, non-null)
//   out_l     = sum_s probs[s] * v_s
// A row whose positions are all masked gets probs = 0 and out = 0 (PyTorch
// gives NaN there).  Dot products, the v/k/q axpys and the row's exponentials
// run over the native vector of simd.h (vec_math.h's vexp), tails zero-padded.
//
// Threads (pk::parallel_for) split the batch B: every output of batch b is
// written by the one chunk that owns b, and nothing depends on the split, so
// results are bit-identical for any thread count.  The backward's dS row needs
// S floats of scratch per concurrently running chunk: the contract promises
// L*S floats, i.e. L rows, so the batches are dealt into min(B, L) fixed slots
// (slot k owns batches [B*k/slots, B*(k+1)/slots) and scratch row k) and only
// the slots run in parallel; with L == 1 the backward runs on one thread.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"

namespace pk {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr i64 kGrain = kMinChunkMacs;  // multiply-adds per chunk, at least (pock_parallel.h)

using namespace simd;

// Chunk grain (in batches) for per-batch work of `cost` multiply-adds.
inline i64 batch_grain(i64 cost) { return cost >= kGrain ? 1 : kGrain / (cost > 0 ? cost : 1); }

inline float dot(const float* a, const float* b, i64 n) {
  V s0 = vzero(), s1 = vzero();
  i64 i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    s0 = vfma(vload(a + i), vload(b + i), s0);
    s1 = vfma(vload(a + i + kW), vload(b + i + kW), s1);
  }
  for (; i + kW <= n; i += kW) s0 = vfma(vload(a + i), vload(b + i), s0);
  float s = vsum(vadd(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float a, const float* x, float* y, i64 n) {
  const V va = vbcast(a);
  i64 i = 0;
  for (; i + kW <= n; i += kW) vstore(y + i, vfma(va, vload(x + i), vload(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
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
  parallel_for(p.B, batch_grain(L * S * (E + Ev)), [&](i64 b0, i64 b1) {
    for (i64 b = b0; b < b1; ++b) {
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
        vmath::map_v(row, row, send, [m](V x) { return vmath::vexp(vsub(x, vbcast(m))); });
        double sum = 0;
        for (i64 s = 0; s < send; ++s) sum += row[s];
        const float inv = static_cast<float>(1.0 / sum);
        for (i64 s = 0; s < send; ++s) row[s] *= inv;
        for (i64 s = 0; s < send; ++s)
          if (row[s] != 0.f) axpy(row[s], vb + s * Ev, ol, Ev);
      }
    }
  });
}

// One batch of the backward (plain scalar parameters: nothing the stores could alias).
// Kept out of line: inlined into the threaded lambda it ran ~8% slower (GCC 12).
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void sdpa_bwd_batch(const float* gb, const float* qb, const float* kb, const float* vb, const float* pb,
                           float* dqb, float* dkb, float* dvb, float* dS, i64 L, i64 S, i64 E, i64 Ev, float scale) {
  if (dkb) zero(dkb, S * E);
  if (dvb) zero(dvb, S * Ev);
  for (i64 l = 0; l < L; ++l) {
    const float* P = pb + l * S;
    const float* gl = gb + l * Ev;
    if (dvb) {
      for (i64 s = 0; s < S; ++s)
        if (P[s] != 0.f) axpy(P[s], gl, dvb + s * Ev, Ev);
    }
    if (!dqb && !dkb) continue;
    double rs = 0;
    for (i64 s = 0; s < S; ++s) {
      const float dp = P[s] != 0.f ? dot(gl, vb + s * Ev, Ev) : 0.f;
      dS[s] = dp;
      rs += static_cast<double>(P[s]) * dp;
    }
    const float r = static_cast<float>(rs);
    for (i64 s = 0; s < S; ++s) dS[s] = scale * (P[s] * (dS[s] - r));
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

// dv = P^T dout;  dP = dout v^T;  dS = P * (dP - rowsum(P*dP));
// dq = scale * dS k;  dk = scale * dS^T q.   Each of dq, dk, dv nullable.
// Uses S floats of scratch per slot, min(B, L) slots (the contract guarantees L*S).
void sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* probs,
              float* dq, float* dk, float* dv, float* scratch, const SdpaParams& p) {
  const i64 B = p.B, L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const float scale = p.scale;
  if (B <= 0) return;
  const bool need_ds = dq != nullptr || dk != nullptr;
  // Fixed slots: slot k owns batches [B*k/slots, B*(k+1)/slots) and scratch row k.
  // (L == 0: one slot, whose scratch row is never touched; dk/dv are still zeroed.)
  const i64 slots = need_ds ? (B < L ? B : (L > 0 ? L : 1)) : B;
  const i64 per_slot = L * S * (E + 2 * Ev) * ((B + slots - 1) / slots);
  parallel_for(slots, batch_grain(per_slot), [&](i64 k0, i64 k1) {
    for (i64 slot = k0; slot < k1; ++slot) {
      float* const dS = need_ds ? scratch + slot * S : nullptr;
      for (i64 b = B * slot / slots; b < B * (slot + 1) / slots; ++b)
        sdpa_bwd_batch(dout + b * L * Ev, q + b * L * E, k + b * S * E, v + b * S * Ev, probs + b * L * S,
                       dq ? dq + b * L * E : nullptr, dk ? dk + b * S * E : nullptr,
                       dv ? dv + b * S * Ev : nullptr, dS, L, S, E, Ev, scale);
    }
  });
}

}  // namespace pk
