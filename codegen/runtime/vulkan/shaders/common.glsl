// common.glsl — what every PockEngine compute shader shares.
//
// One storage buffer holds all device memory of a step: [scalars | arena | state].
// It is bound three times (float, uint and int views of the same bytes); every
// operand is an offset in 4-byte words, passed as a push constant.  int64 tensors
// (indices, targets) are read through their low word.
#extension GL_GOOGLE_include_directive : require

layout(std430, set = 0, binding = 0) buffer MemF { float F[]; };
layout(std430, set = 0, binding = 0) buffer MemU { uint U[]; };
layout(std430, set = 0, binding = 0) buffer MemI { int I[]; };
layout(push_constant) uniform Push { uint p[32]; } pc;

const uint NONE = 0xFFFFFFFFu;  // an absent optional operand

// Flat invocation index over a 2D grid of 1D workgroups (large n splits over y).  A macro:
// gl_WorkGroupSize is only known after the shader's own local_size declaration.
#define flat_id() ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x)
float pf(int i) { return uintBitsToFloat(pc.p[i]); }
int pi(int i) { return int(pc.p[i]); }
int i64lo(uint word) { return I[word]; }  // the value of an int64 that fits 32 bits

// e^x as kernels/fast_math.h's fast_exp (Cody-Waite reduction and the Cephes
// polynomial, within 1 ulp), so activations and losses round like the CPU's.
float pexp(float x) {
  x = clamp(x, -104.0, 89.0);
  float n = roundEven(x * 1.44269504088896341);
  float r = x - n * 0.693359375;
  r = r - n * -2.12194440e-4;
  float p = 1.9875691500e-4;
  p = p * r + 1.3981999507e-3;
  p = p * r + 8.3334519073e-3;
  p = p * r + 4.1665795894e-2;
  p = p * r + 1.6666665459e-1;
  p = p * r + 5.0000001201e-1;
  float er = p * (r * r) + r + 1.0;
  int ni = int(n), n1 = ni >> 1, n2 = ni - n1;
  return er * uintBitsToFloat(uint(n1 + 127) << 23) * uintBitsToFloat(uint(n2 + 127) << 23);
}

// Compensated (Neumaier) sum: s.x the running sum, s.y the rounding error it
// dropped.  `precise` keeps the driver's compiler from simplifying the error
// term away.  kadd(s, x) adds x; kval(s) is the sum, about as accurate as the
// CPU kernels' double accumulators for the lengths we reduce over.
void kadd(inout vec2 s, float x) {
  precise float t = s.x + x;
  precise float e = abs(s.x) >= abs(x) ? (s.x - t) + x : (x - t) + s.x;
  s = vec2(t, s.y + e);
}
// s += a * b with the product's own rounding error (fma) carried too (Ogita-Rump-Oishi Dot2)
void kfma(inout vec2 s, float a, float b) {
  precise float p = a * b;
  precise float pe = fma(a, b, -p);
  kadd(s, p);
  s.y += pe;
}
void kmerge(inout vec2 s, vec2 o) { kadd(s, o.x); s.y += o.y; }
float kval(vec2 s) { return s.x + s.y; }
