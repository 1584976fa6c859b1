// gemv.cpp — y = dequant(w) x + b for ONE row x against a frozen weight stored in low
// precision (lowp.cpp's formats): the decode step of generation (kernels/decoder.cpp).
// linear_fwd_lowp is made for many rows of x: it dequantizes w through the GEMM's packing
// reader (tiles, register transposes), which for one row of x costs several times the
// product.  Here each weight row is dequantized 32 columns at a time straight into
// registers, to exactly the values lowp.cpp's dequant_span gives (bf16 << 16, IEEE half,
// q * scale, q4's q * d then + m: two roundings, never one FMA), so a torch model holding the
// dequantized weights stays the reference; each is multiplied into one fp32 vector
// accumulator per row, kGemvRows rows per pass sharing the loads of x.  The rows are split
// over the pool; a row's sum is the same chain wherever it lands (the same bits for any
// thread count).  fp32 weights need no such kernel: pk::linear_fwd's one-row path is
// already a dot-product GEMV (8 rows of w per pass, gemm.cpp's gemm_dot).
// x86 with AVX2 + FMA + F16C dequantizes in registers; every other target dequantizes a
// block into a stack buffer and runs the simd.h vectors over it.
#include <cstdint>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "half.h"
#include "simd.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PK_GEMV_AVX2 1
#else
#define PK_GEMV_AVX2 0
#endif

namespace pk {

namespace {

constexpr i64 kGemvBlock = 32;  // columns per pass: one q4 block
constexpr int kGemvRows = 4;

struct LowpView {
  const uint8_t* w;
  const float* scale;  // i8: [rows]; q4: [rows * cols / 32][2] = (d, m)
  i64 cols;
};

// q * d rounded on its own (the + m that follows must not fuse with it into an FMA)
inline float q4_times_d(float q, float d) {
  float p = q * d;
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(p));
#elif defined(__aarch64__)
  asm("" : "+w"(p));
#else
  volatile float v = p;
  p = v;
#endif
  return p;
}

// out[0, n) = dequant(w)[row, c0 : c0 + n] (F: PockDecWeight.format), as lowp.cpp's dequant_span
template <int F>
void deq_span(const LowpView& w, i64 row, i64 c0, i64 n, float* out) {
  const i64 K = w.cols;
  if (F == 1) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(w.w) + row * K + c0;
    for (i64 i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  } else if (F == 2) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(w.w) + row * K + c0;
    for (i64 i = 0; i < n; ++i) out[i] = f16_to_f32(src[i]);
  } else if (F == 3) {
    const int8_t* src = reinterpret_cast<const int8_t*>(w.w) + row * K + c0;
    const float s = w.scale[row];
    for (i64 i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]) * s;
  } else {  // q4: whole blocks (K % 32 == 0, c0 % 32 == 0)
    for (i64 i = 0; i < n; i += 32) {
      const i64 b = (row * K + c0 + i) / 32;
      const uint8_t* bytes = w.w + b * 16;
      const float d = w.scale[2 * b], m = w.scale[2 * b + 1];
      for (int j = 0; j < 16; ++j) out[i + j] = q4_times_d(static_cast<float>(bytes[j] & 15), d) + m;
      for (int j = 0; j < 16; ++j) out[i + 16 + j] = q4_times_d(static_cast<float>(bytes[j] >> 4), d) + m;
    }
  }
}

#if PK_GEMV_AVX2
// dequant(w)[row, k : k + 32] as four vectors of 8
template <int F>
inline void deq32(const LowpView& w, i64 row, i64 k, __m256 out[4]) {
  const i64 K = w.cols;
  if (F == 1) {
    const __m128i* src = reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w.w) + row * K + k);
    for (int g = 0; g < 4; ++g)
      out[g] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(src + g)), 16));
  } else if (F == 2) {
    const __m128i* src = reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w.w) + row * K + k);
    for (int g = 0; g < 4; ++g) out[g] = _mm256_cvtph_ps(_mm_loadu_si128(src + g));
  } else if (F == 3) {
    const int8_t* src = reinterpret_cast<const int8_t*>(w.w) + row * K + k;
    const __m256 s = _mm256_set1_ps(w.scale[row]);
    for (int g = 0; g < 4; ++g) {
      const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * g));
      out[g] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8)), s);
    }
  } else {
    const i64 b = (row * K + k) / 32;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.w + b * 16)), nib = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, nib), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), nib);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256 d = _mm256_set1_ps(w.scale[2 * b]), m = _mm256_set1_ps(w.scale[2 * b + 1]);
    for (int g = 0; g < 4; ++g) {
      __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[g])), d);
      asm("" : "+x"(p));  // two roundings, as dequant_span
      out[g] = _mm256_add_ps(p, m);
    }
  }
}

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// y[n0 .. n0 + R) = dequant(w)[n0 .. n0 + R) x (+ b)
template <int F, int R>
void gemv_rows(const LowpView& w, const float* x, const float* b, float* y, i64 n0) {
  const i64 K = w.cols, kb = K / kGemvBlock * kGemvBlock;
  float sum[R];
#if PK_GEMV_AVX2
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (i64 k = 0; k < kb; k += kGemvBlock) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8), x2 = _mm256_loadu_ps(x + k + 16),
                 x3 = _mm256_loadu_ps(x + k + 24);
    for (int r = 0; r < R; ++r) {
      __m256 wv[4];
      deq32<F>(w, n0 + r, k, wv);
      acc[r] = _mm256_fmadd_ps(wv[0], x0, acc[r]);
      acc[r] = _mm256_fmadd_ps(wv[1], x1, acc[r]);
      acc[r] = _mm256_fmadd_ps(wv[2], x2, acc[r]);
      acc[r] = _mm256_fmadd_ps(wv[3], x3, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) sum[r] = hsum(acc[r]);
#else
  using namespace simd;
  V acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  alignas(64) float wb[kGemvBlock];
  for (i64 k = 0; k < kb; k += kGemvBlock)
    for (int r = 0; r < R; ++r) {
      deq_span<F>(w, n0 + r, k, kGemvBlock, wb);
      for (int j = 0; j < kGemvBlock; j += kW) acc[r] = vfma(vload(wb + j), vload(x + k + j), acc[r]);
    }
  for (int r = 0; r < R; ++r) sum[r] = vsum(acc[r]);
#endif
  if (kb < K) {  // the columns past the last whole block (never for q4)
    float wb[kGemvBlock];
    for (int r = 0; r < R; ++r) {
      deq_span<F>(w, n0 + r, kb, K - kb, wb);
      for (i64 k = kb; k < K; ++k) sum[r] += wb[k - kb] * x[k];
    }
  }
  for (int r = 0; r < R; ++r) y[n0 + r] = b ? sum[r] + b[n0 + r] : sum[r];
}

template <int F>
void gemv_lowp_f(const LowpView& w, const float* x, const float* b, float* y, i64 rows) {
  auto run = [&](i64 r0, i64 r1) {
    i64 n = r0;
    for (; n + kGemvRows <= r1; n += kGemvRows) gemv_rows<F, kGemvRows>(w, x, b, y, n);
    for (; n < r1; ++n) gemv_rows<F, 1>(w, x, b, y, n);
  };
  const i64 grain = (grain_for_work(w.cols, kMinChunkMacs) + kGemvRows - 1) / kGemvRows * kGemvRows;
  parallel_for(rows, grain, run);
}

}  // namespace

// y[N] = dequant(w)[N, K] x[K] + b[N]  (b nullable)
void gemv_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y, i64 N,
               i64 K) {
  const LowpView v{static_cast<const uint8_t*>(w), scale, K};
  switch (dt) {  // F: PockDecWeight.format (1 bf16, 2 fp16, 3 int8, 4 q4)
    case LowpDtype::BF16: return gemv_lowp_f<1>(v, x, b, y, N);
    case LowpDtype::F16: return gemv_lowp_f<2>(v, x, b, y, N);
    case LowpDtype::I8: return gemv_lowp_f<3>(v, x, b, y, N);
    default: return gemv_lowp_f<4>(v, x, b, y, N);
  }
}

}  // namespace pk

