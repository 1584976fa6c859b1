// pool.comp — max / average / adaptive-average 2-D pooling on NCHW planes
// (kernels/pool2d.cpp: PyTorch's windows, ceil_mode overhang, count_include_pad,
// divisor_override).  Forward: one invocation per output.  Backward: one per input
// element, gathering the outputs whose window holds it in ascending order (the CPU
// kernel's scatter order, so the sums round the same; no atomics).
//   mode 0 max fwd (y, idx = flat h*W+w in the plane), 1 max bwd, 2 avg fwd, 3 avg bwd,
//   4 adaptive avg fwd, 5 adaptive avg bwd
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 in0 (x | dy), 2 idx0 (max bwd), 3 out0 (y | dx), 4 idx0 (max fwd), 5 N, 6 C, 7 H, 8 W,
//    9 OH, 10 OW, 11 KH, 12 KW, 13 sh, 14 sw, 15 ph, 16 pw, 17 dh, 18 dw, 19 count_include_pad, 20 divisor
int H, W, OH, OW;

// [h0, h1) x [w0, w1) of average window (oh, ow), clipped; its divisor
vec4 avg_window(int oh, int ow, out float divisor) {
  int h0 = oh * pi(13) - pi(15), w0 = ow * pi(14) - pi(16);
  int h1 = min(h0 + pi(11), H + pi(15)), w1 = min(w0 + pi(12), W + pi(16));
  int pool_size = (h1 - h0) * (w1 - w0);
  h0 = max(h0, 0); w0 = max(w0, 0); h1 = min(h1, H); w1 = min(w1, W);
  divisor = float(pc.p[20] != 0u ? pi(20) : (pc.p[19] != 0u ? pool_size : (h1 - h0) * (w1 - w0)));
  return vec4(h0, h1, w0, w1);
}
int astart(int i, int n, int o) { return i * n / o; }
int aend(int i, int n, int o) { return ((i + 1) * n + o - 1) / o; }

void main() {
  uint id = flat_id(), mode = pc.p[0];
  H = pi(7); W = pi(8); OH = pi(9); OW = pi(10);
  uint planes = pc.p[5] * pc.p[6];
  bool fwd = mode == 0u || mode == 2u || mode == 4u;
  uint per = fwd ? uint(OH * OW) : uint(H * W);
  if (id >= planes * per) return;
  uint plane = id / per;
  int r = int(id % per);
  if (fwd) {
    int oh = r / OW, ow = r % OW;
    uint xp = pc.p[1] + plane * uint(H * W);
    float out_ = 0.0;
    if (mode == 0u) {
      int dh = pi(17), dw = pi(18);
      int h0 = oh * pi(13) - pi(15), w0 = ow * pi(14) - pi(16);
      int h1 = min(h0 + (pi(11) - 1) * dh + 1, H), w1 = min(w0 + (pi(12) - 1) * dw + 1, W);
      while (h0 < 0) h0 += dh;
      while (w0 < 0) w0 += dw;
      int best_i = h0 * W + w0;
      float best = uintBitsToFloat(0xFF800000u);
      for (int h = h0; h < h1; h += dh)
        for (int w = w0; w < w1; w += dw) {
          float v = ldf(xp + uint(h * W + w));
          if (v > best || isnan(v)) { best = v; best_i = h * W + w; }
        }
      out_ = best;
      sti(pc.p[4] + id, best_i);
    } else if (mode == 2u) {
      float div;
      vec4 win = avg_window(oh, ow, div);
      int h0 = int(win.x), h1 = int(win.y), w0 = int(win.z), w1 = int(win.w);
      if (h0 < h1 && w0 < w1) {
        float s = 0.0;
        for (int h = h0; h < h1; ++h)
          for (int w = w0; w < w1; ++w) s += ldf(xp + uint(h * W + w));
        out_ = s / div;
      }
    } else {
      int h0 = astart(oh, H, OH), h1 = aend(oh, H, OH), w0 = astart(ow, W, OW), w1 = aend(ow, W, OW);
      float s = 0.0;
      for (int h = h0; h < h1; ++h)
        for (int w = w0; w < w1; ++w) s += ldf(xp + uint(h * W + w));
      out_ = s / float(h1 - h0) / float(w1 - w0);
    }
    stf(pc.p[3] + id, out_);
    return;
  }
  int h = r / W, w = r % W;
  uint dyp = pc.p[1] + plane * uint(OH * OW);
  int oh0, oh1, ow0, ow1;  // candidate outputs (a superset, checked exactly below)
  if (mode == 5u) {
    oh0 = h * OH / H - 1; oh1 = (h + 1) * OH / H; ow0 = w * OW / W - 1; ow1 = (w + 1) * OW / W;
  } else {
    int sh = pi(13), sw = pi(14), ph = pi(15), pw = pi(16);
    int kh = mode == 1u ? (pi(11) - 1) * pi(17) : pi(11) - 1, kw = mode == 1u ? (pi(12) - 1) * pi(18) : pi(12) - 1;
    oh0 = (h + ph - kh) / sh - 1; oh1 = (h + ph) / sh; ow0 = (w + pw - kw) / sw - 1; ow1 = (w + pw) / sw;
  }
  oh0 = max(oh0, 0); ow0 = max(ow0, 0); oh1 = min(oh1, OH - 1); ow1 = min(ow1, OW - 1);
  float acc = 0.0;
  for (int oh = oh0; oh <= oh1; ++oh)
    for (int ow = ow0; ow <= ow1; ++ow) {
      uint o = uint(oh * OW + ow);
      if (mode == 1u) {
        if (ldi(pc.p[2] + plane * uint(OH * OW) + o) == r) acc += ldf(dyp + o);
      } else if (mode == 3u) {
        float div;
        vec4 win = avg_window(oh, ow, div);
        if (float(h) >= win.x && float(h) < win.y && float(w) >= win.z && float(w) < win.w) acc += ldf(dyp + o) / div;
      } else {
        if (astart(oh, H, OH) <= h && h < aend(oh, H, OH) && astart(ow, W, OW) <= w && w < aend(ow, W, OW))
          acc += ldf(dyp + o) / float((aend(oh, H, OH) - astart(oh, H, OH)) * (aend(ow, W, OW) - astart(ow, W, OW)));
      }
    }
  stf(pc.p[3] + id, acc);
}
