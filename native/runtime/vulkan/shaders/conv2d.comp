// conv2d.comp — 2-D convolution (NCHW, weight [O, C/groups, KH, KW]; stride, padding,
// dilation, groups incl. depthwise) and its gradients (kernels/conv2d.cpp), one
// invocation per output element, side by side:
//   mode 0 forward      y[n,o,oh,ow] = act(sum_{c in group, kh, kw} x * w + b)
//   mode 1 input grad   dx[n,c,h,w]  = sum over the (o, kh, kw) whose window reads x[n,c,h,w] of dy * w
//   mode 2 weight grad  dw[o,ci,kh,kw] = sum_{n,oh,ow} dy * x, ci < k; x holds xc channels
//                       (xc == C, or xc == k when groups == 1: the input sliced to its first k)
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 in0 (x | dy | dy), 2 in1 (w | w | x), 3 bias0|NONE, 4 out0 (y | dx | dw),
//    5 N, 6 C, 7 H, 8 W, 9 O, 10 KH, 11 KW, 12 OH, 13 OW, 14 sh, 15 sw, 16 ph, 17 pw, 18 dh, 19 dw,
//    20 groups, 21 act (0 none, 1 relu, 2 relu6), 22 k, 23 xc
void main() {
  uint id = flat_id();
  int N = pi(5), C = pi(6), H = pi(7), W = pi(8), O = pi(9), KH = pi(10), KW = pi(11), OH = pi(12), OW = pi(13);
  int sh = pi(14), sw = pi(15), ph = pi(16), pw = pi(17), dh = pi(18), dw = pi(19), G = pi(20);
  int Cg = C / G, Og = O / G;
  uint in0 = pc.p[1], in1 = pc.p[2];
  float acc = 0.0;
  if (pc.p[0] == 0u) {
    if (id >= uint(N * O * OH * OW)) return;
    int ow = int(id) % OW, oh = int(id) / OW % OH, o = int(id) / (OW * OH) % O, n = int(id) / (OW * OH * O);
    int g = o / Og;
    for (int ci = 0; ci < Cg; ++ci) {
      uint xp = in0 + uint(((n * C + g * Cg + ci) * H) * W);
      uint wp = in1 + uint((o * Cg + ci) * KH * KW);
      for (int kh = 0; kh < KH; ++kh) {
        int ih = oh * sh - ph + kh * dh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
          int iw = ow * sw - pw + kw * dw;
          if (iw < 0 || iw >= W) continue;
          acc = fma(ldf(xp + uint(ih * W + iw)), ldf(wp + uint(kh * KW + kw)), acc);
        }
      }
    }
    if (pc.p[3] != NONE) acc += ldf(pc.p[3] + uint(o));
    if (pc.p[21] == 1u) acc = max(acc, 0.0);
    if (pc.p[21] == 2u) acc = clamp(acc, 0.0, 6.0);
  } else if (pc.p[0] == 1u) {
    if (id >= uint(N * C * H * W)) return;
    int w = int(id) % W, h = int(id) / W % H, c = int(id) / (W * H) % C, n = int(id) / (W * H * C);
    int g = c / Cg, ci = c % Cg;
    for (int o = g * Og; o < (g + 1) * Og; ++o) {
      uint dyp = in0 + uint(((n * O + o) * OH) * OW);
      uint wp = in1 + uint((o * Cg + ci) * KH * KW);
      for (int kh = 0; kh < KH; ++kh) {
        int t = h + ph - kh * dh;
        if (t < 0 || t % sh != 0 || t / sh >= OH) continue;
        for (int kw = 0; kw < KW; ++kw) {
          int u = w + pw - kw * dw;
          if (u < 0 || u % sw != 0 || u / sw >= OW) continue;
          acc = fma(ldf(dyp + uint(t / sh * OW + u / sw)), ldf(wp + uint(kh * KW + kw)), acc);
        }
      }
    }
  } else {
    int k = pi(22), xc = pi(23);
    if (id >= uint(O * k * KH * KW)) return;
    int kw = int(id) % KW, kh = int(id) / KW % KH, ci = int(id) / (KW * KH) % k, o = int(id) / (KW * KH * k);
    int xch = (o / Og) * Cg + ci;
    for (int n = 0; n < N; ++n) {
      uint dyp = in0 + uint(((n * O + o) * OH) * OW);
      uint xp = in1 + uint(((n * xc + xch) * H) * W);
      for (int oh = 0; oh < OH; ++oh) {
        int ih = oh * sh - ph + kh * dh;
        if (ih < 0 || ih >= H) continue;
        for (int ow = 0; ow < OW; ++ow) {
          int iw = ow * sw - pw + kw * dw;
          if (iw < 0 || iw >= W) continue;
          acc = fma(ldf(dyp + uint(oh * OW + ow)), ldf(xp + uint(ih * W + iw)), acc);
        }
      }
    }
  }
  stf(pc.p[4] + id, acc);
}
