// binary.comp — y = a (op) b with broadcasting: up to 6 merged dims, each operand
// with its own strides (0 on a broadcast dim), as pk::binary.
#version 450
#include "common.glsl"
#include "op_codes.glsl"
layout(local_size_x = 64) in;
// p: 0 op (0 add, 1 sub, 2 mul, 3 div), 1 a0, 2 b0, 3 y0, 4 nd, 5..10 shape, 11..16 a strides, 17..22 b strides
void main() {
  uint i = flat_id();
  uint n = 1;
  for (int d = 0; d < pi(4); ++d) n *= pc.p[5 + d];
  if (i >= n) return;
  uint rem = i, ia = pc.p[1], ib = pc.p[2];
  for (int d = pi(4) - 1; d >= 0; --d) {
    uint c = rem % pc.p[5 + d];
    rem /= pc.p[5 + d];
    ia += c * pc.p[11 + d];
    ib += c * pc.p[17 + d];
  }
  float a = ldf(ia), b = ldf(ib), y;
  switch (pc.p[0]) {
    case BIN_ADD: y = a + b; break;
    case BIN_SUB: y = a - b; break;
    case BIN_MUL: y = a * b; break;
    default: y = a / b; break;  // BIN_DIV
  }
  stf(pc.p[3] + i, y);
}
