// batch_norm.comp — batch normalisation over x[N, C, S] (kernels/batch_norm.cpp), one
// workgroup per channel: each invocation sums a strided share of the channel's N*S
// values (compensated sums, kadd), the shares are combined in a fixed tree (the
// result does not depend on the device), then the whole workgroup writes y / dx.
//   mode 0 train forward   mean / biased var over (N, S); y = act(x * scale + shift);
//                          saves mean, invstd; running stats (momentum, unbiased var)
//   mode 1 train backward  dx = w invstd (dy - sum(dy)/cnt - (x - mean) invstd^2 sum(dy (x-mean))/cnt);
//                          dw = invstd sum(dy (x - mean)), db = sum(dy); with act (p16) dy is first
//                          masked by the fused relu / relu6's output (p20: y > 0, 0 < y < 6)
//   mode 2 eval forward    y = act(x * scale + shift) with the running statistics
//   mode 3 eval backward   dx = dy w invstd; dw = invstd sum(dy (x - rm)); db = sum(dy)
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode, 1 x0, 2 w0|NONE, 3 b0|NONE, 4 rm0|NONE, 5 rv0|NONE, 6 y0|dx0|NONE, 7 mean0|NONE,
//    8 invstd0|NONE, 9 new_rm0|NONE, 10 new_rv0|NONE, 11 N, 12 C, 13 S, 14 momentum, 15 eps,
//    16 act (0 none, 1 relu, 2 relu6), 17 dy0, 18 dw0|NONE, 19 db0|NONE, 20 act_out0 (mode 1 with act)
shared vec2 red_a[64];
shared vec2 red_b[64];
shared float bc[4];

uint at(uint i, uint c) {  // word of the i-th value (n*S + s) of channel c
  uint S = pc.p[13];
  return (i / S * pc.p[12] + c) * S + i % S;
}

void reduce2(uint t) {  // red_a, red_b[0] = the sums of all 64 shares
  for (uint half_ = 32u; half_ > 0u; half_ >>= 1) {
    barrier();
    if (t < half_) {
      vec2 a = red_a[t], b = red_b[t];
      kmerge(a, red_a[t + half_]);
      kmerge(b, red_b[t + half_]);
      red_a[t] = a;
      red_b[t] = b;
    }
  }
  barrier();
}

float act(float v) {
  if (pc.p[16] == 1u) return max(v, 0.0);
  if (pc.p[16] == 2u) return clamp(v, 0.0, 6.0);
  return v;
}

float grad(uint k) {  // dy at word k, through the fused activation's derivative in mode 1
  float g = ldf(pc.p[17] + k);
  if (pc.p[0] != 1u || pc.p[16] == 0u) return g;
  float v = ldf(pc.p[20] + k);
  return v > 0.0 && (pc.p[16] == 1u || v < 6.0) ? g : 0.0;
}

void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, mode = pc.p[0];
  uint cnt = pc.p[11] * pc.p[13];
  float wc = pc.p[2] == NONE ? 1.0 : ldf(pc.p[2] + c);
  uint x = pc.p[1], y = pc.p[6], dy = pc.p[17];
  if (mode == 0u) {
    vec2 s = vec2(0.0);
    for (uint i = t; i < cnt; i += 64u) kadd(s, ldf(x + at(i, c)));
    red_a[t] = s;
    red_b[t] = vec2(0.0);
    reduce2(t);
    float mean = cnt > 0u ? kval(red_a[0]) / float(cnt) : 0.0;
    barrier();
    vec2 q = vec2(0.0);
    for (uint i = t; i < cnt; i += 64u) {
      float d = ldf(x + at(i, c)) - mean;
      kadd(q, d * d);
    }
    red_a[t] = q;
    reduce2(t);
    if (t == 0u) {
      float sq = kval(red_a[0]);
      float var = cnt > 0u ? sq / float(cnt) : 0.0;
      float invstd = 1.0 / sqrt(var + pf(15));
      float m = pf(14);
      if (pc.p[7] != NONE) stf(pc.p[7] + c, mean);
      if (pc.p[8] != NONE) stf(pc.p[8] + c, invstd);
      if (pc.p[4] != NONE && pc.p[9] != NONE) stf(pc.p[9] + c, (1.0 - m) * ldf(pc.p[4] + c) + m * mean);
      if (pc.p[5] != NONE && pc.p[10] != NONE) {
        float unbiased = cnt > 1u ? sq / float(cnt - 1u) : var;
        stf(pc.p[10] + c, (1.0 - m) * ldf(pc.p[5] + c) + m * unbiased);
      }
      float scale = invstd * wc;
      bc[0] = scale;
      bc[1] = (pc.p[3] == NONE ? 0.0 : ldf(pc.p[3] + c)) - mean * scale;
    }
    barrier();
    for (uint i = t; i < cnt; i += 64u) stf(y + at(i, c), act(ldf(x + at(i, c)) * bc[0] + bc[1]));
    return;
  }
  if (mode == 2u) {
    float invstd = 1.0 / sqrt(ldf(pc.p[5] + c) + pf(15));
    float scale = invstd * wc;
    float shift = (pc.p[3] == NONE ? 0.0 : ldf(pc.p[3] + c)) - ldf(pc.p[4] + c) * scale;
    for (uint i = t; i < cnt; i += 64u) stf(y + at(i, c), act(ldf(x + at(i, c)) * scale + shift));
    return;
  }
  // backward: sums of dy and dy * (x - mean) over the channel
  float mu = mode == 1u ? ldf(pc.p[7] + c) : ldf(pc.p[4] + c);
  float invstd = mode == 1u ? ldf(pc.p[8] + c) : 1.0 / sqrt(ldf(pc.p[5] + c) + pf(15));
  vec2 a = vec2(0.0), b = vec2(0.0);
  for (uint i = t; i < cnt; i += 64u) {
    uint k = at(i, c);
    kadd(a, grad(k));
    kadd(b, grad(k) * (ldf(x + k) - mu));
  }
  red_a[t] = a;
  red_b[t] = b;
  reduce2(t);
  float sum_dy = kval(red_a[0]), sum_dy_xmu = kval(red_b[0]);
  if (t == 0u) {
    if (pc.p[18] != NONE) stf(pc.p[18] + c, sum_dy_xmu * invstd);
    if (pc.p[19] != NONE) stf(pc.p[19] + c, sum_dy);
  }
  if (y == NONE || cnt == 0u) return;
  float gain = wc * invstd;
  if (mode == 3u) {
    for (uint i = t; i < cnt; i += 64u) stf(y + at(i, c), ldf(dy + at(i, c)) * gain);
    return;
  }
  float mean_dy = sum_dy / float(cnt);
  float k = sum_dy_xmu / float(cnt) * invstd * invstd;
  for (uint i = t; i < cnt; i += 64u) {
    uint j = at(i, c);
    stf(y + j, (grad(j) - mean_dy - (ldf(x + j) - mu) * k) * gain);
  }
}
