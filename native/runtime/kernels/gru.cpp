// gru.cpp — one layer, one direction, batch-first GRU with PyTorch nn.GRU
// semantics (gate order r, z, n; b_hn inside r * (...)).
//
//   r = σ(Wir x + b_ir + Whr h + b_hr);  z = σ(Wiz x + b_iz + Whz h + b_hz)
//   n = tanh(Win x + b_in + r * (Whn h + b_hn));  h' = (1-z)*n + z*h
//
// Forward: the input projection of all timesteps is one product straight into
// saved[t,b,0:3H] (b_hr, b_hz folded in); each step adds W_h{r,z} h to the r,z
// slots, writes W_hn h + b_hn to slot 3 and activates in place, leaving
// saved[t,b,:] = (r, z, n, W_hn h + b_hn).  h_{t-1} is read back from y.
//
// Backward (full BPTT): one reverse sweep writes, per step, into scratch
//   dG[t,b,:] = (da_r, da_z, da_n, r*da_n)
// where a_* are the gate pre-activations: columns 0:3H are the gradient of the
// input projection (x W_ih^T + b_ih), columns (0:2H, 3H:4H) that of the hidden
// projection (h W_hh^T + b_hh).  Input and weight gradients are then large
// products over all T*B rows.
//
// Small batches (B * 3H * H below kStepMaxMacs, e.g. batch 1) split each
// step's GEMVs over the threads as lstm.cpp does: forward by hidden unit (the
// three gates' W_hh rows of those units, then their cells), backward's dh
// products by output column.
//
// Scratch layout (gru_bwd_scratch_floats):  dG[T*B*4H] | dh[B*H]
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "rnn_math.h"
#include "vec_math.h"

namespace pk {

using detail::gemm_strided;
using rnn::col_sum;

namespace {

using namespace simd;

// (row tails: simd::load_part zero-pads, and sigmoid / tanh of 0 are finite)

// One batch row of one step, in place: s = [a_r, a_z, a_n (input part), W_hn h + b_hn]
// -> [r, z, n, unchanged]; out = n + z * (h - n) (h null: zeros).  Over simd.h
// vectors with vec_math.h's sigmoid / tanh, the tail zero-padded.
void gru_cell_fwd(float* __restrict s, const float* __restrict h, float* __restrict out, i64 H, i64 j0, i64 j1) {
  for (i64 j = j0; j < j1; j += kW) {
    const i64 n = j1 - j < kW ? j1 - j : kW;
    const V r = vmath::vsigmoid(load_part(s + j, n));
    const V z = vmath::vsigmoid(load_part(s + H + j, n));
    const V nv = vmath::vtanh(vfma(r, load_part(s + 3 * H + j, n), load_part(s + 2 * H + j, n)));
    store_part(s + j, r, n);
    store_part(s + H + j, z, n);
    store_part(s + 2 * H + j, nv, n);
    const V hv = h ? load_part(h + j, n) : vzero();
    store_part(out + j, vfma(z, vsub(hv, nv), nv), n);
  }
}

// The per-step split (see the top): below this many multiply-adds per step
// product gemm() would run on one thread.
constexpr i64 kStepMaxMacs = i64(1) << 20;
inline bool split_steps(const GruParams& p) { return p.B * 3 * p.H * p.H < kStepMaxMacs && parallel_now(); }
// Hidden units (or output columns) per chunk: at least kMinChunkElems weights
// streamed, and one chunk per thread (n / threads units): a step's regions are
// short, so each thread claims one slice and no more hand-offs than needed.
inline i64 unit_grain(i64 n, i64 weights_per_unit) {
  const i64 g = grain_for_work(weights_per_unit, kMinChunkElems), per_thread = n / num_threads();
  return g > per_thread ? g : per_thread;
}

}  // namespace

void gru_fwd(const float* x, const float* h0, const float* w_ih, const float* w_hh, const float* b_ih,
             const float* b_hh, float* y, float* hn, float* saved, const GruParams& p) {
  const i64 B = p.B, T = p.T, I = p.I, H = p.H, S = 4 * H;
  const float* bi = p.has_bias ? b_ih : nullptr;
  const float* bh = p.has_bias ? b_hh : nullptr;
  if (T == 0) {
    if (hn) for (i64 j = 0; j < B * H; ++j) hn[j] = h0 ? h0[j] : 0.f;
    return;
  }

  // Input projection of every timestep into saved[t,b,0:3H]:
  //   r,z slots: x W_i{r,z}^T + b_i{r,z} + b_h{r,z};  n slot: x W_in^T + b_in
  // (biases written first, the product accumulated onto them), one product of
  // T rows per batch element (x[b] is a dense [T,I] block; its rows in saved are B*4H apart).
  if (bi)
    for (i64 r = 0; r < T * B; ++r) {
      float* s = saved + r * S;
      for (i64 j = 0; j < 2 * H; ++j) s[j] = bi[j] + bh[j];
      for (i64 j = 2 * H; j < 3 * H; ++j) s[j] = bi[j];
    }
  for (i64 b = 0; b < B; ++b)
    gemm_strided(x + b * T * I, I, 1, w_ih, 1, I, saved + b * S, B * S, T, 3 * H, I, bi != nullptr);

  const bool split = split_steps(p);
  for (i64 t = 0; t < T; ++t) {
    float* st = saved + t * B * S;
    if (split) {
      // hidden units [j0, j1): their rows of W_h{r,z,n}, then their cells
      const float* hp = t > 0 ? y + (t - 1) * H : h0;
      const i64 hp_rs = t > 0 ? T * H : H;
      parallel_for_aligned(H, unit_grain(H, 3 * H * B), kW, [&](i64 j0, i64 j1) {
        for (i64 b = 0; b < B; ++b)
          for (i64 j = j0; j < j1; ++j) st[b * S + 3 * H + j] = bh ? bh[2 * H + j] : 0.f;
        if (hp) {
          gemm_strided(hp, hp_rs, 1, w_hh + j0 * H, 1, H, st + j0, S, B, j1 - j0, H, true);
          gemm_strided(hp, hp_rs, 1, w_hh + (H + j0) * H, 1, H, st + H + j0, S, B, j1 - j0, H, true);
          gemm_strided(hp, hp_rs, 1, w_hh + (2 * H + j0) * H, 1, H, st + 3 * H + j0, S, B, j1 - j0, H, true);
        }
        for (i64 b = 0; b < B; ++b) {
          const float* h = t > 0 ? y + (b * T + t - 1) * H : (h0 ? h0 + b * H : nullptr);
          gru_cell_fwd(st + b * S, h, y + (b * T + t) * H, H, j0, j1);
        }
      });
      continue;
    }
    // h_{t-1}: y[:, t-1, :] or h0 (absent = zeros)
    // slot 3H:4H = W_hn h + b_hn: the bias first, the product accumulated onto it
    for (i64 b = 0; b < B; ++b)
      for (i64 j = 0; j < H; ++j) st[b * S + 3 * H + j] = bh ? bh[2 * H + j] : 0.f;
    if (t > 0 || h0) {
      const float* hp = t > 0 ? y + (t - 1) * H : h0;  // rows b of h_{t-1}, hp_rs apart
      const i64 hp_rs = t > 0 ? T * H : H;
      gemm_strided(hp, hp_rs, 1, w_hh, 1, H, st, S, B, 2 * H, H, true);
      gemm_strided(hp, hp_rs, 1, w_hh + 2 * H * H, 1, H, st + 3 * H, S, B, H, H, true);
    }

    for (i64 b = 0; b < B; ++b) {
      float* s = st + b * S;
      const float* h = t > 0 ? y + (b * T + t - 1) * H : (h0 ? h0 + b * H : nullptr);
      float* out = y + (b * T + t) * H;
      gru_cell_fwd(s, h, out, H, 0, H);
    }
  }
  if (hn)
    for (i64 b = 0; b < B; ++b) std::memcpy(hn + b * H, y + (b * T + T - 1) * H, sizeof(float) * H);
}

void gru_bwd(const float* dy, const float* dhn, const float* x, const float* h0, const float* w_ih,
             const float* w_hh, const float* y, const float* saved, float* dx, float* dh0, float* dw_ih,
             float* dw_hh, float* db_ih, float* db_hh, float* scratch, const GruParams& p, i64 k_ih, i64 k_hh) {
  const i64 B = p.B, T = p.T, I = p.I, H = p.H, S = 4 * H;
  if (!p.has_bias) db_ih = db_hh = nullptr;
  if (T == 0) {
    if (dh0) for (i64 j = 0; j < B * H; ++j) dh0[j] = dhn ? dhn[j] : 0.f;
    if (dw_ih) std::memset(dw_ih, 0, sizeof(float) * 3 * H * k_ih);
    if (dw_hh) std::memset(dw_hh, 0, sizeof(float) * 3 * H * k_hh);
    if (db_ih) std::memset(db_ih, 0, sizeof(float) * 3 * H);
    if (db_hh) std::memset(db_hh, 0, sizeof(float) * 3 * H);
    return;
  }

  float* dG = scratch;         // [T,B,4H] (da_r, da_z, da_n, r*da_n)
  float* dh = dG + T * B * S;  // [B,H] dL/dh_t, running
  if (dhn) std::memcpy(dh, dhn, sizeof(float) * B * H);
  else std::memset(dh, 0, sizeof(float) * B * H);

  const bool split = split_steps(p);
  for (i64 t = T - 1; t >= 0; --t) {
    const float* st = saved + t * B * S;
    float* dgt = dG + t * B * S;
    for (i64 b = 0; b < B; ++b) {
      const float* s = st + b * S;
      const float* dyb = dy + (b * T + t) * H;
      const float* h = t > 0 ? y + (b * T + t - 1) * H : (h0 ? h0 + b * H : nullptr);
      float* dg = dgt + b * S;
      float* dhb = dh + b * H;
      for (i64 j = 0; j < H; ++j) {
        const float r = s[j], z = s[H + j], n = s[2 * H + j], ghn = s[3 * H + j];
        const float hv = h ? h[j] : 0.f;
        const float d = dhb[j] + dyb[j];
        const float da_n = d * (1.f - z) * (1.f - n * n);
        dg[j] = da_n * ghn * r * (1.f - r);
        dg[H + j] = d * (hv - n) * z * (1.f - z);
        dg[2 * H + j] = da_n;
        dg[3 * H + j] = da_n * r;
        dhb[j] = d * z;  // direct path; the recurrent products are added below
      }
    }
    if ((t > 0 || dh0) && split) {
      // the same products, output columns [c0, c1) per chunk
      parallel_for(H, unit_grain(H, 3 * H * B), [&](i64 c0, i64 c1) {
        gemm_strided(dgt, S, 1, w_hh + c0, H, 1, dh + c0, H, B, c1 - c0, 2 * H, true);
        gemm_strided(dgt + 3 * H, S, 1, w_hh + 2 * H * H + c0, H, 1, dh + c0, H, B, c1 - c0, H, true);
      });
    } else if (t > 0 || dh0) {
      // dh_{t-1} += dG_t[:, 0:2H] W_hh[0:2H] + dG_t[:, 3H:4H] W_hh[2H:3H]
      gemm_strided(dgt, S, 1, w_hh, H, 1, dh, H, B, H, 2 * H, true);
      gemm_strided(dgt + 3 * H, S, 1, w_hh + 2 * H * H, H, 1, dh, H, B, H, H, true);
    }
  }
  if (dh0) std::memcpy(dh0, dh, sizeof(float) * B * H);

  // ---- large products over all T*B rows ----
  const i64 TB = T * B;
  // dG is [T,B,4H] (cols 0:3H: input-projection grads, 3H:4H: hidden n-part);
  // x, y and dx are batch-first, so the products touching them run per batch
  // element b: dG[:, b, :] is T rows B*4H apart, x[b] a dense [T,I].
  if (dx)
    for (i64 b = 0; b < B; ++b)
      gemm_strided(dG + b * S, B * S, 1, w_ih, I, 1, dx + b * T * I, I, T, I, 3 * H, false);
  if (dw_ih)  // dW_ih[:, 0:k_ih] = sum_b dG[:, b, 0:3H]^T x[b][:, 0:k_ih]
    for (i64 b = 0; b < B; ++b)
      gemm_strided(dG + b * S, 1, B * S, x + b * T * I, I, 1, dw_ih, k_ih, 3 * H, k_ih, T, b > 0);
  if (dw_hh) {
    // h_{t-1} = y[:, t-1, :] for t >= 1, h0 (absent = zeros) for t = 0;
    // rows 0:2H pair with dG cols 0:2H, rows 2H:3H with cols 3H:4H
    for (i64 b = 0; b < B; ++b) {
      const float* dg1 = dG + B * S + b * S;  // dG[1:, b, :]
      gemm_strided(dg1, 1, B * S, y + b * T * H, H, 1, dw_hh, k_hh, 2 * H, k_hh, T - 1, b > 0);
      gemm_strided(dg1 + 3 * H, 1, B * S, y + b * T * H, H, 1, dw_hh + 2 * H * k_hh, k_hh, H, k_hh, T - 1, b > 0);
    }
    if (h0) {
      gemm_strided(dG, 1, S, h0, H, 1, dw_hh, k_hh, 2 * H, k_hh, B, true);
      gemm_strided(dG + 3 * H, 1, S, h0, H, 1, dw_hh + 2 * H * k_hh, k_hh, H, k_hh, B, true);
    }
  }
  if (db_ih) col_sum(TB, 3 * H, dG, S, db_ih);
  if (db_hh) {
    col_sum(TB, 2 * H, dG, S, db_hh);
    col_sum(TB, H, dG + 3 * H, S, db_hh + 2 * H);
  }
}

}  // namespace pk
