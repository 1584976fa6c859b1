// attention.cpp — scaled dot-product attention, forward and backward.
//
// Blocked over query rows: for each (batch, query head) and block of kRows query rows,
//   scores = scale * Q_blk K^T   (+ float mask | -inf where bool mask == 0
//                                 or, when causal, s > l)    one small GEMM
//   probs  = softmax(scores)     (saved in probs[B,L,S]; required, non-null)
//   out    = probs V                                          one small GEMM
// The GEMMs are pk::gemm's (gemm.cpp, detail::gemm_strided) on strided views; the softmax
// denominators and the backward's rowsums are summed in order in double, as the row-at-a-time
// kernel did (a gradient that cancels to below AdamW's eps is sensitive to them).  q, k, v
// and out may be [N, L, H, E] as well as [N, H, L, E] (SdpaParams' layouts: the head
// split of a projection needs no permute copy) and k/v may have fewer heads
// (grouped-query attention: query head h reads kv head h / group).  A causal block only
// multiplies the keys its last row sees.  A row whose positions are all masked gets
// probs = 0 and out = 0 (PyTorch gives NaN there).  Softmax runs over the native vector
// of simd.h (vec_math.h's vexp).
//
// Backward, in two phases over the scratch dS (scratch_rows rows of S floats):
//   1. per (batch, query head, row block):  dP = dO V^T,  dS = scale * P * (dP - rowsum(P dP)),
//      dq = dS K                                            (two GEMMs)
//   2. per (batch, kv head, block of keys): dk = sum over the group's heads dS^T Q,
//      dv = sum of P^T dO                                   (GEMMs over the rows that see the keys)
// With less scratch than B*L rows the heads go through both phases a few at a time.
//
// Threads (pk::parallel_for) split the blocks; every output element is written by one
// block in a fixed order, and the GEMM's result does not depend on its tiling, so results
// are bit-identical for any thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"
#include "gemm_detail.h"

namespace pk {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr i64 kRows = 32;  // query rows per block (forward and backward phase 1)
constexpr i64 kKeys = 32;  // keys per block (backward phase 2)

using namespace simd;

// The operands' strides, defaults filled in; ptr(x, bh) is (batch, head) bh's [rows, e] matrix.
struct Geo {
  i64 H, Hk, g;
  SdpaLayout q, k, v, o;
  static SdpaLayout fill(SdpaLayout l, i64 heads, i64 rows, i64 cols) {
    if (l.sr == 0) l = SdpaLayout{heads * rows * cols, rows * cols, cols};
    return l;
  }
  explicit Geo(const SdpaParams& p) {
    H = p.H > 0 ? p.H : 1;
    g = p.group > 0 ? p.group : 1;
    Hk = H / g;
    q = fill(p.q, H, p.L, p.E);
    k = fill(p.k, Hk, p.S, p.E);
    v = fill(p.v, Hk, p.S, p.Ev);
    o = fill(p.o, H, p.L, p.Ev);
  }
  template <class T>
  static T* at(T* x, const SdpaLayout& l, i64 n, i64 h) {
    return x ? x + n * l.sb + h * l.sh : nullptr;
  }
};

inline void zero_rows(float* x, i64 rows, i64 ld, i64 n) {
  for (i64 r = 0; r < rows; ++r) std::memset(x + r * ld, 0, sizeof(float) * n);
}

// One query row of scores (row[0:send], send = the block's key count) -> probabilities over
// the row's own keys [0, lim), zeros after.
inline void softmax_row(float* row, i64 send, i64 lim, float scale, const uint8_t* bm, const float* fm, i64 ss) {
  vmath::map_v(row, row, lim, [scale](V x) { return vmul(x, vbcast(scale)); });
  if (bm)
    for (i64 s = 0; s < lim; ++s)
      if (!bm[s * ss]) row[s] = kNegInf;
  if (fm)
    for (i64 s = 0; s < lim; ++s) row[s] += fm[s * ss];
  if (lim < send) std::memset(row + lim, 0, sizeof(float) * (send - lim));
  const float m = vmath::vrow_max(row, lim);
  if (m == kNegInf) {  // fully masked row: zeros
    std::memset(row, 0, sizeof(float) * lim);
    return;
  }
  vmath::map_v(row, row, lim, [m](V x) { return vmath::vexp(vsub(x, vbcast(m))); });
  double sum = 0;  // in order, in double
  for (i64 s = 0; s < lim; ++s) sum += row[s];
  const float inv = static_cast<float>(1.0 / sum);
  vmath::map_v(row, row, lim, [inv](V x) { return vmul(x, vbcast(inv)); });
}

}  // namespace

// out = softmax(scale * q k^T + mask) v; probs[B,L,S] saved.
void sdpa_fwd(const float* q, const float* k, const float* v, const void* mask, float* out, float* probs,
              const SdpaParams& p) {
  const i64 L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const Geo G(p);
  const uint8_t* bmask = p.mask_kind == 1 ? static_cast<const uint8_t*>(mask) : nullptr;
  const float* fmask = p.mask_kind == 2 ? static_cast<const float*>(mask) : nullptr;
  const i64 nblk = (L + kRows - 1) / kRows;
  const i64 cost = (L < kRows ? L : kRows) * S * (E + Ev);
  parallel_for(p.B * nblk, grain_for_work(cost, kMinChunkMacs), [&](i64 t0, i64 t1) {
    for (i64 t = t0; t < t1; ++t) {
      const i64 bh = t / nblk, n = bh / G.H, h = bh % G.H, hk = h / G.g;
      const i64 l0 = t % nblk * kRows, l1 = L < l0 + kRows ? L : l0 + kRows, rows = l1 - l0;
      const float* qb = Geo::at(q, G.q, n, h) + l0 * G.q.sr;
      const float* kb = Geo::at(k, G.k, n, hk);
      const float* vb = Geo::at(v, G.v, n, hk);
      float* ob = Geo::at(out, G.o, n, h) + l0 * G.o.sr;
      float* P = probs + (bh * L + l0) * S;
      const i64 send = p.causal ? (l1 < S ? l1 : S) : S;  // keys any row of the block sees
      if (send > 0) detail::gemm_strided(qb, G.q.sr, 1, kb, 1, G.k.sr, P, S, rows, send, E, false);
      for (i64 l = l0; l < l1; ++l) {
        float* row = P + (l - l0) * S;
        const i64 lim = p.causal ? (l + 1 < send ? l + 1 : send) : send;
        const i64 moff = bh * p.mask_sb + l * p.mask_sl;
        softmax_row(row, send, lim, p.scale, bmask ? bmask + moff : nullptr, fmask ? fmask + moff : nullptr,
                    p.mask_ss);
        if (send < S) std::memset(row + send, 0, sizeof(float) * (S - send));
      }
      detail::gemm_strided(P, S, 1, vb, G.v.sr, 1, ob, G.o.sr, rows, Ev, send, false);
    }
  });
}

// dv = P^T dout;  dP = dout v^T;  dS = P * (dP - rowsum(P*dP));
// dq = scale * dS k;  dk = scale * dS^T q.   Each of dq, dk, dv nullable.
void sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* probs,
              float* dq, float* dk, float* dv, float* scratch, const SdpaParams& p) {
  const i64 L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const Geo G(p);
  if (p.B <= 0) return;
  const bool need_ds = dq != nullptr || dk != nullptr;
  const i64 groups = p.B / G.g;  // (batch, kv head) pairs
  // Groups per pass: as many as the scratch holds (each needs g * L rows of dS).
  const i64 rows_avail = p.scratch_rows > 0 ? p.scratch_rows : L;
  i64 per_pass = need_ds ? (G.g * L > 0 ? rows_avail / (G.g * L) : groups) : groups;
  if (per_pass < 1) per_pass = 1;  // (the contract promises g * L rows)
  const i64 nblk = (L + kRows - 1) / kRows, nkb = (S + kKeys - 1) / kKeys;
  for (i64 g0 = 0; g0 < groups; g0 += per_pass) {
    const i64 g1 = groups < g0 + per_pass ? groups : g0 + per_pass;
    const i64 bh0 = g0 * G.g, bh1 = g1 * G.g;
    // Phase 1: dS (scratch row (bh - bh0) * L + l) and dq.
    if (need_ds) {
      const i64 cost = (L < kRows ? L : kRows) * S * (E + Ev);
      parallel_for((bh1 - bh0) * nblk, grain_for_work(cost, kMinChunkMacs), [&](i64 t0, i64 t1) {
        for (i64 t = t0; t < t1; ++t) {
          const i64 bh = bh0 + t / nblk, n = bh / G.H, h = bh % G.H, hk = h / G.g;
          const i64 l0 = t % nblk * kRows, l1 = L < l0 + kRows ? L : l0 + kRows, rows = l1 - l0;
          const float* gb = Geo::at(dout, G.o, n, h) + l0 * G.o.sr;
          const float* kb = Geo::at(k, G.k, n, hk);
          const float* vb = Geo::at(v, G.v, n, hk);
          const float* P = probs + (bh * L + l0) * S;
          float* dS = scratch + ((bh - bh0) * L + l0) * S;
          const i64 send = p.causal ? (l1 < S ? l1 : S) : S;
          if (send > 0) detail::gemm_strided(gb, G.o.sr, 1, vb, 1, G.v.sr, dS, S, rows, send, Ev, false);
          for (i64 r = 0; r < rows; ++r) {
            const float* pr = P + r * S;
            float* d = dS + r * S;
            double acc = 0;  // in order, in double
            for (i64 j = 0; j < send; ++j) acc += static_cast<double>(pr[j]) * d[j];
            const float rs = static_cast<float>(acc);
            const V vr = vbcast(rs), vs = vbcast(p.scale);
            vmath::map2_v(pr, d, d, send, [vr, vs](V a, V b) { return vmul(vs, vmul(a, vsub(b, vr))); });
            if (send < S) std::memset(d + send, 0, sizeof(float) * (S - send));
          }
          if (dq) {
            float* dqb = Geo::at(dq, G.q, n, h) + l0 * G.q.sr;
            detail::gemm_strided(dS, S, 1, kb, G.k.sr, 1, dqb, G.q.sr, rows, E, send, false);
          }
        }
      });
    }
    if (!dk && !dv) continue;
    // Phase 2: dk and dv per block of keys of one (batch, kv head), summed over the group's heads.
    const i64 cost = (S < kKeys ? S : kKeys) * L * G.g * (E + Ev);
    parallel_for((g1 - g0) * nkb, grain_for_work(cost, kMinChunkMacs), [&](i64 t0, i64 t1) {
      for (i64 t = t0; t < t1; ++t) {
        const i64 gi = g0 + t / nkb, n = gi / G.Hk, hk = gi % G.Hk;
        const i64 s0 = t % nkb * kKeys, s1 = S < s0 + kKeys ? S : s0 + kKeys, keys = s1 - s0;
        const i64 lstart = p.causal ? (s0 < L ? s0 : L) : 0;  // rows l < s0 do not see these keys
        float* dkb = dk ? Geo::at(dk, G.k, n, hk) + s0 * G.k.sr : nullptr;
        float* dvb = dv ? Geo::at(dv, G.v, n, hk) + s0 * G.v.sr : nullptr;
        if (lstart == L) {
          if (dkb) zero_rows(dkb, keys, G.k.sr, E);
          if (dvb) zero_rows(dvb, keys, G.v.sr, Ev);
          continue;
        }
        for (i64 j = 0; j < G.g; ++j) {
          const i64 h = hk * G.g + j, bh = n * G.H + h;
          if (dkb) {
            const float* dS = scratch + ((bh - bh0) * L + lstart) * S + s0;
            const float* qb = Geo::at(q, G.q, n, h) + lstart * G.q.sr;
            detail::gemm_strided(dS, 1, S, qb, G.q.sr, 1, dkb, G.k.sr, keys, E, L - lstart, j > 0);
          }
          if (dvb) {
            const float* P = probs + (bh * L + lstart) * S + s0;
            const float* gb = Geo::at(dout, G.o, n, h) + lstart * G.o.sr;
            detail::gemm_strided(P, 1, S, gb, G.o.sr, 1, dvb, G.v.sr, keys, Ev, L - lstart, j > 0);
          }
        }
      }
    });
  }
}

}  // namespace pk
