// reduce.comp — y = scale * sum of x over the flagged dims (sum, mean, sum_to,
// bias gradients), as pk::reduce_sum: one invocation per output, in order.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 x0, 1 y0, 2 nd, 3..8 shape, 9 reduced-dim bitmask, 10 scale
void main() {
  uint o = flat_id();
  int nd = pi(2);
  uint nout = 1, nred = 1;
  for (int d = 0; d < nd; ++d) {
    if ((pc.p[9] & (1u << d)) != 0u) nred *= pc.p[3 + d]; else nout *= pc.p[3 + d];
  }
  if (o >= nout) return;
  // base offset of this output's first input element
  uint rem = o, base = 0, stride = 1;
  uint st[6];
  for (int d = nd - 1; d >= 0; --d) { st[d] = stride; stride *= pc.p[3 + d]; }
  for (int d = nd - 1; d >= 0; --d) {
    if ((pc.p[9] & (1u << d)) != 0u) continue;
    base += (rem % pc.p[3 + d]) * st[d];
    rem /= pc.p[3 + d];
  }
  vec2 acc = vec2(0.0);
  for (uint r = 0; r < nred; ++r) {
    uint rr = r, off = base;
    for (int d = nd - 1; d >= 0; --d) {
      if ((pc.p[9] & (1u << d)) == 0u) continue;
      off += (rr % pc.p[3 + d]) * st[d];
      rr /= pc.p[3 + d];
    }
    kadd(acc, ldf(pc.p[0] + off));
  }
  stf(pc.p[1] + o, kval(acc) * pf(10));
}
