// lstm.cpp — one layer, one direction, batch-first LSTM with PyTorch nn.LSTM
// semantics (gate order i, f, g, o; optional proj_size).
//
//   G_t = x_t W_ih^T + b_ih + b_hh + h_{t-1} W_hh^T        (pre-activations)
//   i, f, o = σ(G_t[i,f,o]);  g = tanh(G_t[g])
//   c_t = f*c_{t-1} + i*g;    r_t = o*tanh(c_t)
//   h_t = r_t W_hr^T (proj) or r_t
//
// Forward: the input projection of all timesteps goes straight into `gates` (one
// pk::gemm product per batch element); each step then adds the recurrent product
// and activates in place.
// h_{t-1} is read back from y (batch-first), c_{t-1} from `cells`.
//
// Backward (full BPTT): one reverse sweep produces the pre-activation gradients
// dG[T,B,4H] (and, with a projection, dH[T,B,P] = dL/dh_t) in scratch; the
// input and weight gradients are then a few large products over all T*B rows.
//
// Small batches (B * 4H * P below kStepMaxMacs, e.g. a keyboard LM at batch
// 1): each recurrent step is a few GEMVs that gemm() keeps on one thread, yet
// streams W_hh (and W_hr) from memory every step.  Those steps split the
// weights' rows over the threads instead (pk::parallel_for over hidden units
// or output columns, each slice one gemm_strided GEMV and, forward, the cells
// of the same hidden units), so every core streams -- and keeps in its own
// cache -- only its part of the weights.  Each output's arithmetic is the
// unsplit call's (GEMV columns and cell lanes are independent).
//
// Scratch layout (lstm_bwd_scratch_floats):
//   dG[T*B*4H] | dc[B*H] | proj: dH[T*B*P] dr[B*H]  /  no proj: dh[B*P]
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "fast_math.h"
#include "rnn_math.h"
#include "vec_math.h"

namespace pk {

using detail::gemm_strided;
using rnn::add_to;
using rnn::col_sum;

namespace {

using namespace simd;
using vmath::vsigmoid;
using vmath::vtanh;

// (row tails: simd::load_part zero-pads, and sigmoid / tanh of 0 are finite)

// One cell's activations in place (g = [i f g o] pre-activations -> gate values),
// c = f*c_prev + i*g, out = o*tanh(c), over simd.h vectors with vec_math.h's
// sigmoid / tanh (every element, the tail zero-padded, goes through the vector
// code, so forward and backward see the same tanh(c)).
template <bool kPrev>
void cell_fwd_impl(float* __restrict gi, float* __restrict gf, float* __restrict gc, float* __restrict go,
                   const float* __restrict cp, float* __restrict c, float* __restrict out, i64 H) {
  for (i64 j = 0; j < H; j += kW) {
    const i64 n = H - j < kW ? H - j : kW;
    const V ig = vsigmoid(load_part(gi + j, n)), fg = vsigmoid(load_part(gf + j, n));
    const V gg = vtanh(load_part(gc + j, n)), og = vsigmoid(load_part(go + j, n));
    store_part(gi + j, ig, n);
    store_part(gf + j, fg, n);
    store_part(gc + j, gg, n);
    store_part(go + j, og, n);
    const V cv = kPrev ? vfma(fg, load_part(cp + j, n), vmul(ig, gg)) : vmul(ig, gg);
    store_part(c + j, cv, n);
    store_part(out + j, vmul(og, vtanh(cv)), n);
  }
}

void cell_fwd(float* g, const float* cp, float* c, float* out, i64 H) {
  if (cp) cell_fwd_impl<true>(g, g + H, g + 2 * H, g + 3 * H, cp, c, out, H);
  else cell_fwd_impl<false>(g, g + H, g + 2 * H, g + 3 * H, cp, c, out, H);
}

// Pre-activation gradients of one cell from the stored gate values g, the cell
// c (and c_prev), dL/dr (dr) and the running dL/dc (dc, updated to dL/dc_prev).
template <bool kPrev>
void cell_bwd_impl(const float* __restrict gi, const float* __restrict gf, const float* __restrict gc,
                   const float* __restrict go, const float* __restrict c, const float* __restrict cp,
                   const float* __restrict dr, float* __restrict di, float* __restrict df, float* __restrict dgc,
                   float* __restrict dout, float* __restrict dc, i64 H) {
  const V one = vbcast(1.f);
  for (i64 j = 0; j < H; j += kW) {
    const i64 n = H - j < kW ? H - j : kW;
    const V ig = load_part(gi + j, n), fg = load_part(gf + j, n), gg = load_part(gc + j, n), og = load_part(go + j, n);
    const V tc = vtanh(load_part(c + j, n));
    const V drv = load_part(dr + j, n);
    const V dcv = vfma(vmul(drv, og), vsub(one, vmul(tc, tc)), load_part(dc + j, n));
    const V cpv = kPrev ? load_part(cp + j, n) : vzero();
    store_part(di + j, vmul(vmul(dcv, gg), vmul(ig, vsub(one, ig))), n);
    store_part(df + j, vmul(vmul(dcv, cpv), vmul(fg, vsub(one, fg))), n);
    store_part(dgc + j, vmul(vmul(dcv, ig), vsub(one, vmul(gg, gg))), n);
    store_part(dout + j, vmul(vmul(drv, tc), vmul(og, vsub(one, og))), n);
    store_part(dc + j, vmul(dcv, fg), n);
  }
}

void cell_bwd(const float* g, const float* c, const float* cp, const float* dr, float* dg, float* dc, i64 H) {
  if (cp) cell_bwd_impl<true>(g, g + H, g + 2 * H, g + 3 * H, c, cp, dr, dg, dg + H, dg + 2 * H, dg + 3 * H, dc, H);
  else cell_bwd_impl<false>(g, g + H, g + 2 * H, g + 3 * H, c, cp, dr, dg, dg + H, dg + 2 * H, dg + 3 * H, dc, H);
}

// The per-step split (see the top): below this many multiply-adds per step
// product gemm() would run on one thread.
constexpr i64 kStepMaxMacs = i64(1) << 20;
// Only while the pool really shares chunks (parallel_now): run on one thread,
// the split steps cost ~8% more than the unsplit ones (same results either way).
inline bool split_steps(const LstmParams& p) { return p.B * 4 * p.H * p.P < kStepMaxMacs && parallel_now(); }
// Hidden units (or output columns) per chunk: at least kMinChunkElems weights
// streamed, and one chunk per thread (n / threads units): a step's regions are
// short, so each thread claims one slice and no more hand-offs than needed.
inline i64 unit_grain(i64 n, i64 weights_per_unit) {
  const i64 g = grain_for_work(weights_per_unit, kMinChunkElems), per_thread = n / num_threads();
  return g > per_thread ? g : per_thread;
}

}  // namespace

void lstm_fwd(const float* x, const float* h0, const float* c0, const float* w_ih, const float* w_hh,
              const float* b_ih, const float* b_hh, const float* w_hr, float* y, float* hn, float* cn,
              float* gates, float* cells, float* hraw, const LstmParams& p) {
  const i64 B = p.B, T = p.T, I = p.I, H = p.H, P = p.P, G = 4 * H;
  const bool proj = p.has_proj;
  const float* bi = p.has_bias ? b_ih : nullptr;
  const float* bh = p.has_bias ? b_hh : nullptr;
  if (T == 0) {
    if (hn) for (i64 j = 0; j < B * P; ++j) hn[j] = h0 ? h0[j] : 0.f;
    if (cn) for (i64 j = 0; j < B * H; ++j) cn[j] = c0 ? c0[j] : 0.f;
    return;
  }

  // Input projection of every timestep: gates[t,b,:] = x[b,t,:] W_ih^T + b_ih + b_hh
  // (biases written first, the product accumulated onto them), one product of
  // T rows per batch element (x[b] is a dense [T,I] block; its gate rows are B*4H apart).
  if (bi)
    for (i64 r = 0; r < T * B; ++r)
      for (i64 j = 0; j < G; ++j) gates[r * G + j] = bi[j] + bh[j];
  for (i64 b = 0; b < B; ++b)
    gemm_strided(x + b * T * I, I, 1, w_ih, 1, I, gates + b * G, B * G, T, G, I, bi != nullptr);

  const bool split = split_steps(p);
  for (i64 t = 0; t < T; ++t) {
    float* gt = gates + t * B * G;
    float* ct = cells + t * B * H;
    // h_{t-1}: y[:, t-1, :] or h0 (absent = zeros, nothing to add)
    const float* hp = t > 0 ? y + (t - 1) * P : h0;
    const i64 hp_rs = t > 0 ? T * P : P;
    if (split) {
      // hidden units [j0, j1): their rows of the four gates' W_hh, then their cells
      parallel_for_aligned(H, unit_grain(H, 4 * P * B), kW, [&](i64 j0, i64 j1) {
        if (hp)
          for (i64 q = 0; q < 4; ++q)
            gemm_strided(hp, hp_rs, 1, w_hh + (q * H + j0) * P, 1, P, gt + q * H + j0, G, B, j1 - j0, P, true);
        for (i64 b = 0; b < B; ++b) {
          float* g = gt + b * G + j0;
          const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
          float* out = (proj ? hraw + (t * B + b) * H : y + (b * T + t) * P) + j0;
          if (cp) cell_fwd_impl<true>(g, g + H, g + 2 * H, g + 3 * H, cp + j0, ct + b * H + j0, out, j1 - j0);
          else cell_fwd_impl<false>(g, g + H, g + 2 * H, g + 3 * H, nullptr, ct + b * H + j0, out, j1 - j0);
        }
      });
      // h_t = r_t W_hr^T, output columns [p0, p1)
      if (proj)
        parallel_for(P, unit_grain(P, H * B), [&](i64 p0, i64 p1) {
          gemm_strided(hraw + t * B * H, H, 1, w_hr + p0 * H, 1, H, y + t * P + p0, T * P, B, p1 - p0, H, false);
        });
      continue;
    }
    if (hp) gemm_strided(hp, hp_rs, 1, w_hh, 1, P, gt, G, B, G, P, true);

    for (i64 b = 0; b < B; ++b) {
      float* g = gt + b * G;
      const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
      float* out = proj ? hraw + (t * B + b) * H : y + (b * T + t) * P;
      cell_fwd(g, cp, ct + b * H, out, H);
    }
    // h_t = r_t W_hr^T
    if (proj) gemm_strided(hraw + t * B * H, H, 1, w_hr, 1, H, y + t * P, T * P, B, P, H, false);
  }

  if (hn)
    for (i64 b = 0; b < B; ++b) std::memcpy(hn + b * P, y + (b * T + T - 1) * P, sizeof(float) * P);
  if (cn) std::memcpy(cn, cells + (T - 1) * B * H, sizeof(float) * B * H);
}

void lstm_bwd(const float* dy, const float* dhn, const float* dcn, const float* x, const float* h0,
              const float* c0, const float* w_ih, const float* w_hh, const float* w_hr, const float* y,
              const float* gates, const float* cells, const float* hraw, float* dx, float* dh0, float* dc0,
              float* dw_ih, float* dw_hh, float* db_ih, float* db_hh, float* dw_hr, float* scratch,
              const LstmParams& p, i64 k_ih, i64 k_hh, i64 k_hr) {
  const i64 B = p.B, T = p.T, I = p.I, H = p.H, P = p.P, G = 4 * H;
  const bool proj = p.has_proj;
  if (!p.has_bias) db_ih = db_hh = nullptr;
  if (!proj) dw_hr = nullptr;
  if (T == 0) {
    if (dh0) for (i64 j = 0; j < B * P; ++j) dh0[j] = dhn ? dhn[j] : 0.f;
    if (dc0) for (i64 j = 0; j < B * H; ++j) dc0[j] = dcn ? dcn[j] : 0.f;
    if (dw_ih) std::memset(dw_ih, 0, sizeof(float) * G * k_ih);
    if (dw_hh) std::memset(dw_hh, 0, sizeof(float) * G * k_hh);
    if (db_ih) std::memset(db_ih, 0, sizeof(float) * G);
    if (db_hh) std::memset(db_hh, 0, sizeof(float) * G);
    if (dw_hr) std::memset(dw_hr, 0, sizeof(float) * P * k_hr);
    return;
  }

  float* dG = scratch;               // [T,B,4H] pre-activation gradients
  float* dc = dG + T * B * G;        // [B,H]    dL/dc_t, running
  float* dH = dc + B * H;            // proj: [T,B,P] dL/dh_t for every t; else [B,P] running
  float* dr = proj ? dH + T * B * P : nullptr;  // proj: [B,H] dL/dr_t

  // dh_{T-1} from dhn; dc_{T-1} from dcn
  float* dh_last = proj ? dH + (T - 1) * B * P : dH;
  if (dhn) std::memcpy(dh_last, dhn, sizeof(float) * B * P);
  else std::memset(dh_last, 0, sizeof(float) * B * P);
  if (dcn) std::memcpy(dc, dcn, sizeof(float) * B * H);
  else std::memset(dc, 0, sizeof(float) * B * H);

  const bool split = split_steps(p);
  for (i64 t = T - 1; t >= 0; --t) {
    // dh_t = dy[:, t, :] + (recurrent part already in dh)
    float* dh = proj ? dH + t * B * P : dH;
    for (i64 b = 0; b < B; ++b) add_to(dh + b * P, dy + (b * T + t) * P, P);
    if (split) {
      const float* gt = gates + t * B * G;
      float* dgt = dG + t * B * G;
      // hidden units [j0, j1): dr = dh W_hr[:, j0:j1], then their cells' gradients
      parallel_for_aligned(H, unit_grain(H, P * B), kW, [&](i64 j0, i64 j1) {
        if (proj) gemm_strided(dh, P, 1, w_hr + j0, H, 1, dr + j0, H, B, j1 - j0, P, false);
        const float* drt = proj ? dr : dh;
        for (i64 b = 0; b < B; ++b) {
          const float* g = gt + b * G + j0;
          const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
          float* dg = dgt + b * G + j0;
          const float* c = cells + (t * B + b) * H + j0;
          if (cp)
            cell_bwd_impl<true>(g, g + H, g + 2 * H, g + 3 * H, c, cp + j0, drt + b * H + j0, dg, dg + H, dg + 2 * H,
                                dg + 3 * H, dc + b * H + j0, j1 - j0);
          else
            cell_bwd_impl<false>(g, g + H, g + 2 * H, g + 3 * H, c, nullptr, drt + b * H + j0, dg, dg + H,
                                 dg + 2 * H, dg + 3 * H, dc + b * H + j0, j1 - j0);
        }
      });
      // recurrent part of dh_{t-1} = dG_t W_hh, output columns [p0, p1) (at t == 0: dh0)
      float* dst = t > 0 ? (proj ? dH + (t - 1) * B * P : dH) : dh0;
      if (dst)
        parallel_for(P, unit_grain(P, G * B), [&](i64 p0, i64 p1) {
          gemm_strided(dgt, G, 1, w_hh + p0, P, 1, dst + p0, P, B, p1 - p0, G, false);
        });
      continue;
    }
    const float* drt = dh;  // dL/dr_t
    if (proj) {
      gemm(dh, w_hr, dr, GemmParams{1, B, H, P, false, false, 0, 0, 0, 0.f});
      drt = dr;
    }

    const float* gt = gates + t * B * G;
    float* dgt = dG + t * B * G;
    for (i64 b = 0; b < B; ++b) {
      const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
      cell_bwd(gt + b * G, cells + (t * B + b) * H, cp, drt + b * H, dgt + b * G, dc + b * H, H);
    }

    // recurrent part of dh_{t-1} = dG_t W_hh  (at t == 0: dh0)
    float* dst = t > 0 ? (proj ? dH + (t - 1) * B * P : dH) : dh0;
    if (dst) gemm(dgt, w_hh, dst, GemmParams{1, B, P, G, false, false, 0, 0, 0, 0.f});
  }
  if (dc0) std::memcpy(dc0, dc, sizeof(float) * B * H);

  // ---- large products over all T*B rows ----
  // dG is [T,B,4H]; x, y and dx are batch-first, so the products touching them
  // run per batch element b: dG[:, b, :] is T rows B*4H apart, x[b] a dense [T,I].
  const i64 TB = T * B;
  if (dx)
    for (i64 b = 0; b < B; ++b)
      gemm_strided(dG + b * G, B * G, 1, w_ih, I, 1, dx + b * T * I, I, T, I, G, false);
  if (dw_ih)  // dW_ih[:, 0:k_ih] = sum_b dG[:, b, :]^T x[b][:, 0:k_ih]
    for (i64 b = 0; b < B; ++b)
      gemm_strided(dG + b * G, 1, B * G, x + b * T * I, I, 1, dw_ih, k_ih, G, k_ih, T, b > 0);
  if (dw_hh) {
    // h_{t-1} = y[:, t-1, :] for t >= 1, h0 (absent = zeros) for t = 0
    for (i64 b = 0; b < B; ++b)
      gemm_strided(dG + B * G + b * G, 1, B * G, y + b * T * P, P, 1, dw_hh, k_hh, G, k_hh, T - 1, b > 0);
    if (h0) gemm_strided(dG, 1, G, h0, P, 1, dw_hh, k_hh, G, k_hh, B, true);
  }
  if (db_ih || db_hh) {
    float* db = db_ih ? db_ih : db_hh;
    col_sum(TB, G, dG, G, db);
    if (db_ih && db_hh) std::memcpy(db_hh, db_ih, sizeof(float) * G);
  }
  if (dw_hr) gemm_strided(dH, 1, P, hraw, H, 1, dw_hr, k_hr, P, k_hr, TB, false);
}

}  // namespace pk
