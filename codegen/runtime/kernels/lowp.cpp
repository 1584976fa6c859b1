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
// The weight is never materialised in fp32 as a whole: the products run over
// panels of output channels, each panel dequantized into a per-thread scratch
// buffer (kPanelFloats floats, allocated once per thread on first use) and
// multiplied by gemm.cpp. Dequantization is exact (every format widens to fp32
// without rounding), so a torch model holding the rounded weights in fp32 is
// the reference. The forward applies bias and the fused activation per panel.
#include <cstring>
#include <vector>

#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {
namespace detail {
void gemm_strided(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                  i64 M, i64 N, i64 K, bool accumulate);
void gemm_strided_bias_act(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C,
                           i64 ldc, i64 M, i64 N, i64 K, const float* bias, Act act);
}  // namespace detail

namespace {

constexpr i64 kPanelFloats = i64(1) << 16;  // 256 KiB of dequantized weight per panel

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

// out[r, 0:K] = dequant(w row n0 + r), r < rows
void dequant_rows(const void* w, LowpDtype dt, const float* scale, i64 n0, i64 rows, i64 K, float* out) {
  auto run = [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const i64 n = n0 + r;
      float* o = out + r * K;
      if (dt == LowpDtype::BF16) {
        const uint16_t* src = static_cast<const uint16_t*>(w) + n * K;
        for (i64 k = 0; k < K; ++k) o[k] = bf16_to_f32(src[k]);
      } else if (dt == LowpDtype::F16) {
        const uint16_t* src = static_cast<const uint16_t*>(w) + n * K;
        for (i64 k = 0; k < K; ++k) o[k] = f16_to_f32(src[k]);
      } else if (dt == LowpDtype::I8) {
        const int8_t* src = static_cast<const int8_t*>(w) + n * K;
        const float s = scale[n];
        for (i64 k = 0; k < K; ++k) o[k] = static_cast<float>(src[k]) * s;
      } else {  // Q4
        const uint8_t* src = static_cast<const uint8_t*>(w) + n * (K / 2);
        const float* dm = scale + n * (K / 32) * 2;
        for (i64 b = 0; b < K / 32; ++b) {
          const float d = dm[2 * b], m = dm[2 * b + 1];
          for (int j = 0; j < 16; ++j) {
            const uint8_t byte = src[b * 16 + j];
            // two roundings, as quant.dequantize: the product is a statement of its own so no
            // compiler contracts it with the add into an FMA
            const float lo = static_cast<float>(byte & 15) * d;
            const float hi = static_cast<float>(byte >> 4) * d;
            o[b * 32 + j] = lo + m;
            o[b * 32 + j + 16] = hi + m;
          }
        }
      }
    }
  };
  if (rows * K >= (i64(1) << 15))
    parallel_for(rows, 4, run);
  else
    run(0, rows);
}

float* panel_buffer(i64 floats) {
  thread_local std::vector<float> buf;
  if (static_cast<i64>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

i64 panel_rows(i64 N, i64 K) {
  i64 rows = K > 0 ? kPanelFloats / K : N;
  if (rows < 16) rows = 16;
  return rows < N ? rows : N;
}

}  // namespace

// y[M,N] = act(x[M,K] @ dequant(w)[N,K]^T + b[N])
void linear_fwd_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                     i64 M, i64 N, i64 K, Act act) {
  const i64 P = panel_rows(N, K);
  float* panel = panel_buffer(P * K);
  for (i64 n0 = 0; n0 < N; n0 += P) {
    const i64 rows = N - n0 < P ? N - n0 : P;
    dequant_rows(w, dt, scale, n0, rows, K, panel);
    detail::gemm_strided_bias_act(x, K, 1, panel, /*b_rs=*/1, /*b_cs=*/K, y + n0, /*ldc=*/N, M, rows, K,
                                  b ? b + n0 : nullptr, act);
  }
}

// dx[M,K] = dy[M,N] @ dequant(w)[N,K], summed over panels of N in order
void linear_bwd_input_lowp(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                           i64 N, i64 K) {
  const i64 P = panel_rows(N, K);
  float* panel = panel_buffer(P * K);
  for (i64 n0 = 0; n0 < N; n0 += P) {
    const i64 rows = N - n0 < P ? N - n0 : P;
    dequant_rows(w, dt, scale, n0, rows, K, panel);
    detail::gemm_strided(dy + n0, /*a_rs=*/N, /*a_cs=*/1, panel, /*b_rs=*/K, /*b_cs=*/1, dx, /*ldc=*/K, M, K,
                         rows, /*accumulate=*/n0 > 0);
  }
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
        dequant_rows(w, dt, scale, idx[i], 1, D, y + i * D);
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
