// conv2d_plane3x3.cpp — the 3x3 (dilation 1, stride 1 or 2) single-plane
// kernels behind conv2d.cpp's depthwise path (groups == C == O) and its
// few-channels-per-group 3x3 path: forward, input gradient and weight gradient
// of one image plane, each in a row form (vectorised interior columns, scalar
// edges) and a "flat" form on a zero-padded stack copy for planes that fit.
// The stride-2 forward works on input rows split into their two column phases,
// the stride-2 input gradient gathers the two phases and stores them
// interleaved.  No kernel allocates; the vector code uses conv_common.h's V.
#include "conv_common.h"

namespace pk {
namespace conv {
namespace {

// ---- 3x3 (dilation 1, stride 1 or 2) single-plane kernels
//
// Rows are processed with the native vector width over the output columns
// whose every tap is inside the input; the few edge columns are scalar.  A
// tail shorter than a vector is computed as the last full vector of the
// interior (overlapping), keeping only its new lanes.

// The output columns whose three taps ow*S - pw + {0,1,2} all lie in [0, W).
inline Range interior_cols(i64 S, i64 pw, i64 W, i64 OW) {
  const Range a = valid_range(-pw, S, W, OW), b = valid_range(2 - pw, S, W, OW);
  Range r{a.lo > b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// y (OH x OW) = init + stride-1 conv3x3(x, w9) (init = bias, or y itself when acc), then act
// (stride 2: split3_fwd_s2 below).
void plane3_fwd(const float* __restrict x, const float* w9, float* __restrict y, const Plane& g, float bias,
                bool acc, Act act) {
  const Range ir = interior_cols(1, g.pw, g.W, g.OW);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    const float* rows[3];
    const float* wr[3];
    int nr = 0;
    for (int kh = 0; kh < 3; ++kh) {
      const i64 ih = oh - g.ph + kh;
      if (ih >= 0 && ih < g.H) {
        rows[nr] = x + ih * g.W;
        wr[nr] = w9 + 3 * kh;
        ++nr;
      }
    }
    float* yr = y + oh * g.OW;
    auto scalar_at = [&](i64 ow) {
      float s = 0.0f;
      for (int r = 0; r < nr; ++r)
        for (int kw = 0; kw < 3; ++kw) {
          const i64 iw = ow - g.pw + kw;
          if (iw >= 0 && iw < g.W) s += wr[r][kw] * rows[r][iw];
        }
      yr[ow] = act1((acc ? yr[ow] : bias) + s, act);
    };
    for (i64 ow = 0; ow < ir.lo; ++ow) scalar_at(ow);
    for (i64 ow = ir.hi; ow < g.OW; ++ow) scalar_at(ow);
    if (ir.hi - ir.lo < kW) {
      for (i64 ow = ir.lo; ow < ir.hi; ++ow) scalar_at(ow);
      continue;
    }
    V wv[3][3];
    for (int r = 0; r < nr; ++r)
      for (int kw = 0; kw < 3; ++kw) wv[r][kw] = vbcast(wr[r][kw]);
    auto block = [&](i64 ow) {
      V s = vbcast(0.0f);
      for (int r = 0; r < nr; ++r) {
        const float* q = rows[r] + ow - g.pw;
        s = vfma(wv[r][0], vload(q), s);
        s = vfma(wv[r][1], vload(q + 1), s);
        s = vfma(wv[r][2], vload(q + 2), s);
      }
      return s;
    };
    const V vb = vbcast(bias);
    i64 ow = ir.lo;
    for (; ow + kW <= ir.hi; ow += kW) {
      const V s = block(ow);
      vstore(yr + ow, actv(vadd(acc ? vload(yr + ow) : vb, s), act));
    }
    if (ow < ir.hi) {  // overlapping last vector, new lanes only
      alignas(64) float t[kW];
      const i64 base = ir.hi - kW;
      vstore(t, block(base));
      for (i64 q = ow; q < ir.hi; ++q) yr[q] = act1((acc ? yr[q] : bias) + t[q - base], act);
    }
  }
}

// dx (H x W) (= or +=) the stride-2 transposed 3x3 convolution of dy (OH x OW):
//   dx[ih, iw] = sum of w[kh, kw] * dy[oh, ow] over ih = 2*oh - ph + kh, iw = 2*ow - pw + kw.
// Per dx row only the taps kh of one parity contribute; along the row, with
// j = (iw + pw) / 2: dx[2j - pw] = w0*dy[j] + w2*dy[j-1], dx[2j - pw + 1] = w1*dy[j].
void plane3_bwd_input_s2(const float* __restrict dy, const float* w9, float* __restrict dx, const Plane& g,
                         bool acc) {
  i64 jlo = (g.pw + 1) / 2;
  if (jlo < 1) jlo = 1;
  i64 jhi = g.W - 2 + g.pw >= 0 ? (g.W - 2 + g.pw) / 2 + 1 : 0;
  if (jhi > g.OW) jhi = g.OW;
  if (jhi < jlo) jhi = jlo;
  const bool vec = jhi - jlo >= kW;
  const i64 iw_lo = vec ? 2 * jlo - g.pw : g.W, iw_hi = vec ? 2 * jhi - g.pw : g.W;
  for (i64 ih = 0; ih < g.H; ++ih) {
    const float* rows[2];
    const float* wr[2];
    int nr = 0;
    for (int kh = 0; kh < 3; ++kh) {
      const i64 t = ih + g.ph - kh;
      if (t >= 0 && t % 2 == 0 && t / 2 < g.OH) {
        rows[nr] = dy + t / 2 * g.OW;
        wr[nr] = w9 + 3 * kh;
        ++nr;
      }
    }
    float* xr = dx + ih * g.W;
    auto scalar_at = [&](i64 iw) {
      float s = 0.0f;
      for (int r = 0; r < nr; ++r)
        for (int kw = 0; kw < 3; ++kw) {
          const i64 u = iw + g.pw - kw;
          if (u >= 0 && u % 2 == 0 && u / 2 < g.OW) s += wr[r][kw] * rows[r][u / 2];
        }
      xr[iw] = acc ? xr[iw] + s : s;
    };
    if (!vec || nr == 0) {
      for (i64 iw = 0; iw < g.W; ++iw) scalar_at(iw);
      continue;
    }
    for (i64 iw = 0; iw < iw_lo; ++iw) scalar_at(iw);
    for (i64 iw = iw_hi; iw < g.W; ++iw) scalar_at(iw);
    V wv[2][3];
    for (int r = 0; r < nr; ++r)
      for (int kw = 0; kw < 3; ++kw) wv[r][kw] = vbcast(wr[r][kw]);
    auto block = [&](i64 j, V& e, V& o) {
      e = vbcast(0.0f);
      o = vbcast(0.0f);
      for (int r = 0; r < nr; ++r) {
        const V d0 = vload(rows[r] + j), d1 = vload(rows[r] + j - 1);
        e = vfma(wv[r][0], d0, e);
        e = vfma(wv[r][2], d1, e);
        o = vfma(wv[r][1], d0, o);
      }
    };
    i64 j = jlo;
    for (; j + kW <= jhi; j += kW) {
      V e, o;
      block(j, e, o);
      float* p = xr + 2 * j - g.pw;
      if (acc) {
        V pe, po;
        vdeint(p, pe, po);
        e = vadd(e, pe);
        o = vadd(o, po);
      }
      vst_int(p, e, o);
    }
    if (j < jhi) {
      alignas(64) float te[kW], to[kW];
      V e, o;
      const i64 base = jhi - kW;
      block(base, e, o);
      vstore(te, e);
      vstore(to, o);
      for (i64 q = j; q < jhi; ++q) {
        float* p = xr + 2 * q - g.pw;
        p[0] = acc ? p[0] + te[q - base] : te[q - base];
        p[1] = acc ? p[1] + to[q - base] : to[q - base];
      }
    }
  }
}

// s9[t] += the lanes of av[t] (double), av = 0.
inline void flush9(V (&av)[3][3], double* s9) {
  for (int kh = 0; kh < 3; ++kh)
    for (int kw = 0; kw < 3; ++kw) {
      s9[kh * 3 + kw] += hsum(av[kh][kw]);
      av[kh][kw] = vbcast(0.0f);
    }
}

// s9[kh*3 + kw] += sum over (oh, ow) of dy[oh, ow] * x[oh*S - ph + kh, ow*S - pw + kw].
template <int S>
void plane3_bwd_weight(const float* __restrict dy, const float* __restrict x, const Plane& g, double* s9) {
  const Range ir = interior_cols(S, g.pw, g.W, g.OW);
  const bool vec = ir.hi - ir.lo >= kW;
  V av[3][3];
  for (int kh = 0; kh < 3; ++kh)
    for (int kw = 0; kw < 3; ++kw) av[kh][kw] = vbcast(0.0f);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    if (oh % 4 == 0 && oh > 0) flush9(av, s9);  // bounded float partial sums
    const float* dr = dy + oh * g.OW;
    const float* rows[3] = {nullptr, nullptr, nullptr};
    for (int kh = 0; kh < 3; ++kh) {
      const i64 ih = oh * S - g.ph + kh;
      if (ih >= 0 && ih < g.H) rows[kh] = x + ih * g.W;
    }
    auto scalar_at = [&](i64 ow) {
      const float d = dr[ow];
      for (int kh = 0; kh < 3; ++kh) {
        if (rows[kh] == nullptr) continue;
        for (int kw = 0; kw < 3; ++kw) {
          const i64 iw = ow * S - g.pw + kw;
          if (iw >= 0 && iw < g.W) s9[kh * 3 + kw] += d * rows[kh][iw];
        }
      }
    };
    if (!vec) {
      for (i64 ow = 0; ow < g.OW; ++ow) scalar_at(ow);
      continue;
    }
    for (i64 ow = 0; ow < ir.lo; ++ow) scalar_at(ow);
    for (i64 ow = ir.hi; ow < g.OW; ++ow) scalar_at(ow);
    auto block = [&](i64 ow, V d) {
      for (int kh = 0; kh < 3; ++kh) {
        if (rows[kh] == nullptr) continue;
        const float* q = rows[kh] + ow * S - g.pw;
        if (S == 1) {
          av[kh][0] = vfma(d, vload(q), av[kh][0]);
          av[kh][1] = vfma(d, vload(q + 1), av[kh][1]);
          av[kh][2] = vfma(d, vload(q + 2), av[kh][2]);
        } else {
          V e, o, o2, e2;
          vdeint(q, e, o);
          vdeint(q + 1, o2, e2);
          av[kh][0] = vfma(d, e, av[kh][0]);
          av[kh][1] = vfma(d, o, av[kh][1]);
          av[kh][2] = vfma(d, e2, av[kh][2]);
        }
      }
    };
    i64 ow = ir.lo;
    for (; ow + kW <= ir.hi; ow += kW) block(ow, vload(dr + ow));
    if (ow < ir.hi) {  // overlapping last vector with the old lanes of dy zeroed
      alignas(64) float t[kW];
      const i64 base = ir.hi - kW;
      for (i64 q = 0; q < kW; ++q) t[q] = base + q >= ow ? dr[base + q] : 0.0f;
      block(base, vload(t));
    }
  }
  flush9(av, s9);
}

// ---- 3x3 plane kernels on a zero-padded copy ("flat" form), for planes that fit
//
// The input plane is copied into a zero-padded stack buffer of row pitch P
// (>= S*(OW-1) + 3): row ih sits at buffer row ih + ph, column iw at iw + pw.
// Output (oh, ow) is flat position q = oh*P + ow, and its tap (kh, kw) reads
// buffer[S*q + kh*P + kw], so every output -- edges included -- is one
// vectorised multiply-add chain over q (the P - OW columns past each row
// are computed and dropped).
constexpr i64 kFlatMax = 10240;  // floats per stack buffer (40 KB)

struct Flat {
  i64 P, nq, in_size;
};
inline Flat flat_of(i64 S, const Plane& g) {
  Flat f;
  f.P = S * (g.OW - 1) + 3;
  if (f.P < g.W + g.pw) f.P = g.W + g.pw;
  f.nq = (g.OH * f.P + kW - 1) / kW * kW;
  const i64 rows = g.H + g.ph > S * (g.OH - 1) + 3 ? g.H + g.ph : S * (g.OH - 1) + 3;
  const i64 reach = S * f.nq + 2 * f.P + 2 * kW + 4;
  f.in_size = rows * f.P + 2 * kW > reach ? rows * f.P + 2 * kW : reach;
  return f;
}
inline bool flat_fits(i64 S, const Plane& g) {
  const Flat f = flat_of(S, g);
  return g.OW > 0 && g.OH > 0 && f.in_size <= kFlatMax && f.nq + kW <= kFlatMax;
}

inline void zero_buf(float* b, i64 n) {
  const V z = vbcast(0.0f);
  i64 i = 0;
  for (; i + kW <= n; i += kW) vstore(b + i, z);
  for (; i < n; ++i) b[i] = 0.0f;
}
inline void copy_row(const float* __restrict s, float* __restrict d, i64 n) {
  i64 i = 0;
  for (; i + kW <= n; i += kW) vstore(d + i, vload(s + i));
  for (; i < n; ++i) d[i] = s[i];
}
// buf = zero-padded plane x (H x W), pitch P, offsets (ph, pw).
void load_padded(const float* x, const Plane& g, const Flat& f, float* buf) {
  zero_buf(buf, f.in_size);
  const i64 cols = g.W < f.P - g.pw ? g.W : f.P - g.pw;
  for (i64 ih = 0; ih < g.H; ++ih) copy_row(x + ih * g.W, buf + (ih + g.ph) * f.P + g.pw, cols);
}

// The 3x3 correlation of buf at flat positions [q, q + kW).
template <int S>
inline V flat_taps(const float* buf, i64 P, i64 q, const V* wv) {
  V s = vbcast(0.0f);
  for (int kh = 0; kh < 3; ++kh) {
    const float* r = buf + S * q + kh * P;
    if (S == 1) {
      s = vfma(wv[3 * kh], vload(r), s);
      s = vfma(wv[3 * kh + 1], vload(r + 1), s);
      s = vfma(wv[3 * kh + 2], vload(r + 2), s);
    } else {
      V e, o, o2, e2;
      vdeint(r, e, o);
      vdeint(r + 1, o2, e2);
      s = vfma(wv[3 * kh], e, s);
      s = vfma(wv[3 * kh + 1], o, s);
      s = vfma(wv[3 * kh + 2], e2, s);
    }
  }
  return s;
}

template <int S>
void flat3_fwd(const float* x, const float* w9, float* y, const Plane& g, float bias, bool acc, Act act) {
  const Flat f = flat_of(S, g);
  alignas(64) float buf[kFlatMax];
  alignas(64) float out[kFlatMax];
  load_padded(x, g, f, buf);
  V wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = vbcast(w9[t]);
  for (i64 q = 0; q < f.nq; q += kW) vstore(out + q, flat_taps<S>(buf, f.P, q, wv));
  const V vb = vbcast(bias);
  for (i64 oh = 0; oh < g.OH; ++oh) {
    const float* s = out + oh * f.P;
    float* d = y + oh * g.OW;
    i64 ow = 0;
    for (; ow + kW <= g.OW; ow += kW) vstore(d + ow, actv(vadd(acc ? vload(d + ow) : vb, vload(s + ow)), act));
    for (; ow < g.OW; ++ow) d[ow] = act1((acc ? d[ow] : bias) + s[ow], act);
  }
}

// s9 += per-tap sums of dy * x (dy copied with pitch P, zero past each row).
template <int S>
void flat3_bwd_weight(const float* dy, const float* x, const Plane& g, double* s9) {
  const Flat f = flat_of(S, g);
  alignas(64) float buf[kFlatMax];
  alignas(64) float d[kFlatMax];
  load_padded(x, g, f, buf);
  zero_buf(d, f.nq);
  for (i64 oh = 0; oh < g.OH; ++oh) copy_row(dy + oh * g.OW, d + oh * f.P, g.OW);
  V av[9];
  for (int t = 0; t < 9; ++t) av[t] = vbcast(0.0f);
  for (i64 q = 0; q < f.nq; q += kW) {
    if (q % (16 * kW) == 0 && q > 0)  // bounded float partial sums
      for (int t = 0; t < 9; ++t) {
        s9[t] += hsum(av[t]);
        av[t] = vbcast(0.0f);
      }
    const V dv = vload(d + q);
    for (int kh = 0; kh < 3; ++kh) {
      const float* r = buf + S * q + kh * f.P;
      if (S == 1) {
        av[3 * kh] = vfma(dv, vload(r), av[3 * kh]);
        av[3 * kh + 1] = vfma(dv, vload(r + 1), av[3 * kh + 1]);
        av[3 * kh + 2] = vfma(dv, vload(r + 2), av[3 * kh + 2]);
      } else {
        V e, o, o2, e2;
        vdeint(r, e, o);
        vdeint(r + 1, o2, e2);
        av[3 * kh] = vfma(dv, e, av[3 * kh]);
        av[3 * kh + 1] = vfma(dv, o, av[3 * kh + 1]);
        av[3 * kh + 2] = vfma(dv, e2, av[3 * kh + 2]);
      }
    }
  }
  for (int t = 0; t < 9; ++t) s9[t] += hsum(av[t]);
}

// Stride-2 input gradient: scatter form on a padded dx buffer (pitch P):
// dxbuf[2q + kh*P + kw] += w[kh, kw] * dy[q], as (even, odd) pairs
// (w0*dy[q] + w2*dy[q-1], w1*dy[q]) at 2q + kh*P.
void flat3_bwd_input_s2(const float* dy, const float* w9, float* dx, const Plane& g, bool acc) {
  const Flat f = flat_of(2, g);
  alignas(64) float dbuf[kFlatMax];  // dy at 1 + q (a zero in front for dy[q-1])
  alignas(64) float xb[kFlatMax];
  zero_buf(dbuf, f.nq + kW + 1);
  for (i64 oh = 0; oh < g.OH; ++oh) copy_row(dy + oh * g.OW, dbuf + 1 + oh * f.P, g.OW);
  zero_buf(xb, f.in_size);
  for (int kh = 0; kh < 3; ++kh) {
    const V w0 = vbcast(w9[3 * kh]), w1 = vbcast(w9[3 * kh + 1]), w2 = vbcast(w9[3 * kh + 2]);
    for (i64 q = 0; q < f.nq; q += kW) {
      const V d0 = vload(dbuf + 1 + q), dm = vload(dbuf + q);
      float* p = xb + 2 * q + kh * f.P;
      V pe, po;
      vdeint(p, pe, po);
      vst_int(p, vfma(w2, dm, vfma(w0, d0, pe)), vfma(w1, d0, po));
    }
  }
  for (i64 ih = 0; ih < g.H; ++ih) {
    const float* s = xb + (ih + g.ph) * f.P + g.pw;
    float* d = dx + ih * g.W;
    i64 iw = 0;
    if (acc) {
      for (; iw + kW <= g.W; iw += kW) vstore(d + iw, vadd(vload(d + iw), vload(s + iw)));
      for (; iw < g.W; ++iw) d[iw] += s[iw];
    } else {
      copy_row(s, d, g.W);
    }
  }
}

// ---- stride 2 on split rows
//
// An input row is split once into its even and odd columns, padding in front:
// e[i] = x[2i - pw], o[i] = x[2i + 1 - pw] (zero outside the row).  Output column
// ow's taps kw = 0, 1, 2 are then e[ow], o[ow], e[ow + 1]: three plain vector loads
// at any ow, edges included, and each input row is split once rather than once for
// every output row it feeds (a row form would deinterleave twice per tap row and
// vector).  Columns go in chunks of kSplitCols, so the split rows are small stack
// buffers.  Measured (AVX2 build, one thread, batch 8, best of 4 alternated runs):
// 96 channels 64x64 -> 32x32 2.18 -> 1.53 ms, 144 channels 32x32 -> 16x16 1.30 ->
// 0.75 ms against the row form; AVX-512 64x64 3.14 -> 1.24 ms.  The weight gradient
// gains nothing from it (memory-bound at batch 8, slower hot): it keeps the row form.
constexpr i64 kSplitCols = 256;
constexpr i64 kSplitLen = kSplitCols + 2 * kW;  // entries per split row (vectors read one past)

// e[i] = x[2(i0 + i) - pw], o[i] = x[2(i0 + i) + 1 - pw] for i in [0, n), zero outside [0, W).
void split_row(const float* __restrict x, i64 W, i64 pw, i64 i0, i64 n, float* __restrict e, float* __restrict o) {
  auto at = [&](i64 c) { return c >= 0 && c < W ? x[c] : 0.0f; };
  i64 i = 0;
  for (; i < n && 2 * (i0 + i) - pw < 0; ++i) e[i] = 0.0f, o[i] = at(2 * (i0 + i) + 1 - pw);
  auto vec_at = [&](i64 j) {
    V ev, ov;
    vdeint(x + 2 * (i0 + j) - pw, ev, ov);
    vstore(e + j, ev);
    vstore(o + j, ov);
  };
  const i64 last = (W + pw - 2 * kW) / 2 - i0;  // the last i whose vector stays inside the row
  const i64 first = i;
  for (; i + kW <= n && i <= last; i += kW) vec_at(i);
  if (i > first && i < n && last > i - kW && last + kW <= n) vec_at(last), i = last + kW;  // overlapping
  for (; i < n; ++i) e[i] = at(2 * (i0 + i) - pw), o[i] = at(2 * (i0 + i) + 1 - pw);
}

// The split input rows of one column chunk in three slots: an output row reads three
// consecutive input rows, in increasing order, so a row not held replaces the oldest.
struct SplitRows {
  alignas(64) float buf[3][2][kSplitLen];
  i64 tag[3] = {-1, -1, -1};
  // e and o of input row ih (split over n entries from phase column i0).
  void get(const float* x, const Plane& g, i64 ih, i64 i0, i64 n, const float*& e, const float*& o) {
    int s = 0;
    while (s < 3 && tag[s] != ih) ++s;
    if (s == 3) {
      s = tag[0] <= tag[1] && tag[0] <= tag[2] ? 0 : (tag[1] <= tag[2] ? 1 : 2);
      split_row(x + ih * g.W, g.W, g.pw, i0, n, buf[s][0], buf[s][1]);
      tag[s] = ih;
    }
    e = buf[s][0], o = buf[s][1];
  }
};

// The split rows e[kh], o[kh] an output row oh reads (a zero row above or below the
// plane: it adds nothing, and a fixed three rows keep every sum in registers).
inline void split_taps(SplitRows& sr, const float* x, const Plane& g, i64 oh, i64 i0, i64 n, const float* (&e)[3],
                       const float* (&o)[3]) {
  alignas(64) static const float zeros[kSplitLen] = {};
  for (int kh = 0; kh < 3; ++kh) {
    const i64 ih = 2 * oh - g.ph + kh;
    if (ih >= 0 && ih < g.H)
      sr.get(x, g, ih, i0, n, e[kh], o[kh]);
    else
      e[kh] = o[kh] = zeros;
  }
}

// y (OH x OW) = init + stride-2 conv3x3(x, w9) (init = bias, or y itself when acc), then act.
void split3_fwd_s2(const float* __restrict x, const float* w9, float* __restrict y, const Plane& g, float bias,
                   bool acc, Act act) {
  V wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = vbcast(w9[t]);
  const V vb = vbcast(bias);
  SplitRows sr;
  for (i64 c0 = 0; c0 < g.OW; c0 += kSplitCols) {
    const i64 cols = g.OW - c0 < kSplitCols ? g.OW - c0 : kSplitCols;
    const i64 n = (cols + kW - 1) / kW * kW + 1;
    sr.tag[0] = sr.tag[1] = sr.tag[2] = -1;
    for (i64 oh = 0; oh < g.OH; ++oh) {
      const float *e[3], *o[3];
      split_taps(sr, x, g, oh, c0, n, e, o);
      float* yr = y + oh * g.OW + c0;
      for (i64 q = 0; q < cols; q += kW) {
        V s = vbcast(0.0f);
        for (int kh = 0; kh < 3; ++kh) {
          s = vfma(wv[3 * kh], vload(e[kh] + q), s);
          s = vfma(wv[3 * kh + 1], vload(o[kh] + q), s);
          s = vfma(wv[3 * kh + 2], vload(e[kh] + q + 1), s);
        }
        const i64 m = cols - q < kW ? cols - q : kW;
        store_part(yr + q, actv(vadd(acc ? load_part(yr + q, m) : vb, s), act), m);
      }
    }
  }
}

// Measured on AVX-512: the flat form wins for every stride-1 plane that fits;
// at stride 2 it computes ~2x the outputs, so rows of two or more vectors
// (OW >= 2*kW) are better served by the row form (the split form for the forward).
#ifndef PK_FLAT_MAX_OW1
#define PK_FLAT_MAX_OW1 (1 << 30)
#endif
#ifndef PK_FLAT_MAX_OW2
#define PK_FLAT_MAX_OW2 (2 * kW - 1)
#endif
// The flat form where the plane fits its stack buffers and is narrow enough
// that the row form's scalar edges / partial vectors would dominate.
inline bool use_flat(i64 S, const Plane& g) {
  return g.OW <= (S == 1 ? PK_FLAT_MAX_OW1 : PK_FLAT_MAX_OW2) && flat_fits(S, g);
}

}  // namespace

void plane3_fwd_any(i64 S, const float* x, const float* w9, float* y, const Plane& g, float bias, bool acc,
                    Act act) {
  if (S == 1)
    use_flat(1, g) ? flat3_fwd<1>(x, w9, y, g, bias, acc, act) : plane3_fwd(x, w9, y, g, bias, acc, act);
  else
    use_flat(2, g) ? flat3_fwd<2>(x, w9, y, g, bias, acc, act) : split3_fwd_s2(x, w9, y, g, bias, acc, act);
}
void plane3_bwd_weight_any(i64 S, const float* dy, const float* x, const Plane& g, double* s9) {
  if (S == 1)
    use_flat(1, g) ? flat3_bwd_weight<1>(dy, x, g, s9) : plane3_bwd_weight<1>(dy, x, g, s9);
  else
    use_flat(2, g) ? flat3_bwd_weight<2>(dy, x, g, s9) : plane3_bwd_weight<2>(dy, x, g, s9);
}

// dx (H x W) (= or +=) the transposed 3x3 convolution of dy, stride S.
void plane3_bwd_input(i64 S, const float* dy, const float* w9, float* dx, const Plane& g, bool acc) {
  if (S == 2) {
    use_flat(2, g) ? flat3_bwd_input_s2(dy, w9, dx, g, acc) : plane3_bwd_input_s2(dy, w9, dx, g, acc);
    return;
  }
  // stride 1: a forward correlation of dy with the flipped kernel, padding 2 - p.
  float wf[9];
  for (int t = 0; t < 9; ++t) wf[t] = w9[8 - t];
  const Plane t{g.OH, g.OW, g.H, g.W, 2 - g.ph, 2 - g.pw};
  plane3_fwd_any(1, dy, wf, dx, t, 0.0f, acc, Act::None);
}

}  // namespace conv
}  // namespace pk
