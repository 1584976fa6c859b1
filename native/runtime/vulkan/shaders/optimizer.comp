// optimizer.comp — SGD and AdamW updates in place over an update region (kernels/optimizer.cpp),
// one invocation per element: param[o*stride + j], grad/state[o*inner + j], j < inner.
// The step's scalars (lr, step; AdamW's bias corrections, computed in double on the host
// each step like the CPU kernel) are read from the scalars block at the start of memory.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode (0 sgd, 1 adamw), 1 p0, 2 g0, 3 s1 (buf | m; NONE), 4 s2 (v), 5 outer, 6 inner, 7 stride,
//    sgd:   8 momentum, 9 1-dampening, 10 weight_decay, 11 nesterov   (U[0] = lr, U[1] = step)
//    adamw: 8 slot of 8 floats: -lr/bc1, sqrt(bc2), 1-lr*wd, 1-b1, b1 (lerp's 1-w), 1-b2, b2, eps
void main() {
  uint e = flat_id(), inner = pc.p[6];
  if (e >= pc.p[5] * inner) return;
  uint o = e / inner, j = e % inner;
  uint ip = pc.p[1] + o * pc.p[7] + j, ig = pc.p[2] + e;
  float p = ldf(ip), g = ldf(ig);
  if (pc.p[0] == 0u) {  // torch.optim.SGD
    float lr = ldf(0), mom = pf(8), wd = pf(10);
    float d = wd != 0.0 ? g + wd * p : g;
    if (mom != 0.0) {
      uint ib = pc.p[3] + e;
      float b = ldi(1) == 0 ? d : ldf(ib) * mom + pf(9) * d;
      stf(ib, b);
      d = pc.p[11] != 0u ? d + mom * b : b;
    }
    stf(ip, p - lr * d);
    return;
  }
  uint s = pc.p[8];  // torch.optim.AdamW
  float neg_step = ldf(s), bc2_sqrt = ldf(s + 1), decay = ldf(s + 2), w = ldf(s + 3), w_c = ldf(s + 4);
  float f2 = ldf(s + 5), fb2 = ldf(s + 6), eps = ldf(s + 7);
  uint im = pc.p[3] + e, iv = pc.p[4] + e;
  float m = ldf(im);
  m = w < 0.5 ? m + w * (g - m) : g - (g - m) * w_c;
  float v = ldf(iv) * fb2 + f2 * g * g;
  stf(im, m);
  stf(iv, v);
  stf(ip, p * decay + neg_step * (m / (sqrt(v) / bc2_sqrt + eps)));
}
