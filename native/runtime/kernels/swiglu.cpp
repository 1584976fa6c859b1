// swiglu.cpp — fused SiLU-gated MLP product (Llama/Qwen2/Mistral/Gemma-style MLPs,
// recognised by passes/fuse_norm.py):  y = silu(gate) * up,  forward and backward side by side.
// Same vector formulas as activation.cpp's silu_fwd/silu_bwd followed by the product, so the
// results equal the unfused silu + mul + their gradients, in one pass over memory.
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "vec_math.h"

namespace pk {

namespace {

using namespace simd;
using vmath::vsigmoid;

constexpr i64 kGrain = 1 << 14;
constexpr i64 kAlign = 64;

inline V silu(V g) { return vdiv(g, vadd(vbcast(1.f), vmath::vexp(vsub(vzero(), g)))); }

// f(i, loads...) over [b, e) in vectors; the tail zero-padded through the same code.
template <int N, class F>
inline void each(const float* const* in, float* const* out, int nout, i64 b, i64 e, F&& f) {
  i64 i = b;
  V x[N], y[2];
  for (; i + kW <= e; i += kW) {
    for (int k = 0; k < N; ++k) x[k] = vload(in[k] + i);
    f(x, y);
    for (int k = 0; k < nout; ++k)
      if (out[k] != nullptr) vstore(out[k] + i, y[k]);
  }
  if (i < e) {
    float t[N][kW] = {}, u[2][kW];
    for (int k = 0; k < N; ++k) std::memcpy(t[k], in[k] + i, sizeof(float) * (e - i));
    for (int k = 0; k < N; ++k) x[k] = vload(t[k]);
    f(x, y);
    for (int k = 0; k < nout; ++k) {
      if (out[k] == nullptr) continue;
      vstore(u[k], y[k]);
      std::memcpy(out[k] + i, u[k], sizeof(float) * (e - i));
    }
  }
}

}  // namespace

void swiglu_fwd(const float* gate, const float* up, float* y, i64 n) {
  const float* in[2] = {gate, up};
  float* out[1] = {y};
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    each<2>(in, out, 1, b, e, [](const V* x, V* r) { r[0] = vmul(silu(x[0]), x[1]); });
  });
}

// dup = dy * silu(gate);  dgate = (dy * up) * s * (1 + gate * (1 - s)),  s = sigmoid(gate).
void swiglu_bwd(const float* dy, const float* gate, const float* up, float* dgate, float* dup, i64 n) {
  const float* in[3] = {dy, gate, up};
  float* out[2] = {dgate, dup};
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    each<3>(in, out, 2, b, e, [](const V* x, V* r) {
      const V s = vsigmoid(x[1]);
      r[0] = vmul(vmul(vmul(x[0], x[2]), s), vfma(x[1], vsub(vbcast(1.f), s), vbcast(1.f)));
      r[1] = vmul(x[0], silu(x[1]));
    });
  });
}

}  // namespace pk
