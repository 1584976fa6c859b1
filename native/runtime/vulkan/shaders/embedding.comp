// embedding.comp — table lookup and its weight gradient, side by side (kernels/embedding.cpp):
//   mode 0 forward  (an element per invocation): y[i, d] = w[idx[i], d]
//   mode 1 backward (an element of dw per invocation): dw[v, j] = sum over i with idx[i] == v
//                   (in index order; rows equal to padding_idx get nothing) of dy[i, j], j < k,
//                   summed onto base[v, j] when there is one (p[12]; may be dw itself)
// The backward is a gather, not a scatter-add: no atomics, the same order as the CPU.
// An index outside [0, V) (any of its 64 bits) is never read with: the forward writes a
// zero row and records the position in the error word p[11] (flag_index); the step fails.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 w0, 2 idx0 (int64), 3 y0, 4 n, 5 V, 6 D, 7 k, 8 padding_idx, 9 dy0, 10 dw0,
//    11 error word (NONE: none), 12 base0 (NONE: none)
void main() {
  uint e = flat_id(), n = pc.p[4], V = pc.p[5], D = pc.p[6], k = pc.p[7];
  if (pc.p[0] == 0u) {
    if (e >= n * D) return;
    uint i = e / D, d = e % D;
    if (!i64_below(pc.p[2] + 2 * i, V)) {
      stf(pc.p[3] + e, 0.0);
      if (d == 0u) flag_index(pc.p[11], i);
      return;
    }
    stf(pc.p[3] + e, ldf(pc.p[1] + uint(i64lo(pc.p[2] + 2 * i)) * D + d));
    return;
  }
  if (e >= V * k) return;
  int v = int(e / k);
  uint j = e % k;
  float acc = pc.p[12] == NONE ? 0.0 : ldf(pc.p[12] + e);
  if (v != pi(8))
    for (uint i = 0; i < n; ++i)
      if (i64_is(pc.p[2] + 2 * i, v)) acc += ldf(pc.p[9] + i * D + j);
  stf(pc.p[10] + e, acc);
}
