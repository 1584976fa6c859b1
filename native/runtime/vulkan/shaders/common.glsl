// common.glsl — what every PockEngine compute shader shares.
//
// All device memory of a step is one buffer laid out [scalars | arena | state],
// seen through POCK_WINDOWS bindings (windows: byte ranges of it, each within
// maxStorageBufferRange; no tensor straddles two).  Every operand is a word offset
// passed as a push constant: with one window, a plain word offset into the
// buffer; with several, (window << 28) | word within that window.  Shaders read
// and write through ldf/ldu/ldi and stf/stu/sti (float, uint and int views of the same
// bytes).  int64 tensors (indices, targets) are read through their low word.
#ifndef POCK_WINDOWS
#define POCK_WINDOWS 1
#endif
#if POCK_WINDOWS == 1
layout(std430, set = 0, binding = 0) buffer MemF { float F[]; };
layout(std430, set = 0, binding = 0) buffer MemU { uint U[]; };
layout(std430, set = 0, binding = 0) buffer MemI { int I[]; };
#define ldf(x) F[(x)]
#define ldu(x) U[(x)]
#define ldi(x) I[(x)]
#define stf(x, v) F[(x)] = (v)
#define stu(x, v) U[(x)] = (v)
#define sti(x, v) I[(x)] = (v)
#else
#define POCK_WINDOW(k) \
  layout(std430, set = 0, binding = k) buffer MemF##k { float F##k[]; }; \
  layout(std430, set = 0, binding = k) buffer MemU##k { uint U##k[]; }; \
  layout(std430, set = 0, binding = k) buffer MemI##k { int I##k[]; };
POCK_WINDOW(0)
POCK_WINDOW(1)
#if POCK_WINDOWS > 2
POCK_WINDOW(2)
#endif
#if POCK_WINDOWS > 3
POCK_WINDOW(3)
#endif
#if POCK_WINDOWS > 4
POCK_WINDOW(4)
#endif
#if POCK_WINDOWS > 5
POCK_WINDOW(5)
#endif
#if POCK_WINDOWS > 6
POCK_WINDOW(6)
#endif
#if POCK_WINDOWS > 7
POCK_WINDOW(7)
#endif
#if POCK_WINDOWS > 8
#error "at most 8 windows"
#endif
// One accessor per view: the window's case of a switch (k < POCK_WINDOWS only).
#define POCK_CASE_LD(A, k) case k: return A##k[w];
#define POCK_CASE_ST(A, k) case k: A##k[w] = v; return;
#define POCK_SWITCH(CASE, A) switch (x >> 28) { \
    CASE(A, 0) CASE(A, 1) POCK_MORE(CASE, A) }
#if POCK_WINDOWS == 2
#define POCK_MORE(CASE, A)
#elif POCK_WINDOWS == 3
#define POCK_MORE(CASE, A) CASE(A, 2)
#elif POCK_WINDOWS == 4
#define POCK_MORE(CASE, A) CASE(A, 2) CASE(A, 3)
#elif POCK_WINDOWS == 5
#define POCK_MORE(CASE, A) CASE(A, 2) CASE(A, 3) CASE(A, 4)
#elif POCK_WINDOWS == 6
#define POCK_MORE(CASE, A) CASE(A, 2) CASE(A, 3) CASE(A, 4) CASE(A, 5)
#elif POCK_WINDOWS == 7
#define POCK_MORE(CASE, A) CASE(A, 2) CASE(A, 3) CASE(A, 4) CASE(A, 5) CASE(A, 6)
#else
#define POCK_MORE(CASE, A) CASE(A, 2) CASE(A, 3) CASE(A, 4) CASE(A, 5) CASE(A, 6) CASE(A, 7)
#endif
float ldf(uint x) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_LD, F) return 0.0; }
uint ldu(uint x) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_LD, U) return 0u; }
int ldi(uint x) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_LD, I) return 0; }
void stf(uint x, float v) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_ST, F) }
void stu(uint x, uint v) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_ST, U) }
void sti(uint x, int v) { uint w = x & 0x0FFFFFFFu; POCK_SWITCH(POCK_CASE_ST, I) }
#endif
layout(push_constant) uniform Push { uint p[32]; } pc;

const uint NONE = 0xFFFFFFFFu;  // an absent optional operand

// Flat invocation index over a 2D grid of 1D workgroups (large n splits over y).  A macro:
// gl_WorkGroupSize is only known after the shader's own local_size declaration.
#define flat_id() ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x)
float pf(int i) { return uintBitsToFloat(pc.p[i]); }
int pi(int i) { return int(pc.p[i]); }
int i64lo(uint word) { return ldi(word); }  // the value of an int64 that fits 32 bits
// Whether the int64 at `word` lies in [0, hi) (hi < 2^31): both words, so -1, 2^32 + 3 and
// INT64_MIN/MAX are all out (a gather must never read with them).
bool i64_below(uint word, uint hi) { return ldu(word + 1u) == 0u && ldu(word) < hi; }
// Whether the int64 at `word` equals the 32-bit signed value v (sign-extended).
bool i64_is(uint word, int v) { return ldi(word) == v && ldi(word + 1u) == (v < 0 ? -1 : 0); }
// A gather's error record: the word (in the scalars block, window 0) keeps the smallest
// flat position of an index out of range; the host set it to NONE before the segment.
#if POCK_WINDOWS == 1
void flag_index(uint word, uint pos) { if (word != NONE) atomicMin(U[word], pos); }
#else
void flag_index(uint word, uint pos) { if (word != NONE) atomicMin(U0[word & 0x0FFFFFFFu], pos); }
#endif

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
