// gemv.cpp — y = dequant(w) x + b for ONE row x against a frozen weight stored in low
// precision (lowp.cpp's formats): the decode step of generation (kernels/decoder.cpp).
// linear_fwd_lowp is made for many rows of x: it dequantizes w through the GEMM's packing
// reader (tiles, register transposes), which for one row of x costs several times the
// product.  Here each weight row is read 32 columns at a time straight into registers and
// multiplied into one fp32 vector accumulator per row, kGemvRows rows per pass sharing the
// loads of x.  The rows are split over the pool; a row's sum is the same chain wherever it
// lands (the same bits for any thread count).  fp32 weights need no such kernel:
// pk::linear_fwd's one-row path is already a dot-product GEMV (gemm.cpp's gemm_dot).
//
// The scale factors of int8 and q4 are taken out of the inner products (as llama.cpp's
// dot products do), so a weight is never dequantized on its own:
//   int8: y[n] = s[n] * sum_k q[n, k] x[k]
//   q4:   y[n] = sum_b d_b * (q_b . x_b) + m_b * xs_b,   xs_b = the sum of x over block b
// (xs computed once per call).  This is the dequantized product reassociated, not its
// rounding chain; a one-hot x still reads the dequantized weight back bit-exactly (q * s;
// q4's q * d rounded, then + m), and a torch model holding the dequantized weights stays the
// reference within fp32 accumulation error.  bf16 and fp16 widen exactly (bf16 << 16, IEEE
// half) and multiply as they are.
// x86 with AVX2 + FMA + F16C unpacks in registers; every other target unpacks a block into a
// stack buffer (q4: the integers 0..15; the other formats: lowp.cpp's dequant_span) and runs
// the simd.h vectors over it.
#include <cstdint>
#include <cstring>
#include <vector>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "gemm_detail.h"
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
// twice the bytes of one element of w (F: PockDecWeight.format; q4: half a byte)
template <int F>
constexpr i64 kHalfBytes = F == 4 ? 1 : F == 3 ? 2 : 4;

struct LowpView {
  const uint8_t* w;
  const float* scale;  // i8: [rows]; q4: [rows * cols / 32][2] = (d, m)
  i64 cols;
  LowpDtype dt;
  const float* xs;  // q4: the sums of x over each block [cols / 32]
};

// xs[b] = sum of x[32 b : 32 b + 32]
void block_sums(const float* x, i64 K, float* xs) {
  using namespace simd;
  for (i64 b = 0; b < K / kGemvBlock; ++b) {
    V s = vzero();
    for (int j = 0; j < kGemvBlock; j += kW) s = vadd(s, vload(x + b * kGemvBlock + j));
    xs[b] = vsum(s);
  }
}

#if PK_GEMV_AVX2
// the integers w[row, k : k + 32] (q4: 0..15, not yet scaled) as four vectors of 8; bf16 and
// fp16 widened exactly (they have no scale)
template <int F>
inline void load32(const LowpView& w, i64 row, i64 k, __m256 out[4]) {
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
    for (int g = 0; g < 4; ++g)
      out[g] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * g))));
  } else {  // bytes 0..7 hold q[0..7] (low nibbles) and q[16..23] (high), bytes 8..15 the rest
    const uint8_t* src = w.w + (row * K + k) / 2;
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8)));
    const __m256i nib = _mm256_set1_epi32(15);
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, nib));
    out[1] = _mm256_cvtepi32_ps(_mm256_and_si256(c, nib));
    out[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    out[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
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
  const i64 K = w.cols, kb = K / kGemvBlock * kGemvBlock, nb = K / kGemvBlock;
  float sum[R], msum[R];  // msum: q4's sum of m_b * xs_b
  for (int r = 0; r < R; ++r) msum[r] = 0.0f;
#if PK_GEMV_AVX2
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (i64 k = 0, blk = 0; k < kb; k += kGemvBlock, ++blk) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8), x2 = _mm256_loadu_ps(x + k + 16),
                 x3 = _mm256_loadu_ps(x + k + 24);
    for (int r = 0; r < R; ++r)  // the next pass's rows, same columns (i8's head: ~2.5x faster)
      _mm_prefetch(reinterpret_cast<const char*>(w.w) + ((n0 + R + r) * K + k) * kHalfBytes<F> / 2, _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      __m256 wv[4];
      load32<F>(w, n0 + r, k, wv);
      if (F == 4) {  // d_b * (q_b . x_b), and m_b * xs_b beside it
        __m256 t = _mm256_mul_ps(wv[0], x0);
        t = _mm256_fmadd_ps(wv[1], x1, t);
        t = _mm256_fmadd_ps(wv[2], x2, t);
        t = _mm256_fmadd_ps(wv[3], x3, t);
        const float* dm = w.scale + 2 * ((n0 + r) * nb + blk);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dm[0]), t, acc[r]);
        msum[r] += dm[1] * w.xs[blk];
      } else {
        acc[r] = _mm256_fmadd_ps(wv[0], x0, acc[r]);
        acc[r] = _mm256_fmadd_ps(wv[1], x1, acc[r]);
        acc[r] = _mm256_fmadd_ps(wv[2], x2, acc[r]);
        acc[r] = _mm256_fmadd_ps(wv[3], x3, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) sum[r] = hsum(acc[r]);
#else
  using namespace simd;
  V acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  alignas(64) float wb[kGemvBlock];
  for (i64 k = 0, blk = 0; k < kb; k += kGemvBlock, ++blk)
    for (int r = 0; r < R; ++r) {
      if (F == 4) {  // the block's integers, then as the AVX2 path
        const uint8_t* src = w.w + ((n0 + r) * K + k) / 2;
        for (int j = 0; j < 16; ++j) wb[j] = static_cast<float>(src[j] & 15);
        for (int j = 0; j < 16; ++j) wb[16 + j] = static_cast<float>(src[j] >> 4);
        V t = vzero();
        for (int j = 0; j < kGemvBlock; j += kW) t = vfma(vload(wb + j), vload(x + k + j), t);
        const float* dm = w.scale + 2 * ((n0 + r) * nb + blk);
        acc[r] = vfma(vbcast(dm[0]), t, acc[r]);
        msum[r] += dm[1] * w.xs[blk];
      } else {
        detail::dequant_span(w.w, w.dt, w.scale, K, n0 + r, k, kGemvBlock, wb);
        for (int j = 0; j < kGemvBlock; j += kW) acc[r] = vfma(vload(wb + j), vload(x + k + j), acc[r]);
      }
    }
  for (int r = 0; r < R; ++r) sum[r] = vsum(acc[r]);
#endif
#if PK_GEMV_AVX2
  if (F == 3)  // int8's row scale, out of the sum
    for (int r = 0; r < R; ++r) sum[r] *= w.scale[n0 + r];
#endif
  if (kb < K) {  // the columns past the last whole block (never for q4)
    float wb[kGemvBlock];
    for (int r = 0; r < R; ++r) {
      detail::dequant_span(w.w, w.dt, w.scale, K, n0 + r, kb, K - kb, wb);
      for (i64 k = kb; k < K; ++k) sum[r] += wb[k - kb] * x[k];
    }
  }
  for (int r = 0; r < R; ++r) {
    const float s = F == 4 ? sum[r] + msum[r] : sum[r];
    y[n0 + r] = b ? s + b[n0 + r] : s;
  }
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
  LowpView v{static_cast<const uint8_t*>(w), scale, K, dt, nullptr};
  switch (dt) {  // F: PockDecWeight.format (1 bf16, 2 fp16, 3 int8, 4 q4)
    case LowpDtype::BF16: return gemv_lowp_f<1>(v, x, b, y, N);
    case LowpDtype::F16: return gemv_lowp_f<2>(v, x, b, y, N);
    case LowpDtype::I8: return gemv_lowp_f<3>(v, x, b, y, N);
    default: {
      thread_local std::vector<float> xs;  // grown once per thread, not per call
      if (xs.size() < static_cast<size_t>(K / kGemvBlock)) xs.resize(static_cast<size_t>(K / kGemvBlock));
      block_sums(x, K, xs.data());
      v.xs = xs.data();
      return gemv_lowp_f<4>(v, x, b, y, N);
    }
  }
}

}  // namespace pk
