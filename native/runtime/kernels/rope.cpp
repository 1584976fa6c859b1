// rope.cpp — fused rotary position embedding (Llama/Qwen2/Mistral/Gemma/Phi-3 `apply_rotary_pos_emb`,
// recognised by passes/fuse_norm.py):  y = x * cos + rotate_half(x) * sin,
// rotate_half(x) = cat(-x[..., h:], x[..., :h]),  h = D / 2,  forward and backward side by side.
//
// Layout: x and y are [outer, rep, inner] with rows of D values inside `inner` (inner % D == 0),
// or with tmajor [outer, inner / D, rep, D] (a projection split into heads, [B, T, H, D], read
// in place: no permute copy); cos and sin are [outer or 1, inner] (cos_outer = 1 when they differ
// per outer index, 0 when broadcast), broadcast over `rep` (the heads).  Per row, with x1 = x[:h], x2 = x[h:]:
//   forward   y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2
//   backward  dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1   (the transpose of the rotation)
// Each output element is written by one thread (rows are split), so results do not depend on it.
#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {

// One row: a = x (forward) or dy (backward); the sign pattern of the rotation and its transpose.
template <bool kBackward>
inline void rotate_row(const float* __restrict a, const float* __restrict c, const float* __restrict s,
                       float* __restrict out, i64 h) {
  const float* c2 = c + h;
  const float* s2 = s + h;
  for (i64 d = 0; d < h; ++d) {
    const float a1 = a[d], a2 = a[d + h];
    if (kBackward) {
      out[d] = a1 * c[d] + a2 * s2[d];
      out[d + h] = a2 * c2[d] - a1 * s[d];
    } else {
      out[d] = a1 * c[d] - a2 * s[d];
      out[d + h] = a2 * c2[d] + a1 * s2[d];
    }
  }
}

template <bool kBackward>
void rope(const float* a, const float* cos, const float* sin, float* out, i64 outer, i64 rep, i64 inner, i64 D,
          i64 cos_outer, i64 tmajor) {
  const i64 rows_per = inner / D, rows = outer * rep * rows_per, h = D / 2;
  const i64 grain = D >= 4096 ? 1 : 4096 / (D > 0 ? D : 1);
  parallel_for(rows, grain, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const i64 o = r / (rep * rows_per), t = tmajor ? r / rep % rows_per : r % rows_per;
      const i64 c0 = (cos_outer ? o * inner : 0) + t * D;
      rotate_row<kBackward>(a + r * D, cos + c0, sin + c0, out + r * D, h);
    }
  });
}

}  // namespace

void rope_fwd(const float* x, const float* cos, const float* sin, float* y, i64 outer, i64 rep, i64 inner, i64 D,
              i64 cos_outer, i64 tmajor) {
  rope<false>(x, cos, sin, y, outer, rep, inner, D, cos_outer, tmajor);
}

void rope_bwd(const float* dy, const float* cos, const float* sin, float* dx, i64 outer, i64 rep, i64 inner, i64 D,
              i64 cos_outer, i64 tmajor) {
  rope<true>(dy, cos, sin, dx, outer, rep, inner, D, cos_outer, tmajor);
}

}  // namespace pk
