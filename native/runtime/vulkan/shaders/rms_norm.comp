// rms_norm.comp — RMSNorm over the last `cols` values of each row, forward and
// backward side by side (kernels/rms_norm.cpp, fused by passes/fuse_norm.py):
//   mode 0 forward (a row per invocation):   y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps), saves r
//   mode 1 dx      (a row per invocation):   dx = r * (g - h * mean(g h)), g = dy w, h = x r
//   mode 2 dw      (a column per invocation): dw = sum_r dy h
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 x0, 2 w0|NONE, 3 y0|dx0, 4 rstd0, 5 rows, 6 cols, 7 eps, 8 dy0, 9 dw0|NONE
float wt(uint c) { return pc.p[2] == NONE ? 1.0 : ldf(pc.p[2] + c); }

void main() {
  uint id = flat_id(), rows = pc.p[5], cols = pc.p[6];
  if (pc.p[0] == 2u) {
    if (id >= cols) return;
    vec2 aw = vec2(0.0);
    for (uint r = 0; r < rows; ++r)
      kadd(aw, ldf(pc.p[8] + r * cols + id) * (ldf(pc.p[1] + r * cols + id) * ldf(pc.p[4] + r)));
    stf(pc.p[9] + id, kval(aw));
    return;
  }
  if (id >= rows) return;
  uint x = pc.p[1] + id * cols, y = pc.p[3] + id * cols;
  if (pc.p[0] == 0u) {
    vec2 sq = vec2(0.0);
    for (uint c = 0; c < cols; ++c) { float v = ldf(x + c); kadd(sq, v * v); }
    float r = 1.0 / sqrt(kval(sq) / float(cols) + pf(7));
    for (uint c = 0; c < cols; ++c) stf(y + c, wt(c) * (ldf(x + c) * r));
    stf(pc.p[4] + id, r);
    return;
  }
  uint dy = pc.p[8] + id * cols;
  float r = ldf(pc.p[4] + id);
  vec2 dot = vec2(0.0);
  for (uint c = 0; c < cols; ++c) kadd(dot, (ldf(dy + c) * wt(c)) * (ldf(x + c) * r));
  float m = kval(dot) / float(cols);
  for (uint c = 0; c < cols; ++c) stf(y + c, r * (ldf(dy + c) * wt(c) - (ldf(x + c) * r) * m));
}
