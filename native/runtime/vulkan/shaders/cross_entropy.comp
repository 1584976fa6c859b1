// cross_entropy.comp — F.cross_entropy (mean over rows whose target is not
// ignore_index, label smoothing), forward and backward side by side, as
// kernels/loss.cpp.  Forward: one workgroup, rows strided over its 64
// invocations, partial sums added in invocation order.  Backward: one
// invocation per row: dlogits = dloss/cnt * (softmax - (1-ls) onehot - ls/C).
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode (0 fwd, 1 bwd), 1 logits0, 2 target0 (int64), 3 out0 (loss | dlogits), 4 N, 5 C,
//    6 ignore_index, 7 label_smoothing, 8 dloss0, 9 error word (NONE: none)
// A target that is neither ignore_index nor in [0, C) (any of its 64 bits) is never read
// with: its row counts as ignored and its position goes to the error word (flag_index);
// the step fails.
shared float s_nll[64];
shared float s_smo[64];
shared uint s_cnt[64];

// Whether row r's target is a class (not ignore_index, in range); flags it when it is neither.
bool valid_row(int r, int C) {
  uint w = pc.p[2] + 2 * r;
  if (i64_is(w, pi(6))) return false;
  if (i64_below(w, uint(C))) return true;
  flag_index(pc.p[9], uint(r));
  return false;
}

float row_lse(uint row, int C) {
  float m = -1.0 / 0.0;
  for (int c = 0; c < C; ++c) m = max(m, ldf(row + c));
  vec2 s = vec2(0.0);  // compensated: the CPU kernel sums these in double
  for (int c = 0; c < C; ++c) kadd(s, pexp(ldf(row + c) - m));
  return m + log(kval(s));
}

void main() {
  int N = pi(4), C = pi(5);
  float ls = pf(7);
  if (pc.p[0] == 0u) {
    uint tid = gl_LocalInvocationID.x;
    float nll = 0.0, smo = 0.0;
    uint cnt = 0;
    for (int i = int(tid); i < N; i += 64) {
      if (!valid_row(i, C)) continue;
      int t = i64lo(pc.p[2] + 2 * i);
      uint row = pc.p[1] + i * C;
      float lse = row_lse(row, C);
      nll += lse - ldf(row + t);
      if (ls != 0.0) {
        vec2 sr = vec2(0.0);
        for (int c = 0; c < C; ++c) kadd(sr, ldf(row + c));
        smo += C * lse - kval(sr);
      }
      ++cnt;
    }
    s_nll[tid] = nll;
    s_smo[tid] = smo;
    s_cnt[tid] = cnt;
    barrier();
    if (tid == 0u) {
      float a = 0.0, b = 0.0;
      uint k = 0;
      for (int j = 0; j < 64; ++j) { a += s_nll[j]; b += s_smo[j]; k += s_cnt[j]; }
      stf(pc.p[3], k == 0u ? 0.0 : ((1.0 - ls) * a + ls / C * b) / float(k));
    }
    return;
  }
  int i = int(flat_id());
  if (i >= N) return;
  uint cnt = 0;
  for (int r = 0; r < N; ++r) cnt += valid_row(r, C) ? 1u : 0u;
  uint d = pc.p[3] + i * C, row = pc.p[1] + i * C;
  int t = i64lo(pc.p[2] + 2 * i);
  if (cnt == 0u || !valid_row(i, C)) {
    for (int c = 0; c < C; ++c) stf(d + c, 0.0);
    return;
  }
  float g = ldf(pc.p[8]) / float(cnt);
  float off = g * ls / float(C), on = g * (1.0 - ls);
  float lse = row_lse(row, C);
  for (int c = 0; c < C; ++c) stf(d + c, g * pexp(ldf(row + c) - lse) - off);
  stf(d + t, ldf(d + t) - (on));
}
