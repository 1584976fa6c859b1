// attention.cpp — scaled dot-product attention, forward and backward, flash-style: no
// [L, S] buffer per (batch, head) survives a call, so the memory a step keeps for attention
// grows linearly with the tokens.
//
// Forward, per (batch, query head) and block of kRows query rows, over blocks of kKeys keys
// (online softmax):
//   s   = scale * Q_blk K_blk^T (+ float mask | -inf where bool mask == 0 or, when causal,
//         key > row)                                     one small GEMM into per-thread scratch
//   m'  = max(m, rowmax(s)),  p = exp(s - m'),  l = l * exp(m - m') + rowsum(p)  (in double)
//   out = out * exp(m - m') + p V_blk                    one small GEMM into out
// then out /= l and lse = m + log(l) (per row, [B, L]: all the backward needs besides q, k,
// v and out).  A causal block only visits the keys its last row sees.  A row whose positions
// are all masked gets out = 0 and lse = +inf (PyTorch gives NaN there).
//
// Backward, per (batch, query head), for each block of kBwdKeys keys and each block of up to
// kBwdRows rows that sees it (causal: from the block's first key on; its first kDiagRows rows
// see only its first kDiagRows keys and get a block of their own, so the masked half of the
// diagonal costs little), recomputing the probabilities from the saved lse:
//   p  = exp(scale * s - lse),  dP = dO V_blk^T,  dS = scale * p * (dP - D),  D = rowsum(dO * out)
//   dv_blk += p^T dO,  dk_blk += dS^T Q,  dq_blk += dS K_blk          (five small GEMMs)
// Blocks of 32 keys x 128 rows: the p^T dO and dS^T Q products run over up to 128 rows at once,
// and the diagonal wastes little (SmolLM2 shapes, one thread, CPU time against the kernel that
// kept the probabilities: bench/attention.py).
// Under grouped-query attention (k/v with fewer heads: query head h reads kv head h / group)
// each query head writes its dk, dv into the scratch and a second pass sums a group's heads
// in order.  q, k, v and out may be [N, L, H, E] as well as [N, H, L, E] (SdpaParams' layouts:
// the head split of a projection needs no permute copy).  The exponentials run over the
// native vector of simd.h (vec_math.h's vexp); the GEMMs are gemm.cpp's (detail::gemm_strided).
//
// Threads (pk::parallel_for) split the (batch, head) pairs and row blocks; every output element
// is written by one task in a fixed order, and the GEMM's result does not depend on its tiling,
// so results are bit-identical for any thread count.
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
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr i64 kRows = 32;  // query rows per block
constexpr i64 kKeys = 64;  // keys per block (the row stride of the per-thread score blocks)
#ifndef PK_SDPA_BWD_ROWS
#define PK_SDPA_BWD_ROWS 128
#endif
constexpr i64 kBwdRows = PK_SDPA_BWD_ROWS;  // backward: query rows per block of a key block
#ifndef PK_SDPA_BWD_KEYS
#define PK_SDPA_BWD_KEYS 32
#endif
constexpr i64 kBwdKeys = PK_SDPA_BWD_KEYS;  // backward: keys per block
#ifndef PK_SDPA_DIAG
#define PK_SDPA_DIAG 16
#endif
constexpr i64 kDiagRows = PK_SDPA_DIAG;  // backward, causal: rows of a key block's diagonal sub-block

using namespace simd;

// The operands' strides, defaults filled in; at(x, l, n, h) is (batch, head) (n, h)'s [rows, e] matrix.
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

// The keys [0, send) rows [l0, l1) of a block see (causal: up to the last row).
inline i64 keys_seen(const SdpaParams& p, i64 l1) { return p.causal ? (l1 < p.S ? l1 : p.S) : p.S; }

// sc[r*ld + j] (= q_r . k_j for rows l0 + r, keys s0 + j of (batch, head) bh) -> scaled and
// masked scores: -inf where the bool mask is 0 or (causal) the key follows the row.
void mask_block(float* sc, i64 ld, i64 rows, i64 keys, i64 l0, i64 s0, i64 bh, const SdpaParams& p,
                const void* mask) {
  const uint8_t* bm = p.mask_kind == 1 ? static_cast<const uint8_t*>(mask) : nullptr;
  const float* fm = p.mask_kind == 2 ? static_cast<const float*>(mask) : nullptr;
  const float scale = p.scale;
  for (i64 r = 0; r < rows; ++r) {
    float* row = sc + r * ld;
    const i64 l = l0 + r, moff = bh * p.mask_sb + l * p.mask_sl + s0 * p.mask_ss;
    vmath::map_v(row, row, keys, [scale](V x) { return vmul(x, vbcast(scale)); });
    if (bm)
      for (i64 j = 0; j < keys; ++j)
        if (!bm[moff + j * p.mask_ss]) row[j] = kNegInf;
    if (fm)
      for (i64 j = 0; j < keys; ++j) row[j] += fm[moff + j * p.mask_ss];
    if (p.causal)
      for (i64 j = l + 1 - s0 < 0 ? 0 : l + 1 - s0; j < keys; ++j) row[j] = kNegInf;
  }
}

// sc -> exp(sc - lse[r]) (the probabilities, 0 where masked or the row is fully masked).
void probs_block(float* sc, i64 ld, i64 rows, i64 keys, const float* lse) {
  for (i64 r = 0; r < rows; ++r) {
    const V m = vbcast(lse[r]);
    vmath::map_v(sc + r * ld, sc + r * ld, keys, [m](V x) { return vmath::vexp(vsub(x, m)); });
  }
}

// Scores [rows, keys] of q rows qb (row stride qs) against keys kb (row stride ks), masked.
void scores(const float* qb, i64 qs, const float* kb, i64 ks, float* sc, i64 ld, i64 rows, i64 keys, i64 E,
            i64 l0, i64 s0, i64 bh, const SdpaParams& p, const void* mask) {
  detail::gemm_strided(qb, qs, 1, kb, 1, ks, sc, ld, rows, keys, E, false);
  mask_block(sc, ld, rows, keys, l0, s0, bh, p, mask);
}

// The probabilities [rows, keys] of rows l0.. against keys s0.. from the saved lse: scores, then
// exp(scale * s - lse) in one pass per row where no bool/float mask applies (a causal row's
// keys past it set to 0, as exp(-inf) gives), else mask_block and probs_block.
void probs_of(const float* qb, i64 qs, const float* kb, i64 ks, float* sc, i64 ld, i64 rows, i64 keys, i64 E,
              i64 l0, i64 s0, i64 bh, const SdpaParams& p, const void* mask, const float* lse) {
  if (p.mask_kind != 0) {
    scores(qb, qs, kb, ks, sc, ld, rows, keys, E, l0, s0, bh, p, mask);
    return probs_block(sc, ld, rows, keys, lse);
  }
  detail::gemm_strided(qb, qs, 1, kb, 1, ks, sc, ld, rows, keys, E, false);
  const V vs = vbcast(p.scale);
  for (i64 r = 0; r < rows; ++r) {
    float* row = sc + r * ld;
    const V m = vbcast(lse[r]);
    const i64 seen = p.causal ? (l0 + r + 1 - s0 < keys ? l0 + r + 1 - s0 : keys) : keys;
    if (seen <= 0) {
      std::memset(row, 0, sizeof(float) * keys);
      continue;
    }
    vmath::map_v(row, row, seen, [vs, m](V x) { return vmath::vexp(vsub(vmul(x, vs), m)); });
    if (seen < keys) std::memset(row + seen, 0, sizeof(float) * (keys - seen));
  }
}

}  // namespace

// out = softmax(scale * q k^T + mask) v;  lse = log of each row's softmax denominator (+ max).
void sdpa_fwd(const float* q, const float* k, const float* v, const void* mask, float* out, float* lse,
              const SdpaParams& p) {
  const i64 L = p.L, E = p.E, Ev = p.Ev;
  const Geo G(p);
  const i64 nblk = (L + kRows - 1) / kRows;
  const i64 cost = (L < kRows ? L : kRows) * p.S * (E + Ev);
  parallel_for(p.B * nblk, grain_for_work(cost, kMinChunkMacs), [&](i64 t0, i64 t1) {
    float* sc = detail::thread_scratch<struct SdpaScores>(kRows * kKeys);
    float m[kRows], alpha[kRows];
    double l[kRows];
    for (i64 t = t0; t < t1; ++t) {
      const i64 bh = t / nblk, n = bh / G.H, h = bh % G.H, hk = h / G.g;
      const i64 l0 = t % nblk * kRows, l1 = L < l0 + kRows ? L : l0 + kRows, rows = l1 - l0;
      const float* qb = Geo::at(q, G.q, n, h) + l0 * G.q.sr;
      const float* kb = Geo::at(k, G.k, n, hk);
      const float* vb = Geo::at(v, G.v, n, hk);
      float* ob = Geo::at(out, G.o, n, h) + l0 * G.o.sr;
      const i64 send = keys_seen(p, l1);
      for (i64 r = 0; r < rows; ++r) m[r] = kNegInf, l[r] = 0;
      if (send == 0) zero_rows(ob, rows, G.o.sr, Ev);
      for (i64 s0 = 0; s0 < send; s0 += kKeys) {
        const i64 keys = send < s0 + kKeys ? send - s0 : kKeys;
        scores(qb, G.q.sr, kb + s0 * G.k.sr, G.k.sr, sc, kKeys, rows, keys, E, l0, s0, bh, p, mask);
        for (i64 r = 0; r < rows; ++r) {
          float* row = sc + r * kKeys;
          const float mb = vmath::vrow_max(row, keys), mn = mb > m[r] ? mb : m[r];
          alpha[r] = 1.f;
          if (mn == kNegInf) {  // nothing seen yet
            std::memset(row, 0, sizeof(float) * keys);
            continue;
          }
          vmath::map_v(row, row, keys, [mn](V x) { return vmath::vexp(vsub(x, vbcast(mn))); });
          double sum = 0;  // in order, in double
          for (i64 j = 0; j < keys; ++j) sum += row[j];
          if (m[r] != mn) alpha[r] = m[r] == kNegInf ? 0.f : std::exp(m[r] - mn);
          l[r] = l[r] * alpha[r] + sum;
          m[r] = mn;
        }
        if (s0 > 0)
          for (i64 r = 0; r < rows; ++r)
            if (alpha[r] != 1.f) {
              const V a = vbcast(alpha[r]);
              vmath::map_v(ob + r * G.o.sr, ob + r * G.o.sr, Ev, [a](V x) { return vmul(x, a); });
            }
        detail::gemm_strided(sc, kKeys, 1, vb + s0 * G.v.sr, G.v.sr, 1, ob, G.o.sr, rows, Ev, keys, s0 > 0);
      }
      float* lr = lse + bh * L + l0;
      for (i64 r = 0; r < rows; ++r) {
        float* o = ob + r * G.o.sr;
        if (l[r] == 0) {  // fully masked row: zeros
          std::memset(o, 0, sizeof(float) * Ev);
          lr[r] = kInf;
          continue;
        }
        const V inv = vbcast(static_cast<float>(1.0 / l[r]));
        vmath::map_v(o, o, Ev, [inv](V x) { return vmul(x, inv); });
        lr[r] = m[r] + static_cast<float>(std::log(l[r]));
      }
    }
  });
}

// The probabilities [B, L, S] again, from q, k and the forward's lse (a learned mask's gradient).
void sdpa_probs(const float* q, const float* k, const void* mask, const float* lse, float* probs,
                const SdpaParams& p) {
  const i64 L = p.L, S = p.S;
  const Geo G(p);
  const i64 nblk = (L + kRows - 1) / kRows;
  parallel_for(p.B * nblk, grain_for_work((L < kRows ? L : kRows) * S * p.E, kMinChunkMacs), [&](i64 t0, i64 t1) {
    for (i64 t = t0; t < t1; ++t) {
      const i64 bh = t / nblk, n = bh / G.H, h = bh % G.H, hk = h / G.g;
      const i64 l0 = t % nblk * kRows, l1 = L < l0 + kRows ? L : l0 + kRows, rows = l1 - l0;
      float* P = probs + (bh * L + l0) * S;
      if (S == 0) continue;
      scores(Geo::at(q, G.q, n, h) + l0 * G.q.sr, G.q.sr, Geo::at(k, G.k, n, hk), G.k.sr, P, S, rows, S, p.E, l0, 0,
             bh, p, mask);
      probs_block(P, S, rows, S, lse + bh * L + l0);
    }
  });
}

// dv = P^T dout;  dP = dout v^T;  dS = scale * P * (dP - rowsum(dout * out));
// dq = dS k;  dk = dS^T q.   Each of dq, dk, dv nullable.
void sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* out,
              const float* lse, const void* mask, float* dq, float* dk, float* dv, float* scratch,
              const SdpaParams& p) {
  const i64 L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const Geo G(p);
  if (p.B <= 0) return;
  const bool need_ds = dq != nullptr || dk != nullptr, part = G.g > 1 && (dk || dv);
  const i64 cost = L * S * (2 * E + 3 * Ev);
  parallel_for(p.B, grain_for_work(cost, kMinChunkMacs), [&](i64 t0, i64 t1) {
    float* sc = detail::thread_scratch<struct SdpaBwdScratch>(2 * kBwdRows * kBwdKeys + L);
    float *dp = sc + kBwdRows * kBwdKeys, *D = dp + kBwdRows * kBwdKeys;
    for (i64 bh = t0; bh < t1; ++bh) {
      const i64 n = bh / G.H, h = bh % G.H, hk = h / G.g;
      const float* qh = Geo::at(q, G.q, n, h);
      const float* gh = Geo::at(dout, G.o, n, h);
      const float* kh = Geo::at(k, G.k, n, hk);
      const float* vh = Geo::at(v, G.v, n, hk);
      const float* lh = lse + bh * L;
      float* dqh = Geo::at(dq, G.q, n, h);
      // This head's dk, dv: the outputs, or (grouped-query) its rows of the scratch, dense.
      float* dkh = dk ? (part ? scratch + bh * S * (E + Ev) : Geo::at(dk, G.k, n, hk)) : nullptr;
      float* dvh = dv ? (part ? scratch + bh * S * (E + Ev) + S * E : Geo::at(dv, G.v, n, hk)) : nullptr;
      const i64 ldk = part ? E : G.k.sr, ldv = part ? Ev : G.v.sr;
      if (need_ds) {
        const float* oh = Geo::at(out, G.o, n, h);
        for (i64 l = 0; l < L; ++l) {
          double acc = 0;  // in order, in double
          for (i64 e = 0; e < Ev; ++e) acc += static_cast<double>(gh[l * G.o.sr + e]) * oh[l * G.o.sr + e];
          D[l] = static_cast<float>(acc);
        }
      }
      if (dqh) zero_rows(dqh, L, G.q.sr, E);
      for (i64 s0 = 0; s0 < S; s0 += kBwdKeys) {
        const i64 keys = S < s0 + kBwdKeys ? S - s0 : kBwdKeys;
        const i64 lstart = p.causal ? (s0 < L ? s0 : L) : 0;  // rows before s0 see none of these keys
        if (lstart == L) {  // no row sees these keys
          if (dkh) zero_rows(dkh + s0 * ldk, keys, ldk, E);
          if (dvh) zero_rows(dvh + s0 * ldv, keys, ldv, Ev);
          continue;
        }
        // Causal: the first kDiagRows rows of the block see only its first kDiagRows keys, a
        // block of their own (the masked half of the diagonal is not computed).
        const bool diag = p.causal && keys > kDiagRows;
        if (dkh) zero_rows(dkh + s0 * ldk, keys, ldk, E);
        if (dvh) zero_rows(dvh + s0 * ldv, keys, ldv, Ev);
        for (i64 l0 = lstart, rows; l0 < L; l0 += rows) {
          const bool sub = diag && l0 == lstart;
          rows = sub ? (L - l0 < kDiagRows ? L - l0 : kDiagRows) : (L - l0 < kBwdRows ? L - l0 : kBwdRows);
          const i64 kn = sub ? kDiagRows : keys;  // the keys these rows see
          probs_of(qh + l0 * G.q.sr, G.q.sr, kh + s0 * G.k.sr, G.k.sr, sc, kBwdKeys, rows, kn, E, l0, s0, bh, p, mask,
                   lh + l0);
          if (dvh)
            detail::gemm_strided(sc, 1, kBwdKeys, gh + l0 * G.o.sr, G.o.sr, 1, dvh + s0 * ldv, ldv, kn, Ev, rows, true);
          if (need_ds) {
            detail::gemm_strided(gh + l0 * G.o.sr, G.o.sr, 1, vh + s0 * G.v.sr, 1, G.v.sr, dp, kBwdKeys, rows, kn, Ev,
                                 false);
            const V vs = vbcast(p.scale);
            for (i64 r = 0; r < rows; ++r) {
              const V d = vbcast(D[l0 + r]);
              vmath::map2_v(sc + r * kBwdKeys, dp + r * kBwdKeys, dp + r * kBwdKeys, kn,
                            [d, vs](V a, V b) { return vmul(vs, vmul(a, vsub(b, d))); });
            }
            if (dkh)
              detail::gemm_strided(dp, 1, kBwdKeys, qh + l0 * G.q.sr, G.q.sr, 1, dkh + s0 * ldk, ldk, kn, E, rows, true);
            if (dqh)
              detail::gemm_strided(dp, kBwdKeys, 1, kh + s0 * G.k.sr, G.k.sr, 1, dqh + l0 * G.q.sr, G.q.sr, rows, E, kn,
                                   true);
          }
        }
      }
    }
  });
  if (!part) return;
  // Grouped-query: dk, dv of kv head (n, hk) = the sum over its group's query heads, in order.
  const i64 nkb = (S + kKeys - 1) / kKeys;
  parallel_for(p.B / G.g * nkb, grain_for_work(kKeys * G.g * (E + Ev), kMinChunkMacs), [&](i64 t0, i64 t1) {
    for (i64 t = t0; t < t1; ++t) {
      const i64 gi = t / nkb, n = gi / G.Hk, hk = gi % G.Hk;
      const i64 s0 = t % nkb * kKeys, s1 = S < s0 + kKeys ? S : s0 + kKeys;
      for (i64 s = s0; s < s1; ++s) {
        for (int which = 0; which < 2; ++which) {
          float* dst = which ? dv : dk;
          if (!dst) continue;
          const i64 w = which ? Ev : E, off = which ? S * E + s * Ev : s * E;
          float* y = Geo::at(dst, which ? G.v : G.k, n, hk) + s * (which ? G.v.sr : G.k.sr);
          const float* x0 = scratch + (n * G.H + hk * G.g) * S * (E + Ev) + off;
          std::memcpy(y, x0, sizeof(float) * w);
          for (i64 j = 1; j < G.g; ++j) {
            const float* xj = x0 + j * S * (E + Ev);
            vmath::map2_v(y, xj, y, w, [](V a, V b) { return vadd(a, b); });
          }
        }
      }
    }
  });
}

}  // namespace pk
