// gemm.comp — C = act(op(A) @ op(B) + bias) (+ C when accumulating), batched over z.
// Linear forward, both linear backward products and matmul are this shader with
// different strides (backends/vulkan.py, side by side):
//   linear_fwd        A = x[M,K],  B = w^T (w[N,K]),  bias, act
//   linear_bwd_input  A = dy[M,N], B = w[N,K]
//   linear_bwd_weight A = dy^T,    B = x[:, 0:k] (row stride ldx)
// One invocation per output element; the K-sum runs in order in fp32.
#version 450
#include "common.glsl"
layout(local_size_x = 8, local_size_y = 8) in;
// p: 0 a0, 1 a_rs, 2 a_cs, 3 b0, 4 b_rs, 5 b_cs, 6 c0, 7 ldc, 8 M, 9 N, 10 K,
//    11 bias0|NONE, 12 act (0 none, 1 relu, 2 relu6), 13 a batch stride, 14 b batch, 15 c batch, 16 accumulate
void main() {
  uint i = gl_GlobalInvocationID.y, j = gl_GlobalInvocationID.x, z = gl_GlobalInvocationID.z;
  if (i >= pc.p[8] || j >= pc.p[9]) return;
  uint a = pc.p[0] + z * pc.p[13] + i * pc.p[1];
  uint b = pc.p[3] + z * pc.p[14] + j * pc.p[5];
  float acc = 0.0;
  for (uint k = 0; k < pc.p[10]; ++k) acc = fma(ldf(a + k * pc.p[2]), ldf(b + k * pc.p[4]), acc);
  uint c = pc.p[6] + z * pc.p[15] + i * pc.p[7] + j;
  if (pc.p[16] != 0u) acc += ldf(c);
  if (pc.p[11] != NONE) acc += ldf(pc.p[11] + j);
  if (pc.p[12] == 1u) acc = max(acc, 0.0);
  if (pc.p[12] == 2u) acc = clamp(acc, 0.0, 6.0);
  stf(c, acc);
}
