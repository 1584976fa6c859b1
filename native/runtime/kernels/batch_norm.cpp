// batch_norm.cpp — batch normalisation over x[N, C, S] (S = product of the
// spatial dims), per channel c: train mode (batch statistics, running-stat
// update) and eval mode (running statistics), forward and backward.
// Channel statistics and gradient sums are accumulated in two vectors of float
// lanes (simd.h: AVX-512, AVX2+FMA, NEON), moved into double after at most 512
// elements of the channel (Lanes below); the elementwise passes run over the
// same vectors.  The forward writes y = (x - mean) * scale + shift, centered:
// no cancellation when a channel's mean is large against its spread.  Every
// kernel is parallel over channels (pk::parallel_for).  The *_act forward
// variants apply relu / relu6 as y is written, and batch_norm_train_bwd_act takes
// the gradient back through that activation as it reads dy.
#include <cmath>
#include <cstdint>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"

namespace pk {
namespace {

using namespace simd;

// Channels per parallel chunk: at least ~32K elements of work.
inline i64 channel_grain(i64 N, i64 S) {
  const i64 per = N * S < 1 ? 1 : N * S;
  return per >= (1 << 15) ? 1 : ((1 << 15) + per - 1) / per;
}

// Channel sums run over two vectors of float lanes (2 * kW partial sums: two
// independent add chains), moved into double after every kFlush elements of the
// channel at most (after each row of a large plane; every few rows of a small one,
// so a 4x4 plane does not pay a horizontal sum per row); the scalar row tails go
// into the double directly.
constexpr i64 kFlush = 512;

struct Lanes {
  V a0 = vzero(), a1 = vzero();
  double t = 0.0;
  void flush() {
    t += static_cast<double>(vsum(a0)) + static_cast<double>(vsum(a1));
    a0 = a1 = vzero();
  }
};

// Rows of a channel between flushes.
inline i64 flush_rows(i64 S) { return S >= kFlush ? 1 : kFlush / (S > 0 ? S : 1); }

// Calls row(n) for n in [0, N), flushing the accumulators every flush_rows(S) rows and at the end.
template <class F, class... L>
inline void over_rows(i64 N, i64 S, F&& row, L&... acc) {
  const i64 every = flush_rows(S);
  for (i64 n = 0; n < N; ++n) {
    row(n);
    if ((n + 1) % every == 0 || n + 1 == N) (acc.flush(), ...);
  }
}

// L += sum of p[0:n)
inline void row_sum(const float* __restrict p, i64 n, Lanes& L) {
  i64 i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    L.a0 = vadd(L.a0, vload(p + i));
    L.a1 = vadd(L.a1, vload(p + i + kW));
  }
  if (i + kW <= n) {
    L.a0 = vadd(L.a0, vload(p + i));
    i += kW;
  }
  for (; i < n; ++i) L.t += p[i];
}

// D += sum of d = p - m, Q += sum of d^2, over p[0:n)
inline void row_dev_sums(const float* __restrict p, i64 n, float m, Lanes& D, Lanes& Q) {
  const V vm = vbcast(m);
  i64 i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const V d0 = vsub(vload(p + i), vm), d1 = vsub(vload(p + i + kW), vm);
    D.a0 = vadd(D.a0, d0);
    D.a1 = vadd(D.a1, d1);
    Q.a0 = vfma(d0, d0, Q.a0);
    Q.a1 = vfma(d1, d1, Q.a1);
  }
  if (i + kW <= n) {
    const V d0 = vsub(vload(p + i), vm);
    D.a0 = vadd(D.a0, d0);
    Q.a0 = vfma(d0, d0, Q.a0);
    i += kW;
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - m;
    D.t += d;
    Q.t += d * d;
  }
}

// The gradient reaching the batch norm's output: dy itself, or dy through the relu / relu6
// fused into the forward (mask of its output y: y > 0, or 0 < y < 6; NaN y gives 0), the
// same selects relu_bwd / hardtanh_bwd make, so the fused backward gives their bits.
template <Act A>
struct OutGrad {
  const float* __restrict dy;
  const float* __restrict y;  // the activation's output (A != None)
  V at(i64 i) const {
    const V g = vload(dy + i);
    if (A == Act::None) return g;
    const V v = vload(y + i);
    if (A == Act::Relu) return vsel(vgt(v, vzero()), g, vzero());
    return vsel(vgt(v, vzero()), vsel(vlt(v, vbcast(6.0f)), g, vzero()), vzero());
  }
  float one(i64 i) const {
    if (A == Act::None) return dy[i];
    const float v = y[i];
    return v > 0.0f && (A == Act::Relu || v < 6.0f) ? dy[i] : 0.0f;
  }
  OutGrad row(i64 off) const { return {dy + off, A == Act::None ? nullptr : y + off}; }
};

// G += sum of g, Q += sum of g * (x - m), over [0:n) (g: the OutGrad)
template <Act A>
inline void row_dy_sums(const OutGrad<A>& dy, const float* __restrict x, i64 n, float m, Lanes& G, Lanes& Q) {
  const V vm = vbcast(m);
  i64 i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const V g0 = dy.at(i), g1 = dy.at(i + kW);
    G.a0 = vadd(G.a0, g0);
    G.a1 = vadd(G.a1, g1);
    Q.a0 = vfma(g0, vsub(vload(x + i), vm), Q.a0);
    Q.a1 = vfma(g1, vsub(vload(x + i + kW), vm), Q.a1);
  }
  if (i + kW <= n) {
    const V g0 = dy.at(i);
    G.a0 = vadd(G.a0, g0);
    Q.a0 = vfma(g0, vsub(vload(x + i), vm), Q.a0);
    i += kW;
  }
  for (; i < n; ++i) {
    const float g = dy.one(i);
    G.t += g;
    Q.t += static_cast<double>(g) * (x[i] - m);
  }
}

template <Act A>
inline V act_v(V v) {
  if (A == Act::None) return v;
  v = vmax(vzero(), v);  // maxps semantics: NaN comes through
  return A == Act::Relu ? v : vmin(vbcast(6.0f), v);
}
template <Act A>
inline float act_s(float v) {
  if (A == Act::None) return v;
  v = v < 0.0f ? 0.0f : v;
  return A == Act::Relu ? v : (v > 6.0f ? 6.0f : v);
}

// y[n, c, :] = act((x - center) * scale + shift), centered so that a channel whose
// mean dwarfs its spread loses nothing to cancellation (x - center is exact for x
// within a factor of two of center).  `stream` (a y of kStreamMin floats or more, far
// past the caches, so read back from memory anyway): AVX2 builds write rows of 1024+
// floats with non-temporal stores, which skip reading y's lines in before writing
// them (a third of the traffic: MobileNetV2's 8x96x64x64 batch norm 2.32 -> 2.03 ms
// CPU, its batch norm + the depthwise conv reading y 4.28 -> 3.69 ms, AVX2, loaded
// 2-core machine).  Same values either way; the AVX-512 build keeps plain stores.
constexpr i64 kStreamMin = i64(1) << 21;
template <Act A>
void channel_affine_t(const float* x, float* y, i64 N, i64 C, i64 S, i64 c, float center, float scale,
                      float shift, bool stream = false) {
  const V vc = vbcast(center), vs = vbcast(scale), vb = vbcast(shift);
  for (i64 n = 0; n < N; ++n) {
    const float* __restrict xp = x + (n * C + c) * S;
    float* __restrict yp = y + (n * C + c) * S;
    i64 s = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
    if (stream && S >= 1024) {
      for (; s < S && (reinterpret_cast<uintptr_t>(yp + s) & 31) != 0; ++s)
        yp[s] = act_s<A>((xp[s] - center) * scale + shift);
      for (; s + kW <= S; s += kW) _mm256_stream_ps(yp + s, act_v<A>(vfma(vsub(vload(xp + s), vc), vs, vb)).v);
      _mm_sfence();  // the streamed row is visible before the kernel returns (ordered with plain stores)
    }
#endif
    for (; s + kW <= S; s += kW) vstore(yp + s, act_v<A>(vfma(vsub(vload(xp + s), vc), vs, vb)));
    for (; s < S; ++s) yp[s] = act_s<A>((xp[s] - center) * scale + shift);
  }
}

void channel_affine(const float* x, float* y, i64 N, i64 C, i64 S, i64 c, float center, float scale, float shift,
                    Act act) {
  switch (act) {
    case Act::None:
      return channel_affine_t<Act::None>(x, y, N, C, S, c, center, scale, shift, N * C * S >= kStreamMin);
    case Act::Relu:
      return channel_affine_t<Act::Relu>(x, y, N, C, S, c, center, scale, shift, N * C * S >= kStreamMin);
    case Act::Relu6:
      return channel_affine_t<Act::Relu6>(x, y, N, C, S, c, center, scale, shift, N * C * S >= kStreamMin);
  }
}

void train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv, float* y,
               float* save_mean, float* save_invstd, float* new_rm, float* new_rv, i64 N, i64 C, i64 S,
               float momentum, float eps, Act act) {
  const i64 count = N * S;
  parallel_for(C, channel_grain(N, S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      // One pass over the channel: a pivot m near the mean (the mean of the channel's
      // first row, image 0's plane), then the deviations d = x - m (exact near m), whose
      // mean corrects m and whose squares give the variance: sum (x - mu)^2 = sum d^2 -
      // count * (mu - m)^2.  The pivot is within the channel's spread of its mean ((m - mu)^2
      // <= N * var), so the correction cancels little; a first pass over the whole
      // channel for m (as before) read x once more for nothing (MobileNetV2's 8x96x64x64
      // batch norm: see the commit).
      Lanes T;
      if (N > 0) over_rows(1, S, [&](i64) { row_sum(x + c * S, S, T); }, T);
      const float m = static_cast<float>(S > 0 && N > 0 ? T.t / static_cast<double>(S) : 0.0);
      Lanes D, Q;
      over_rows(N, S, [&](i64 n) { row_dev_sums(x + (n * C + c) * S, S, m, D, Q); }, D, Q);
      const double sd = D.t;
      double sq = Q.t;
      const double dm = count > 0 ? sd / static_cast<double>(count) : 0.0;
      const double mu = static_cast<double>(m) + dm;
      sq -= static_cast<double>(count) * dm * dm;
      if (sq < 0.0) sq = 0.0;
      const double var = count > 0 ? sq / static_cast<double>(count) : 0.0;
      const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
      if (save_mean != nullptr) save_mean[c] = static_cast<float>(mu);
      if (save_invstd != nullptr) save_invstd[c] = static_cast<float>(invstd);
      if (rm != nullptr && new_rm != nullptr)
        new_rm[c] = static_cast<float>((1.0 - momentum) * rm[c] + static_cast<double>(momentum) * mu);
      if (rv != nullptr && new_rv != nullptr) {
        // PyTorch rejects a single value per channel in training; use the biased var then.
        const double unbiased = count > 1 ? sq / static_cast<double>(count - 1) : var;
        new_rv[c] = static_cast<float>((1.0 - momentum) * rv[c] + static_cast<double>(momentum) * unbiased);
      }
      // y = (x - m) * scale + (b - (mu - m) * scale): the centered form, the correction
      // of the first-pass mean m folded into the (small) shift
      const double scale = invstd * (w != nullptr ? w[c] : 1.0f);
      const double shift = (b != nullptr ? b[c] : 0.0f) - dm * scale;
      channel_affine(x, y, N, C, S, c, m, static_cast<float>(scale), static_cast<float>(shift), act);
    }
  });
}

void eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv, float* y, i64 N,
              i64 C, i64 S, float eps, Act act) {
  parallel_for(C, channel_grain(N, S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float invstd = 1.0f / std::sqrt(rv[c] + eps);
      const float scale = invstd * (w != nullptr ? w[c] : 1.0f);
      channel_affine(x, y, N, C, S, c, rm[c], scale, b != nullptr ? b[c] : 0.0f, act);
    }
  });
}

// The train backward over the output gradient dy (see batch_norm_train_bwd and _act).
template <Act A>
void train_bwd(const OutGrad<A>& dy, const float* x, const float* save_mean, const float* save_invstd,
               const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S) {
  const i64 count = N * S;
  parallel_for(C, channel_grain(N, 2 * S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float mu = save_mean[c], invstd = save_invstd[c];
      Lanes G, Q;
      over_rows(N, S, [&](i64 n) { row_dy_sums(dy.row((n * C + c) * S), x + (n * C + c) * S, S, mu, G, Q); }, G,
                Q);
      const double sum_dy = G.t, sum_dy_xmu = Q.t;
      const double sum_dy_xhat = sum_dy_xmu * invstd;
      if (dw != nullptr) dw[c] = static_cast<float>(sum_dy_xhat);
      if (db != nullptr) db[c] = static_cast<float>(sum_dy);
      if (dx == nullptr || count == 0) continue;
      const float wc = w != nullptr ? w[c] : 1.0f;
      const float mean_dy = static_cast<float>(sum_dy / static_cast<double>(count));
      // xhat * sum(dy*xhat)/cnt = (x - mean) * k with k = invstd^2 * sum(dy*(x-mean))/cnt
      const float k = static_cast<float>(sum_dy_xmu / static_cast<double>(count) * invstd * invstd);
      const float gain = wc * invstd;
      const V vmu = vbcast(mu), vk = vbcast(k), vmdy = vbcast(mean_dy), vgain = vbcast(gain);
      for (i64 n = 0; n < N; ++n) {
        const OutGrad<A> g = dy.row((n * C + c) * S);
        const float* __restrict xp = x + (n * C + c) * S;
        float* __restrict dxp = dx + (n * C + c) * S;
        i64 s = 0;
        for (; s + kW <= S; s += kW)  // ((dy - mean_dy) + (mu - x) * k) * gain
          vstore(dxp + s, vmul(vfma(vsub(vmu, vload(xp + s)), vk, vsub(g.at(s), vmdy)), vgain));
        for (; s < S; ++s) dxp[s] = (g.one(s) - mean_dy - (xp[s] - mu) * k) * gain;
      }
    }
  });
}

}  // namespace

// Train forward: mean / biased var over (N, S) per channel,
//   y = (x - mean) * invstd * w + b,  invstd = 1/sqrt(var + eps);
// saves save_mean/save_invstd and writes the updated running statistics
//   new_rm = (1-m)*rm + m*mean,  new_rv = (1-m)*rv + m*var*cnt/(cnt-1).
// w, b nullable; new_rm/new_rv may alias rm/rv.  Running statistics are
// skipped when rm/rv or new_rm/new_rv are null (no tracked statistics).
void batch_norm_train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                          float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                          i64 N, i64 C, i64 S, float momentum, float eps) {
  train_fwd(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps, Act::None);
}

// y = act(batch_norm(x)); everything else as batch_norm_train_fwd.
void batch_norm_train_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                              float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                              i64 N, i64 C, i64 S, float momentum, float eps, Act act) {
  train_fwd(x, w, b, rm, rv, y, save_mean, save_invstd, new_rm, new_rv, N, C, S, momentum, eps, act);
}

// Train backward, with xhat = (x - mean) * invstd and cnt = N*S per channel:
//   dx = w * invstd * (dy - sum(dy)/cnt - xhat * sum(dy*xhat)/cnt)
//   dw = sum(dy * xhat),  db = sum(dy).
// w nullable (= 1); dx, dw, db nullable (not wanted).
void batch_norm_train_bwd(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S) {
  train_bwd(OutGrad<Act::None>{dy, nullptr}, x, save_mean, save_invstd, w, dx, dw, db, N, C, S);
}

// The backward of y = act(batch_norm(x)) (the _act forward): batch_norm_train_bwd of
// dy masked by act's derivative at y (y > 0 for relu, 0 < y < 6 for relu6) as dy is read,
// so the masked gradient is never stored: the bits of relu_bwd / hardtanh_bwd followed by
// batch_norm_train_bwd.
void batch_norm_train_bwd_act(const float* dy, const float* y, const float* x, const float* save_mean,
                              const float* save_invstd, const float* w, float* dx, float* dw, float* db, i64 N,
                              i64 C, i64 S, Act act) {
  switch (act) {
    case Act::None:
      return train_bwd(OutGrad<Act::None>{dy, nullptr}, x, save_mean, save_invstd, w, dx, dw, db, N, C, S);
    case Act::Relu:
      return train_bwd(OutGrad<Act::Relu>{dy, y}, x, save_mean, save_invstd, w, dx, dw, db, N, C, S);
    case Act::Relu6:
      return train_bwd(OutGrad<Act::Relu6>{dy, y}, x, save_mean, save_invstd, w, dx, dw, db, N, C, S);
  }
}

// Eval forward: y = (x - rm) * invstd * w + b with invstd = 1/sqrt(rv + eps).
void batch_norm_eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                         float* y, i64 N, i64 C, i64 S, float eps) {
  eval_fwd(x, w, b, rm, rv, y, N, C, S, eps, Act::None);
}

// y = act(eval batch_norm(x)).
void batch_norm_eval_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                             float* y, i64 N, i64 C, i64 S, float eps, Act act) {
  eval_fwd(x, w, b, rm, rv, y, N, C, S, eps, act);
}

// Eval backward (statistics are constants):
//   dx = dy * w * invstd;  dw = sum dy * (x - rm) * invstd;  db = sum dy.
// w nullable (= 1); dx, dw, db nullable.
void batch_norm_eval_bwd(const float* dy, const float* x, const float* rm, const float* rv, const float* w,
                         float* dx, float* dw, float* db, i64 N, i64 C, i64 S, float eps) {
  parallel_for(C, channel_grain(N, 2 * S), [&](i64 c0, i64 c1) {
    for (i64 c = c0; c < c1; ++c) {
      const float invstd = 1.0f / std::sqrt(rv[c] + eps);
      if (dx != nullptr) {
        const float gain = invstd * (w != nullptr ? w[c] : 1.0f);
        for (i64 n = 0; n < N; ++n) {
          const float* __restrict dyp = dy + (n * C + c) * S;
          float* __restrict dxp = dx + (n * C + c) * S;
          i64 s = 0;
          for (; s + kW <= S; s += kW) vstore(dxp + s, vmul(vload(dyp + s), vbcast(gain)));
          for (; s < S; ++s) dxp[s] = dyp[s] * gain;
        }
      }
      if (dw != nullptr || db != nullptr) {
        Lanes G, Q;
        const OutGrad<Act::None> g{dy, nullptr};
        over_rows(N, S, [&](i64 n) { row_dy_sums(g.row((n * C + c) * S), x + (n * C + c) * S, S, rm[c], G, Q); }, G,
                  Q);
        const double sum_dy = G.t, sum_dy_xmu = Q.t;
        if (dw != nullptr) dw[c] = static_cast<float>(sum_dy_xmu * invstd);
        if (db != nullptr) db[c] = static_cast<float>(sum_dy);
      }
    }
  });
}

}  // namespace pk
