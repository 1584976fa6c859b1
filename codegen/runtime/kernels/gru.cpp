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
// Scratch layout (gru_bwd_scratch_floats):  dG[T*B*4H] | dh[B*H]
#include <cmath>
#include <cstring>

#include "pock_kernels.h"

namespace pk {
namespace {

// ---- small matrix-product helpers (file-local, identical to lstm.cpp's;
//      no dependence on pk::gemm) ----
//
//   mm_nt  C_r = A_r W^T + bias   dot form      (input / recurrent projections)
//   mm_nn  C_r = A_r W            outer product (dx, dh)
//   mm_tn  C   = A^T X            outer product (weight gradients)
// Each keeps a small tile of C in registers; the fixed-size inner loops
// vectorize even under -O2's cheapest vectorizer cost model, without
// reassociation flags.

// A set of matrix rows: row r = (o, i), o = r / ni, i = r % ni, lives at
// base + o*so + i*si.  Walks [T,B,*] and batch-first [B,T,*] tensors (and
// time-shifted views of them) without copying.
template <typename F>
struct Rows {
  F* base;
  i64 ni, so, si;
};
template <typename F>
Rows<F> dense(F* base, i64 ld) { return {base, 1, ld, 0}; }
// rows (t, b) of a batch-first [B,T,width] tensor, t-major, starting at time t0
template <typename F>
Rows<F> batch_first(F* base, i64 B, i64 T, i64 width, i64 t0) { return {base + t0 * width, B, width, T * width}; }

// Sequential walk over a Rows set from row r on (no divisions per row).
template <typename F>
struct RowCursor {
  F* outer;
  F* p;
  i64 i, ni, so, si;
  RowCursor(const Rows<F>& R, i64 r)
      : outer(R.base + (r / R.ni) * R.so), p(nullptr), i(r % R.ni), ni(R.ni), so(R.so), si(R.si) {
    p = outer + i * si;
  }
  void next() {
    if (++i == ni) {
      i = 0;
      outer += so;
      p = outer;
    } else {
      p += si;
    }
  }
};

constexpr int kLanes = 8;     // independent partial sums per dot product
constexpr i64 kDepth = 256;   // reduction-depth block of the outer-product kernels
constexpr i64 kPanel = 8192;  // floats of W kept hot by mm_nt (32 KB)

template <int MR, int NC>
inline void store_tile(const float (&s)[MR][NC], float* const (&c)[MR], bool acc) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NC; ++j) c[m][j] = acc ? c[m][j] + s[m][j] : s[m][j];
}

// c[m][n] (= or +=) b1[n] + b2[n] + dot(a[m][0:K], w[n*ldw : n*ldw+K])
template <int MR, int NR>
inline void nt_tile(const float* const (&a)[MR], const float* w, i64 ldw, i64 K, float* const (&c)[MR],
                    const float* b1, const float* b2, bool acc) {
  float s[MR][NR][kLanes] = {};
  i64 k = 0;
  for (; k + kLanes <= K; k += kLanes)
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n)
        for (int l = 0; l < kLanes; ++l) s[m][n][l] += a[m][k + l] * w[n * ldw + k + l];
  float out[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      float v = 0.f;
      for (int l = 0; l < kLanes; ++l) v += s[m][n][l];
      for (i64 kk = k; kk < K; ++kk) v += a[m][kk] * w[n * ldw + kk];
      if (b1) v += b1[n];
      if (b2) v += b2[n];
      out[m][n] = v;
    }
  store_tile<MR, NR>(out, c, acc);
}

template <int MR>
void nt_rows(RowCursor<const float>& ra, RowCursor<float>& rc, i64 n0, i64 n1, i64 K, const float* W, i64 ldw,
             const float* b1, const float* b2, bool acc) {
  const float* a[MR];
  float* c[MR];
  for (int m = 0; m < MR; ++m, ra.next(), rc.next()) {
    a[m] = ra.p;
    c[m] = rc.p;
  }
  i64 n = n0;
  for (; n + 4 <= n1; n += 4) {
    float* cn[MR];
    for (int m = 0; m < MR; ++m) cn[m] = c[m] + n;
    nt_tile<MR, 4>(a, W + n * ldw, ldw, K, cn, b1 ? b1 + n : nullptr, b2 ? b2 + n : nullptr, acc);
  }
  for (; n < n1; ++n) {
    float* cn[MR];
    for (int m = 0; m < MR; ++m) cn[m] = c[m] + n;
    nt_tile<MR, 1>(a, W + n * ldw, ldw, K, cn, b1 ? b1 + n : nullptr, b2 ? b2 + n : nullptr, acc);
  }
}

// C_r[n] (= or +=) b1[n] + b2[n] + dot(A_r[0:K], W_n[0:K])   r<M, n<N; W is [N, ldw]; b1, b2 nullable
void mm_nt(i64 M, i64 N, i64 K, Rows<const float> A, const float* W, i64 ldw, Rows<float> C, const float* b1,
           const float* b2, bool acc) {
  i64 nb = kPanel / (K > 0 ? K : 1) / 4 * 4;  // a panel of W rows stays in L1 while all of A passes
  if (nb < 4) nb = 4;
  for (i64 n0 = 0; n0 < N; n0 += nb) {
    const i64 n1 = n0 + nb < N ? n0 + nb : N;
    RowCursor<const float> ra(A, 0);
    RowCursor<float> rc(C, 0);
    i64 r = 0;
    for (; r + 2 <= M; r += 2) nt_rows<2>(ra, rc, n0, n1, K, W, ldw, b1, b2, acc);
    for (; r < M; ++r) nt_rows<1>(ra, rc, n0, n1, K, W, ldw, b1, b2, acc);
  }
}

// c[m][0:NC] (= or +=) sum_k a[m][k] * w[k*ldw + 0:NC]
template <int MR, int NC>
inline void nn_tile(const float* const (&a)[MR], const float* w, i64 ldw, i64 K, float* const (&c)[MR], bool acc) {
  float s[MR][NC] = {};
  for (i64 k = 0; k < K; ++k) {
    const float* wk = w + k * ldw;
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const float u = a[m][k];
      for (int j = 0; j < NC; ++j) s[m][j] += u * wk[j];
    }
  }
  store_tile<MR, NC>(s, c, acc);
}

template <int NC>
void nn_cols(i64 M, i64 j, i64 k0, i64 K, Rows<const float> A, const float* W, i64 ldw, Rows<float> C, bool acc) {
  RowCursor<const float> ra(A, 0);
  RowCursor<float> rc(C, 0);
  const float* w = W + k0 * ldw + j;
  i64 r = 0;
  for (; r + 4 <= M; r += 4) {
    const float* a[4];
    float* c[4];
    for (int m = 0; m < 4; ++m, ra.next(), rc.next()) {
      a[m] = ra.p + k0;
      c[m] = rc.p + j;
    }
    nn_tile<4, NC>(a, w, ldw, K, c, acc);
  }
  for (; r < M; ++r, ra.next(), rc.next()) {
    const float* a[1] = {ra.p + k0};
    float* c[1] = {rc.p + j};
    nn_tile<1, NC>(a, w, ldw, K, c, acc);
  }
}

// C_r[0:N] (= or +=) sum_k A_r[k] * W[k*ldw + 0:N]   r<M; W is [K, ldw]
void mm_nn(i64 M, i64 N, i64 K, Rows<const float> A, const float* W, i64 ldw, Rows<float> C, bool acc) {
  if (K == 0) {
    if (!acc)
      for (RowCursor<float> rc(C, 0); M > 0; --M, rc.next()) std::memset(rc.p, 0, sizeof(float) * N);
    return;
  }
  for (i64 k0 = 0; k0 < K; k0 += kDepth) {
    const i64 kc = K - k0 < kDepth ? K - k0 : kDepth;
    const bool a2 = acc || k0 > 0;
    i64 j = 0;
    for (; j + 16 <= N; j += 16) nn_cols<16>(M, j, k0, kc, A, W, ldw, C, a2);
    for (; j + 8 <= N; j += 8) nn_cols<8>(M, j, k0, kc, A, W, ldw, C, a2);
    for (; j < N; ++j) nn_cols<1>(M, j, k0, kc, A, W, ldw, C, a2);
  }
}

// c[m][0:NC] (= or +=) sum over K rows of A_row[n+m] * X_row[j : j+NC]
template <int MR, int NC>
inline void tn_tile(RowCursor<const float> ra, RowCursor<const float> rx, i64 n, i64 j, i64 K,
                    float* const (&c)[MR], bool acc) {
  float s[MR][NC] = {};
  for (i64 k = 0; k < K; ++k, ra.next(), rx.next()) {
    const float* u = ra.p + n;
    const float* v = rx.p + j;
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m)
      for (int jj = 0; jj < NC; ++jj) s[m][jj] += u[m] * v[jj];
  }
  store_tile<MR, NC>(s, c, acc);
}

template <int NC>
void tn_cols(i64 N, i64 j, i64 K, const RowCursor<const float>& ra, const RowCursor<const float>& rx, float* C,
             i64 ldc, bool acc) {
  i64 n = 0;
  for (; n + 4 <= N; n += 4) {
    float* c[4] = {C + n * ldc + j, C + (n + 1) * ldc + j, C + (n + 2) * ldc + j, C + (n + 3) * ldc + j};
    tn_tile<4, NC>(ra, rx, n, j, K, c, acc);
  }
  for (; n < N; ++n) {
    float* c[1] = {C + n * ldc + j};
    tn_tile<1, NC>(ra, rx, n, j, K, c, acc);
  }
}

// C[n*ldc + 0:k] (= or +=) sum_r A_r[n] * X_r[0:k]   n<N, r<M   (a dW = dG^T X product)
void mm_tn(i64 N, i64 k, i64 M, Rows<const float> A, Rows<const float> X, float* C, i64 ldc, bool acc) {
  if (M == 0) {
    if (!acc)
      for (i64 n = 0; n < N; ++n) std::memset(C + n * ldc, 0, sizeof(float) * k);
    return;
  }
  for (i64 r0 = 0; r0 < M; r0 += kDepth) {
    const i64 rc = M - r0 < kDepth ? M - r0 : kDepth;
    const RowCursor<const float> ra(A, r0), rx(X, r0);
    const bool a2 = acc || r0 > 0;
    i64 j = 0;
    for (; j + 32 <= k; j += 32) tn_cols<32>(N, j, rc, ra, rx, C, ldc, a2);
    for (; j + 16 <= k; j += 16) tn_cols<16>(N, j, rc, ra, rx, C, ldc, a2);
    for (; j + 8 <= k; j += 8) tn_cols<8>(N, j, rc, ra, rx, C, ldc, a2);
    for (; j < k; ++j) tn_cols<1>(N, j, rc, ra, rx, C, ldc, a2);
  }
}

// c[0:n] += a * x[0:n]  (fixed-width chunks + scalar tail)
inline void axpy(float* __restrict c, const float* __restrict x, float a, i64 n) {
  i64 j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) c[j + l] += a * x[j + l];
  for (; j < n; ++j) c[j] += a * x[j];
}

// db[0:N] = sum_r A_r[0:N]
void col_sum(i64 M, i64 N, Rows<const float> A, float* db) {
  std::memset(db, 0, sizeof(float) * N);
  for (RowCursor<const float> ra(A, 0); M > 0; --M, ra.next()) axpy(db, ra.p, 1.f, N);
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
// tanh through one expf (libm's tanhf is several times slower); |error| ~ 1e-7
inline float tanh_f(float x) {
  const float e = std::exp(-2.f * std::fabs(x));
  const float t = (1.f - e) / (1.f + e);
  return x < 0.f ? -t : t;
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
  const auto xr = batch_first(x, B, T, I, 0);
  mm_nt(T * B, 2 * H, I, xr, w_ih, I, dense(saved, S), bi, bh, false);
  mm_nt(T * B, H, I, xr, w_ih + 2 * H * I, I, dense(saved + 2 * H, S), bi ? bi + 2 * H : nullptr, nullptr, false);

  for (i64 t = 0; t < T; ++t) {
    float* st = saved + t * B * S;
    // h_{t-1}: y[:, t-1, :] or h0 (absent = zeros)
    const bool has_prev = t > 0 || h0;
    const auto hp = t > 0 ? batch_first<const float>(y, B, T, H, t - 1) : dense(h0, H);
    if (has_prev) {
      mm_nt(B, 2 * H, H, hp, w_hh, H, dense(st, S), nullptr, nullptr, true);
      mm_nt(B, H, H, hp, w_hh + 2 * H * H, H, dense(st + 3 * H, S), bh ? bh + 2 * H : nullptr, nullptr, false);
    } else {
      for (i64 b = 0; b < B; ++b)
        for (i64 j = 0; j < H; ++j) st[b * S + 3 * H + j] = bh ? bh[2 * H + j] : 0.f;
    }

    for (i64 b = 0; b < B; ++b) {
      float* s = st + b * S;
      const float* h = t > 0 ? y + (b * T + t - 1) * H : (h0 ? h0 + b * H : nullptr);
      float* out = y + (b * T + t) * H;
      for (i64 j = 0; j < H; ++j) {
        const float r = sigmoid(s[j]);
        const float z = sigmoid(s[H + j]);
        const float n = tanh_f(s[2 * H + j] + r * s[3 * H + j]);
        s[j] = r;
        s[H + j] = z;
        s[2 * H + j] = n;
        const float hv = h ? h[j] : 0.f;
        out[j] = n + z * (hv - n);
      }
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
    if (t > 0 || dh0) {
      // dh_{t-1} += dG_t[:, 0:2H] W_hh[0:2H] + dG_t[:, 3H:4H] W_hh[2H:3H]
      mm_nn(B, H, 2 * H, dense<const float>(dgt, S), w_hh, H, dense(dh, H), true);
      mm_nn(B, H, H, dense<const float>(dgt + 3 * H, S), w_hh + 2 * H * H, H, dense(dh, H), true);
    }
  }
  if (dh0) std::memcpy(dh0, dh, sizeof(float) * B * H);

  // ---- large products over all T*B rows ----
  const i64 TB = T * B;
  const auto dGi = dense<const float>(dG, S);            // input-projection grads: cols 0:3H
  const auto dGh_n = dense<const float>(dG + 3 * H, S);  // hidden n-part: cols 3H:4H
  if (dx) mm_nn(TB, I, 3 * H, dGi, w_ih, I, batch_first(dx, B, T, I, 0), false);
  if (dw_ih) mm_tn(3 * H, k_ih, TB, dGi, batch_first(x, B, T, I, 0), dw_ih, k_ih, false);
  if (dw_hh) {
    // h_{t-1} = y[:, t-1, :] for t >= 1, h0 (absent = zeros) for t = 0
    const auto hprev = batch_first(y, B, T, H, 0);
    const i64 M1 = (T - 1) * B;
    mm_tn(2 * H, k_hh, M1, dense<const float>(dG + B * S, S), hprev, dw_hh, k_hh, false);
    mm_tn(H, k_hh, M1, dense<const float>(dG + B * S + 3 * H, S), hprev, dw_hh + 2 * H * k_hh, k_hh, false);
    if (h0) {
      mm_tn(2 * H, k_hh, B, dGi, dense(h0, H), dw_hh, k_hh, true);
      mm_tn(H, k_hh, B, dGh_n, dense(h0, H), dw_hh + 2 * H * k_hh, k_hh, true);
    }
  }
  if (db_ih) col_sum(TB, 3 * H, dGi, db_ih);
  if (db_hh) {
    col_sum(TB, 2 * H, dGi, db_hh);
    col_sum(TB, H, dGh_n, db_hh + 2 * H);
  }
}

}  // namespace pk
