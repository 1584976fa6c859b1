// copy.comp — strided copy (permute, expand, slice, cat, slice backward) and fill,
// as pk::strided_copy / pk::fill; `words` is 1 for 4-byte and 2 for 8-byte elements.
// Mode 2 adds a 32-bit constant to n int64 values (integer bookkeeping such as
// BatchNorm's num_batches_tracked += 1), with the carry into the high word.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
// p: 0 mode (0 copy, 1 fill), 1 x0, 2 y0, 3 nd, 4..9 shape, 10..15 in strides, 16..21 out strides,
//    22 in offset, 23 out offset, 24 words, 25 fill value / addend (bits; fill and add: n = shape[0])
void main() {
  uint i = flat_id();
  uint words = pc.p[24];
  if (pc.p[0] == 1u) {
    if (i >= pc.p[4] * words) return;
    stu(pc.p[2] + i, (words == 2u && (i & 1u) == 1u) ? ((pc.p[25] & 0x80000000u) != 0u ? NONE : 0u) : pc.p[25]);
    return;
  }
  if (pc.p[0] == 2u) {
    if (i >= pc.p[4]) return;
    uint carry, lo = uaddCarry(ldu(pc.p[1] + 2u * i), pc.p[25], carry);
    stu(pc.p[2] + 2u * i, lo);
    stu(pc.p[2] + 2u * i + 1u, ldu(pc.p[1] + 2u * i + 1u) + carry + ((pc.p[25] & 0x80000000u) != 0u ? NONE : 0u));
    return;
  }
  uint n = 1;
  for (int d = 0; d < pi(3); ++d) n *= pc.p[4 + d];
  if (i >= n) return;
  uint rem = i, si = pc.p[22], so = pc.p[23];
  for (int d = pi(3) - 1; d >= 0; --d) {
    uint c = rem % pc.p[4 + d];
    rem /= pc.p[4 + d];
    si += c * pc.p[10 + d];
    so += c * pc.p[16 + d];
  }
  for (uint w = 0; w < words; ++w) stu(pc.p[2] + so * words + w, ldu(pc.p[1] + si * words + w));
}
