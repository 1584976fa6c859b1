// swiglu.comp — the SiLU-gated MLP product, forward and backward side by side
// (kernels/swiglu.cpp, fused by passes/fuse_norm.py):
//   mode 0 forward:  y = silu(gate) * up
//   mode 1 backward: dgate = dy * up * s * (1 + gate * (1 - s)), dup = dy * silu(gate), s = sigmoid(gate)
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 gate0, 2 up0, 3 y0, 4 n, 5 dy0, 6 dgate0|NONE, 7 dup0|NONE
void main() {
  uint i = flat_id();
  if (i >= pc.p[4]) return;
  float g = ldf(pc.p[1] + i), s = 1.0 / (1.0 + pexp(-g));
  if (pc.p[0] == 0u) {
    stf(pc.p[3] + i, (g * s) * ldf(pc.p[2] + i));
    return;
  }
  float dy = ldf(pc.p[5] + i);
  if (pc.p[6] != NONE) stf(pc.p[6] + i, dy * ldf(pc.p[2] + i) * (s * (1.0 + g * (1.0 - s))));
  if (pc.p[7] != NONE) stf(pc.p[7] + i, dy * (g * s));
}
