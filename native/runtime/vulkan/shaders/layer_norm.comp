// layer_norm.comp — LayerNorm over the last `cols` values of each row, forward
// and backward side by side (kernels/layer_norm.cpp):
//   mode 0 forward   (a row per invocation): y = (x - mean) * rstd * w + b, saves mean, rstd
//   mode 1 dx        (a row per invocation): dx = rstd * (g - mean(g) - xhat * mean(g xhat)), g = dy w
//   mode 2 dw, db    (a column per invocation): dw = sum_r dy xhat, db = sum_r dy
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 x0, 2 w0|NONE, 3 b0|NONE, 4 y0|dx0, 5 mean0, 6 rstd0, 7 rows, 8 cols, 9 eps,
//    10 dy0, 11 dw0|NONE, 12 db0|NONE
float wt(uint c) { return pc.p[2] == NONE ? 1.0 : ldf(pc.p[2] + c); }

void main() {
  uint id = flat_id(), rows = pc.p[7], cols = pc.p[8];
  if (pc.p[0] == 2u) {
    if (id >= cols) return;
    vec2 aw = vec2(0.0), ab = vec2(0.0);
    for (uint r = 0; r < rows; ++r) {
      float dy = ldf(pc.p[10] + r * cols + id);
      kadd(aw, dy * ((ldf(pc.p[1] + r * cols + id) - ldf(pc.p[5] + r)) * ldf(pc.p[6] + r)));
      kadd(ab, dy);
    }
    if (pc.p[11] != NONE) stf(pc.p[11] + id, kval(aw));
    if (pc.p[12] != NONE) stf(pc.p[12] + id, kval(ab));
    return;
  }
  if (id >= rows) return;
  uint x = pc.p[1] + id * cols, y = pc.p[4] + id * cols;
  if (pc.p[0] == 0u) {
    vec2 s = vec2(0.0), v = vec2(0.0);
    for (uint c = 0; c < cols; ++c) kadd(s, ldf(x + c));
    float mean = kval(s) / float(cols);
    for (uint c = 0; c < cols; ++c) { float d = ldf(x + c) - mean; kadd(v, d * d); }
    float rstd = 1.0 / sqrt(kval(v) / float(cols) + pf(9));
    for (uint c = 0; c < cols; ++c) {
      float h = (ldf(x + c) - mean) * rstd * wt(c);
      stf(y + c, pc.p[3] == NONE ? h : h + ldf(pc.p[3] + c));
    }
    stf(pc.p[5] + id, mean);
    stf(pc.p[6] + id, rstd);
    return;
  }
  uint dy = pc.p[10] + id * cols;
  float m = ldf(pc.p[5] + id), rs = ldf(pc.p[6] + id);
  vec2 sg = vec2(0.0), sgx = vec2(0.0);
  for (uint c = 0; c < cols; ++c) {
    float g = ldf(dy + c) * wt(c);
    kadd(sg, g);
    kadd(sgx, g * ((ldf(x + c) - m) * rs));
  }
  float mg = kval(sg) / float(cols), mgx = kval(sgx) / float(cols);
  for (uint c = 0; c < cols; ++c) stf(y + c, rs * (ldf(dy + c) * wt(c) - mg - ((ldf(x + c) - m) * rs) * mgx));
}
