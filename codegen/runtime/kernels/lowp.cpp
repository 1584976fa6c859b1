// lowp.cpp — linear and embedding over a frozen weight stored in low precision
// (compile(frozen_dtype=...), passes/lowp.py), dequantized inside the kernel.
//
//   bf16: the high 16 bits of an fp32 (round-to-nearest-even when stored)
//   f16:  IEEE half
//   i8:   w[n, k] = q[n, k] * scale[n]   (per output channel, |q| <= 127)
//   q4:   GGUF Q4_1-style blocks of 32 along a row: w = q * d + m, q in [0, 15], (d, m) =
//         scale[(n * K / 32 + block) * 2 + {0, 1}]; a row is K / 2 bytes, byte j of a block
//         holds q[j] (low nibble) and q[j + 16] (high nibble)
//
// The weight is never materialised in fp32: gemm.cpp packs op(B) block by block
// through a reader (gemm_view_reader) that dequantizes the rows it packs, so the
// dequantization rides on the packing pass the fp32 product makes anyway (the
// forward's w^T panels go through register transposes, simd.h). Dequantization
// is exact (every format widens to fp32 without rounding; q4 rounds q * d, then
// the + m, never one FMA), so a torch model holding the rounded weights in fp32
// is the reference. The forward applies bias and the fused activation per tile.
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"
#include "gemm_detail.h"
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pk {

namespace {

using namespace simd;

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Keeps x a rounded value of its own (no FMA may absorb the operation that made it).
inline void opaque(V& x) {
#if defined(__AVX512F__) || defined(__AVX2__)
  asm("" : "+x"(x.v));
#elif PK_NEON
  asm("" : "+w"(x.v));
#else
  asm volatile("" : : "r"(&x) : "memory");
#endif
}

// q4 block b (32 values from 16 bytes) positions [p0, p1) -> out[0, p1 - p0)
#if defined(__GNUC__)
#define PK_LOWP_INLINE inline __attribute__((always_inline))
#else
#define PK_LOWP_INLINE inline
#endif

PK_LOWP_INLINE void q4_block(const uint8_t* bytes, float d, float m, int p0, int p1, float* out) {
#if defined(__AVX512F__)
  // 16 values at a time straight from the nibbles: the low (p0 = 0) and/or high
  // half of the block, every panel's case (32 / 256 columns)
  if (((p0 | p1) & 15) == 0) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)), nib = _mm_set1_epi8(15);
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    for (int g = p0 >> 4; g < p1 >> 4; ++g) {
      const __m128i b16 = _mm_and_si128(g ? _mm_srli_epi16(raw, 4) : raw, nib);
      __m512 prod = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b16)), dv);
      asm("" : "+v"(prod));  // two roundings, as quant.dequantize
      _mm512_storeu_ps(out + (g << 4) - p0, _mm512_add_ps(prod, mv));
    }
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  // 8 values at a time straight from the nibbles (the scalar unpack below is
  // what made x86-64-v3's q4 products ~20% slower than int8's): groups of 8
  // aligned to the block, which is every panel's case (16 / 32 / 256 columns)
  if (((p0 | p1) & 7) == 0) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)), nib = _mm_set1_epi8(15);
    const __m128i half[2] = {_mm_and_si128(raw, nib), _mm_and_si128(_mm_srli_epi16(raw, 4), nib)};
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int g = p0 >> 3; g < p1 >> 3; ++g) {
      const __m128i b8 = (g & 1) ? _mm_srli_si128(half[g >> 1], 8) : half[g >> 1];
      __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8)), dv);
      asm("" : "+x"(prod));  // two roundings, as quant.dequantize
      _mm256_storeu_ps(out + (g << 3) - p0, _mm256_add_ps(prod, mv));
    }
    return;
  }
#endif
  alignas(64) float q[32];
  if (p0 == 0 && p1 == 32) {
    for (int j = 0; j < 16; ++j) q[j] = static_cast<float>(bytes[j] & 15);
    for (int j = 0; j < 16; ++j) q[j + 16] = static_cast<float>(bytes[j] >> 4);
  } else if (p0 == 0 && p1 == 16) {  // AVX2 panels: half blocks
    for (int j = 0; j < 16; ++j) q[j] = static_cast<float>(bytes[j] & 15);
  } else if (p0 == 16 && p1 == 32) {
    for (int j = 0; j < 16; ++j) q[j + 16] = static_cast<float>(bytes[j] >> 4);
  } else {
    for (int j = p0; j < (p1 < 16 ? p1 : 16); ++j) q[j] = static_cast<float>(bytes[j] & 15);
    for (int j = p0 > 16 ? p0 : 16; j < p1; ++j) q[j] = static_cast<float>(bytes[j - 16] >> 4);
  }
  // vectors over [p0, p1) (a panel edge may cut the block: AVX2's 16 and NEON's 12 columns)
  const V dv = vbcast(d), mv = vbcast(m);
  int j = p0;
  for (; j + kW <= p1; j += kW) {
    V prod = vmul(vload(q + j), dv);
    opaque(prod);  // two roundings, as quant.dequantize
    vstore(out + j - p0, vadd(prod, mv));
  }
  for (; j < p1; ++j) {
    volatile float prod = q[j] * d;
    out[j - p0] = prod + m;
  }
}

// out[0:n] = dequant(w)[row, c0 : c0 + n]  (w is [rows, K])
PK_LOWP_INLINE void dequant_span(const void* w, LowpDtype dt, const float* scale, i64 K, i64 row, i64 c0, i64 n, float* out) {
  if (dt == LowpDtype::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(w) + row * K + c0;
    for (i64 i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else if (dt == LowpDtype::F16) {
    const uint16_t* src = static_cast<const uint16_t*>(w) + row * K + c0;
    i64 i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) out[i] = f16_to_f32(src[i]);
  } else if (dt == LowpDtype::I8) {
    const int8_t* src = static_cast<const int8_t*>(w) + row * K + c0;
    const float s = scale[row];
    for (i64 i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]) * s;
  } else {  // Q4
    const uint8_t* src = static_cast<const uint8_t*>(w) + row * (K / 2);
    const float* dm = scale + row * (K / 32) * 2;
    for (i64 i = 0; i < n;) {
      const i64 c = c0 + i, b = c / 32;
      const int p0 = static_cast<int>(c % 32);
      const int p1 = static_cast<int>(n - i < 32 - p0 ? p0 + (n - i) : 32);
      q4_block(src + b * 16, dm[2 * b], dm[2 * b + 1], p0, p1, out + i);
      i += p1 - p0;
    }
  }
}

struct LowpW {
  const void* w;
  LowpDtype dt;
  const float* scale;
  i64 K;  // row length of w [N, K]
};

// gemm reader for op(B) = dequant(w)^T ([K, N]): out[k*ld + j] = w[c0 + j, r0 + k].
// Up to kT rows of w at a time are dequantized into a stack tile, then
// transposed into place.
void read_wt(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpW& q = *static_cast<const LowpW*>(ctx);
  constexpr i64 kSpan = 256;
  alignas(64) float tile[kT * kSpan];
  for (i64 j = 0; j < cols; j += kT) {
    const i64 nj = cols - j < kT ? cols - j : kT;
    for (i64 k = 0; k < rows; k += kSpan) {
      const i64 nk = rows - k < kSpan ? rows - k : kSpan;
      for (i64 t = 0; t < nj; ++t) dequant_span(q.w, q.dt, q.scale, q.K, c0 + j + t, r0 + k, nk, tile + t * kSpan);
      transpose_copy(tile, kSpan, nk, nj, out + k * ld + j, ld);
    }
  }
}

// gemm reader for op(B) = dequant(w) ([N, K] read as [K_gemm = N, N_gemm = K]).
void read_w(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld) {
  const LowpW& q = *static_cast<const LowpW*>(ctx);
  switch (q.dt) {  // one loop per format, the format's code inlined into it
    case LowpDtype::BF16:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::BF16, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    case LowpDtype::F16:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::F16, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    case LowpDtype::I8:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::I8, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
      break;
    default:
      for (i64 k = 0; k < rows; ++k) dequant_span(q.w, LowpDtype::Q4, q.scale, q.K, r0 + k, c0, cols, out + k * ld);
  }
}

}  // namespace

// y[M,N] = act(x[M,K] @ dequant(w)[N,K]^T + b[N])
void linear_fwd_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                     i64 M, i64 N, i64 K, Act act) {
  const LowpW q{w, dt, scale, K};
  detail::gemm_view_reader(x, K, 1, read_wt, &q, y, N, M, N, K, 0.0f, b, act);
}

// dx[M,K] = dy[M,N] @ dequant(w)[N,K]
void linear_bwd_input_lowp(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                           i64 N, i64 K) {
  const LowpW q{w, dt, scale, K};
  detail::gemm_view_reader(dy, N, 1, read_w, &q, dx, K, M, K, N, 0.0f, nullptr, Act::None);
}

// y[i, :] = dequant(w)[idx[i], :]  (indices validated by the C API)
// As embedding_fwd: a row whose index is outside [0, V) becomes zeros (never read
// with); returns the first such i, -1 when none.
i64 embedding_fwd_lowp(const void* w, LowpDtype dt, const float* scale, const int64_t* idx, float* y, i64 n,
                       i64 V, i64 D) {
  auto run = [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) {
      if (idx[i] < 0 || idx[i] >= V)
        std::memset(y + i * D, 0, sizeof(float) * static_cast<size_t>(D));
      else
        dequant_span(w, dt, scale, D, idx[i], 0, D, y + i * D);
    }
  };
  if (n * D >= (i64(1) << 15))
    parallel_for(n, 8, run);
  else
    run(0, n);
  for (i64 i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= V) return i;
  return -1;
}

}  // namespace pk
