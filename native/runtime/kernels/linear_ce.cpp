// linear_ce.cpp — a language model's loss head without its logits: y = x W^T + b followed by
// cross_entropy (mean over the rows whose target is not ignore_index), forward and backward over
// tiles of rows x vocabulary, so the [M, V] logits and their gradient never exist; the step keeps
// each row's log-sum-exp [M] for the backward.
//
// Forward, per block of `rows` rows and, within it, per block of `cols` classes:
//   z = x_blk W_blk^T + b_blk                  (linear.cpp / lowp.cpp, into the scratch)
//   running max and sum of exponentials per row (the sum in double), the target's logit
// then lse = m + log(sum), loss = sum over valid rows of (lse - z_t) / count (in double, in
// row order).  Backward, per the same tiles, recomputing z:
//   dz = g * (exp(z - lse) - [c == t]),  g = dloss / count (0 on ignored rows)
//   dx_blk += dz W_blk,  dW_blk[:, :k] += dz^T x_blk[:, :k],  db_blk += colsum(dz)
// W may be a low-precision frozen weight (lowp.cpp dequantizes it in its kernels; a tied q4
// model's int8 embedding table serves as the head in place).  As cross_entropy (loss.cpp): when
// every target is ignored the loss and every gradient are 0; a target outside [0, V) that is not
// ignore_index is skipped like an ignored row and the first one returned (the step checks them
// first).  Threads: the products are gemm.cpp's (parallel inside), the row loops run under
// pk::parallel_for one row per task; results are bit-identical for any thread count.
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

inline bool valid(int64_t t, i64 V, i64 ignore) { return t != ignore && t >= 0 && t < V; }

// The weight's rows [v0, v0 + n): the bytes and scales of a low-precision one.
const void* w_rows(const void* w, const LinearCeParams& p, i64 v0) {
  const auto* base = static_cast<const uint8_t*>(w);
  if (!p.lowp) return static_cast<const float*>(w) + v0 * p.K;
  switch (static_cast<LowpDtype>(p.dt)) {
    case LowpDtype::BF16:
    case LowpDtype::F16: return base + v0 * p.K * 2;
    case LowpDtype::I8: return base + v0 * p.K;
    default: return base + v0 * p.K / 2;  // Q4: two columns a byte
  }
}
const float* s_rows(const float* scale, const LinearCeParams& p, i64 v0) {
  if (!scale || !p.lowp) return nullptr;
  const auto dt = static_cast<LowpDtype>(p.dt);
  return dt == LowpDtype::I8 ? scale + v0 : dt == LowpDtype::Q4 ? scale + v0 * (p.K / 32) * 2 : scale;
}

// z[rows, n] = x[r0:r0+rows] W[v0:v0+n]^T + b[v0:v0+n]
void logits(const float* x, const void* w, const float* scale, const float* b, float* z, i64 r0, i64 rows, i64 v0,
            i64 n, const LinearCeParams& p) {
  const float* xb = x + r0 * p.K;
  const float* bb = b ? b + v0 : nullptr;
  if (p.lowp)
    linear_fwd_lowp(xb, w_rows(w, p, v0), static_cast<LowpDtype>(p.dt), s_rows(scale, p, v0), bb, z, rows, n, p.K,
                    Act::None);
  else
    linear_fwd(xb, static_cast<const float*>(w_rows(w, p, v0)), bb, z, rows, n, p.K);
}

// The state of a block of rows over the vocabulary tiles, per row: the running max m, the target's
// logit zt and the running sum s of e^(z - m) (double), in thread scratch.
struct RowState {
  float* m;
  float* zt;
  double* s;
};

// The state of the block's first `rows` rows (of R), set to (-inf, 0, 0).
RowState row_state(i64 R, i64 rows) {
  float* m = detail::thread_scratch<struct LinearCeRows>(4 * R);
  const RowState st{m, m + R, reinterpret_cast<double*>(m + 2 * R)};
  for (i64 r = 0; r < rows; ++r) st.m[r] = kNegInf, st.zt[r] = 0.f, st.s[r] = 0;
  return st;
}

// The block's lse, and its valid rows' losses lse - zt summed into total (in row order, in double).
void finish_rows(const RowState& st, i64 r0, i64 rows, const int64_t* target, const LinearCeParams& p, float* lse,
                 double& total, i64& cnt) {
  for (i64 r = 0; r < rows; ++r) {
    const double l = static_cast<double>(st.m[r]) + std::log(st.s[r]);
    lse[r0 + r] = static_cast<float>(l);
    if (!valid(target[r0 + r], p.V, p.ignore_index)) continue;
    total += l - st.zt[r];
    ++cnt;
  }
}

i64 first_invalid(const int64_t* t, const LinearCeParams& p) {
  for (i64 i = 0; i < p.M; ++i)
    if (t[i] != p.ignore_index && !valid(t[i], p.V, p.ignore_index)) return i;
  return -1;
}

}  // namespace

i64 linear_ce_fwd(const float* x, const void* w, const float* scale, const float* b, const int64_t* target,
                  float* loss, float* lse, float* scratch, const LinearCeParams& p) {
  const i64 M = p.M, V = p.V, R = p.rows, C = p.cols;
  double total = 0;
  i64 cnt = 0;
  for (i64 r0 = 0; r0 < M; r0 += R) {
    const i64 rows = M < r0 + R ? M - r0 : R;
    const RowState st = row_state(R, rows);
    for (i64 v0 = 0; v0 < V; v0 += C) {
      const i64 n = V < v0 + C ? V - v0 : C;
      logits(x, w, scale, b, scratch, r0, rows, v0, n, p);
      parallel_for(rows, grain_for_work(n, kMinChunkMacs / 4), [&](i64 a, i64 e) {
        for (i64 r = a; r < e; ++r) {
          const float* z = scratch + r * n;
          const int64_t t = target[r0 + r];
          if (t >= v0 && t < v0 + n) st.zt[r] = z[t - v0];
          const float mb = vmath::vrow_max(z, n);
          if (!(mb > st.m[r])) {
            if (st.m[r] > kNegInf) st.s[r] += vmath::vsum_exp(z, n, st.m[r]);
            continue;
          }
          if (st.m[r] > kNegInf) st.s[r] *= std::exp(static_cast<double>(st.m[r]) - mb);
          st.s[r] += vmath::vsum_exp(z, n, mb);
          st.m[r] = mb;
        }
      });
    }
    finish_rows(st, r0, rows, target, p, lse, total, cnt);
  }
  loss[0] = cnt ? static_cast<float>(total / cnt) : 0.f;
  return first_invalid(target, p);
}

// linear_ce_fwd and, in the same pass over the tiles, dx[M,K] of dscale * loss: the backward's
// input gradient without recomputing the logits (a frozen head: no dw, no db), so the head costs two
// products per step instead of three.  Per row, as the online softmax of flash attention: with m the
// running max and s the running sum of e^(z - m), dx's row accumulates e^(z - m) W over the tiles,
// rescaled by e^(m_old - m_new) whenever a tile raises m; at the end
//   dx = g * (acc / s - W[t]),  g = dscale / count (0 on ignored rows, as linear_ce_bwd)
// the same gradient as linear_ce_bwd's (rounded differently: e^(z - m) / s, not e^(z - lse)).
// scratch: a tile of logits, and (lowp) a tile's rows x K product before it is added.
i64 linear_ce_fwd_dx(const float* x, const void* w, const float* scale, const float* b, const int64_t* target,
                     float* loss, float* lse, float* dx, float dscale, float* scratch, const LinearCeParams& p) {
  const i64 M = p.M, V = p.V, K = p.K, R = p.rows, C = p.cols;
  i64 cnt = 0;
  for (i64 i = 0; i < M; ++i) cnt += valid(target[i], V, p.ignore_index) ? 1 : 0;
  const double g = cnt > 0 ? static_cast<double>(dscale) / cnt : 0.0;
  float* tmp = scratch + R * C;  // a low-precision weight's tile product before it is added to dx
  double total = 0;
  i64 used = 0;
  for (i64 r0 = 0; r0 < M; r0 += R) {
    const i64 rows = M < r0 + R ? M - r0 : R;
    const RowState st = row_state(R, rows);
    float* d = dx + r0 * K;
    for (i64 v0 = 0; v0 < V; v0 += C) {
      const i64 n = V < v0 + C ? V - v0 : C;
      logits(x, w, scale, b, scratch, r0, rows, v0, n, p);
      parallel_for(rows, grain_for_work(n, kMinChunkMacs / 4), [&](i64 a, i64 e) {
        for (i64 r = a; r < e; ++r) {
          float* z = scratch + r * n;
          const int64_t t = target[r0 + r];
          if (t >= v0 && t < v0 + n) st.zt[r] = z[t - v0];
          const float mb = vmath::vrow_max(z, n);
          const float mn = mb > st.m[r] ? mb : st.m[r];  // a NaN tile keeps m (its exps make s NaN)
          if (v0 > 0 && mn > st.m[r]) {  // rescale the sum and the row of dx accumulated so far
            const double f = std::exp(static_cast<double>(st.m[r]) - mn);
            st.s[r] *= f;
            const simd::V vf = simd::vbcast(static_cast<float>(f));
            vmath::map_v(d + r * K, d + r * K, K, [vf](simd::V u) { return simd::vmul(u, vf); });
          }
          st.m[r] = mn;
          st.s[r] += vmath::vexp_store_sum(z, z, n, mn);  // the tile now holds e^(z - m)
        }
      });
      if (p.lowp) {
        linear_bwd_input_lowp(scratch, w_rows(w, p, v0), static_cast<LowpDtype>(p.dt), s_rows(scale, p, v0),
                              v0 ? tmp : d, rows, n, K);
        if (v0) vmath::map2_v(d, tmp, d, rows * K, [](simd::V u, simd::V c) { return simd::vadd(u, c); });
      } else {
        detail::gemm_strided(scratch, n, 1, static_cast<const float*>(w) + v0 * K, K, 1, d, K, rows, K, n, v0 > 0);
      }
    }
    finish_rows(st, r0, rows, target, p, lse, total, used);
    parallel_for(rows, grain_for_work(K, kMinChunkMacs / 4), [&](i64 a, i64 e) {
      float* wt = tmp + a * K;  // a low-precision target row, dequantized (rows x K of tmp: one per row)
      for (i64 r = a; r < e; ++r) {
        float* dr = d + r * K;
        const int64_t t = target[r0 + r];
        if (g == 0.0 || !valid(t, V, p.ignore_index)) {
          std::memset(dr, 0, sizeof(float) * K);
          continue;
        }
        const float* wr = static_cast<const float*>(w) + t * K;
        if (p.lowp) {
          detail::dequant_span(w, static_cast<LowpDtype>(p.dt), scale, K, t, 0, K, wt);
          wr = wt;
        }
        const simd::V vs = simd::vbcast(static_cast<float>(g / st.s[r])), vg = simd::vbcast(static_cast<float>(g));
        vmath::map2_v(dr, wr, dr, K, [vs, vg](simd::V u, simd::V c) {
          return simd::vsub(simd::vmul(vs, u), simd::vmul(vg, c));
        });
      }
    });
  }
  loss[0] = used ? static_cast<float>(total / used) : 0.f;
  return first_invalid(target, p);
}

void linear_ce_bwd_scale(const float* dloss, const float* dx1, float* dx, i64 n) {
  const simd::V d = simd::vbcast(dloss[0]);
  vmath::map_v(dx1, dx, n, [d](simd::V u) { return simd::vmul(d, u); });
}

i64 linear_ce_bwd(const float* dloss, const float* x, const void* w, const float* scale, const float* b,
                  const int64_t* target, const float* lse, float* dx, float* dw, float* db, float* scratch,
                  const LinearCeParams& p) {
  const i64 M = p.M, V = p.V, K = p.K, R = p.rows, C = p.cols;
  i64 cnt = 0;
  for (i64 i = 0; i < M; ++i) cnt += valid(target[i], V, p.ignore_index) ? 1 : 0;
  const float g = cnt > 0 ? static_cast<float>(static_cast<double>(dloss[0]) / cnt) : 0.f;
  float* tmp = scratch + R * C;  // a low-precision weight's dz W before it is summed into dx
  for (i64 r0 = 0; r0 < M; r0 += R) {
    const i64 rows = M < r0 + R ? M - r0 : R;
    for (i64 v0 = 0; v0 < V; v0 += C) {
      const i64 n = V < v0 + C ? V - v0 : C;
      float* dz = scratch;
      logits(x, w, scale, b, dz, r0, rows, v0, n, p);
      parallel_for(rows, grain_for_work(n, kMinChunkMacs / 4), [&](i64 a, i64 e) {
        for (i64 r = a; r < e; ++r) {
          float* z = dz + r * n;
          const int64_t t = target[r0 + r];
          if (cnt == 0 || !valid(t, V, p.ignore_index)) {
            std::memset(z, 0, sizeof(float) * n);
            continue;
          }
          const simd::V l = simd::vbcast(lse[r0 + r]), vg = simd::vbcast(g);
          vmath::map_v(z, z, n, [l, vg](simd::V v) { return simd::vmul(vg, vmath::vexp(simd::vsub(v, l))); });
          if (t >= v0 && t < v0 + n) z[t - v0] -= g;
        }
      });
      if (dx) {
        if (p.lowp) {
          linear_bwd_input_lowp(dz, w_rows(w, p, v0), static_cast<LowpDtype>(p.dt), s_rows(scale, p, v0),
                                v0 ? tmp : dx + r0 * K, rows, n, K);
          if (v0)
            vmath::map2_v(dx + r0 * K, tmp, dx + r0 * K, rows * K,
                          [](simd::V a, simd::V c) { return simd::vadd(a, c); });
        } else {
          detail::gemm_strided(dz, n, 1, static_cast<const float*>(w) + v0 * K, K, 1, dx + r0 * K, K, rows, K, n,
                               v0 > 0);
        }
      }
      if (dw)
        detail::gemm_strided(dz, 1, n, x + r0 * K, K, 1, dw + v0 * p.k, p.k, n, p.k, rows, r0 > 0);
      if (db)  // column sums, a row at a time (each column's sum in row order, as a scalar loop would)
        parallel_for(n, grain_for_work(rows, kMinChunkMacs / 4), [&](i64 a, i64 e) {
          float* d = db + v0 + a;
          if (r0 == 0) std::memset(d, 0, sizeof(float) * (e - a));
          for (i64 r = 0; r < rows; ++r)
            vmath::map2_v(d, dz + r * n + a, d, e - a, [](simd::V u, simd::V v) { return simd::vadd(u, v); });
        });
    }
  }
  return first_invalid(target, p);
}

}  // namespace pk
