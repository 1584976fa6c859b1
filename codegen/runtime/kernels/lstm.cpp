// lstm.cpp — one layer, one direction, batch-first LSTM with PyTorch nn.LSTM
// semantics (gate order i, f, g, o; optional proj_size).
//
//   G_t = x_t W_ih^T + b_ih + b_hh + h_{t-1} W_hh^T        (pre-activations)
//   i, f, o = σ(G_t[i,f,o]);  g = tanh(G_t[g])
//   c_t = f*c_{t-1} + i*g;    r_t = o*tanh(c_t)
//   h_t = r_t W_hr^T (proj) or r_t
//
// Forward: the input projection of all timesteps is one product straight into
// `gates`; each step then adds the recurrent product and activates in place.
// h_{t-1} is read back from y (batch-first), c_{t-1} from `cells`.
//
// Backward (full BPTT): one reverse sweep produces the pre-activation gradients
// dG[T,B,4H] (and, with a projection, dH[T,B,P] = dL/dh_t) in scratch; the
// input and weight gradients are then a few large products over all T*B rows.
//
// Scratch layout (lstm_bwd_scratch_floats):
//   dG[T*B*4H] | dc[B*H] | proj: dH[T*B*P] dr[B*H]  /  no proj: dh[B*P]
#include <cmath>
#include <cstring>

#include "pock_kernels.h"

namespace pk {
namespace {

// ---- small matrix-product helpers (file-local; no dependence on pk::gemm) ----
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

  // Input projection of every timestep: gates[t,b,:] = x[b,t,:] W_ih^T + b_ih + b_hh.
  mm_nt(T * B, G, I, batch_first(x, B, T, I, 0), w_ih, I, dense(gates, G), bi, bh, false);

  for (i64 t = 0; t < T; ++t) {
    float* gt = gates + t * B * G;
    float* ct = cells + t * B * H;
    // h_{t-1}: y[:, t-1, :] or h0 (absent = zeros, nothing to add)
    if (t > 0)
      mm_nt(B, G, P, batch_first<const float>(y, B, T, P, t - 1), w_hh, P, dense(gt, G), nullptr, nullptr, true);
    else if (h0)
      mm_nt(B, G, P, dense(h0, P), w_hh, P, dense(gt, G), nullptr, nullptr, true);

    for (i64 b = 0; b < B; ++b) {
      float* g = gt + b * G;
      float* c = ct + b * H;
      const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
      float* out = proj ? hraw + (t * B + b) * H : y + (b * T + t) * P;
      for (i64 j = 0; j < H; ++j) {
        const float ig = sigmoid(g[j]);
        const float fg = sigmoid(g[H + j]);
        const float gg = tanh_f(g[2 * H + j]);
        const float og = sigmoid(g[3 * H + j]);
        g[j] = ig;
        g[H + j] = fg;
        g[2 * H + j] = gg;
        g[3 * H + j] = og;
        const float cv = (cp ? fg * cp[j] : 0.f) + ig * gg;
        c[j] = cv;
        out[j] = og * tanh_f(cv);
      }
    }
    // h_t = r_t W_hr^T
    if (proj)
      mm_nt(B, P, H, dense<const float>(hraw + t * B * H, H), w_hr, H, batch_first(y, B, T, P, t), nullptr, nullptr,
            false);
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

  for (i64 t = T - 1; t >= 0; --t) {
    // dh_t = dy[:, t, :] + (recurrent part already in dh)
    float* dh = proj ? dH + t * B * P : dH;
    for (i64 b = 0; b < B; ++b) axpy(dh + b * P, dy + (b * T + t) * P, 1.f, P);
    const float* drt = dh;  // dL/dr_t
    if (proj) {
      mm_nn(B, H, P, dense<const float>(dh, P), w_hr, H, dense(dr, H), false);
      drt = dr;
    }

    const float* gt = gates + t * B * G;
    float* dgt = dG + t * B * G;
    for (i64 b = 0; b < B; ++b) {
      const float* g = gt + b * G;
      const float* c = cells + (t * B + b) * H;
      const float* cp = t > 0 ? cells + ((t - 1) * B + b) * H : (c0 ? c0 + b * H : nullptr);
      const float* dr_b = drt + b * H;
      float* dg = dgt + b * G;
      float* dcb = dc + b * H;
      for (i64 j = 0; j < H; ++j) {
        const float ig = g[j], fg = g[H + j], gg = g[2 * H + j], og = g[3 * H + j];
        const float tc = tanh_f(c[j]);
        const float dcv = dcb[j] + dr_b[j] * og * (1.f - tc * tc);
        const float cpv = cp ? cp[j] : 0.f;
        dg[j] = dcv * gg * ig * (1.f - ig);
        dg[H + j] = dcv * cpv * fg * (1.f - fg);
        dg[2 * H + j] = dcv * ig * (1.f - gg * gg);
        dg[3 * H + j] = dr_b[j] * tc * og * (1.f - og);
        dcb[j] = dcv * fg;
      }
    }

    // recurrent part of dh_{t-1} = dG_t W_hh  (at t == 0: dh0)
    float* dst = t > 0 ? (proj ? dH + (t - 1) * B * P : dH) : dh0;
    if (dst) mm_nn(B, P, G, dense<const float>(dgt, G), w_hh, P, dense(dst, P), false);
  }
  if (dc0) std::memcpy(dc0, dc, sizeof(float) * B * H);

  // ---- large products over all T*B rows ----
  const i64 TB = T * B;
  const auto dGr = dense<const float>(dG, G);
  if (dx) mm_nn(TB, I, G, dGr, w_ih, I, batch_first(dx, B, T, I, 0), false);
  if (dw_ih) mm_tn(G, k_ih, TB, dGr, batch_first(x, B, T, I, 0), dw_ih, k_ih, false);
  if (dw_hh) {
    // h_{t-1} = y[:, t-1, :] for t >= 1, h0 (absent = zeros) for t = 0
    mm_tn(G, k_hh, (T - 1) * B, dense<const float>(dG + B * G, G), batch_first(y, B, T, P, 0), dw_hh, k_hh, false);
    if (h0) mm_tn(G, k_hh, B, dGr, dense(h0, P), dw_hh, k_hh, true);
  }
  if (db_ih || db_hh) {
    float* db = db_ih ? db_ih : db_hh;
    col_sum(TB, G, dGr, db);
    if (db_ih && db_hh) std::memcpy(db_hh, db_ih, sizeof(float) * G);
  }
  if (dw_hr) mm_tn(P, k_hr, TB, dense<const float>(dH, P), dense(hraw, H), dw_hr, k_hr, false);
}

}  // namespace pk
