// rope.comp — rotary position embedding, forward and backward side by side (kernels/rope.cpp):
// x, y [outer, rep, inner] in rows of D (tmajor: [outer, inner / D, rep, D]); cos, sin [outer if
// cos_outer else 1, inner]; h = D / 2.
//   mode 0 forward:  y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2
//   mode 1 backward: dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1
// One invocation per (row, d < h) pair.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 a0 (x or dy), 2 cos0, 3 sin0, 4 out0, 5 outer, 6 rep, 7 inner, 8 D, 9 cos_outer, 10 tmajor
void main() {
  uint id = flat_id(), D = pc.p[8], h = D / 2u, inner = pc.p[7], rows_per = inner / D;
  uint rows = pc.p[5] * pc.p[6] * rows_per;
  if (id >= rows * h) return;
  uint r = id / h, d = id % h;
  uint o = r / (pc.p[6] * rows_per), t = pc.p[10] != 0u ? r / pc.p[6] % rows_per : r % rows_per;
  uint c = (pc.p[9] != 0u ? o * inner : 0u) + t * D + d;
  uint i = r * D + d;
  float a1 = ldf(pc.p[1] + i), a2 = ldf(pc.p[1] + i + h);
  float c1 = ldf(pc.p[2] + c), c2 = ldf(pc.p[2] + c + h), s1 = ldf(pc.p[3] + c), s2 = ldf(pc.p[3] + c + h);
  if (pc.p[0] == 0u) {
    stf(pc.p[4] + i, a1 * c1 - a2 * s1);
    stf(pc.p[4] + i + h, a2 * c2 + a1 * s2);
  } else {
    stf(pc.p[4] + i, a1 * c1 + a2 * s2);
    stf(pc.p[4] + i + h, a2 * c2 - a1 * s1);
  }
}
