// gemm.cpp — pk::gemm, a cache-blocked single-precision GEMM.
//
// Portable C++17 (no intrinsics): the micro-kernel works on a fixed MR x NR
// tile with compile-time trip counts and a fully unrolled row loop, so that at
// -O2 the compiler vectorises the column loop (GCC's "very cheap" vectoriser
// needs a trip count that is a known multiple of the vector width) and keeps
// all MR x NR accumulators in registers across the depth loop.  Operands are packed into bounded stack
// buffers (no heap allocation):
//   * B is packed per [KC x NC] block into NR-wide column panels,
//   * A is packed per [MC x KC] block into MR-tall row panels,
// both zero-padded at the edges, so the micro-kernel never needs bounds checks
// and any transposition is absorbed by the packing routines.
#include <cstring>

#include "pock_kernels.h"

namespace pk {
namespace {

// Micro-tile: kMR rows (broadcast A values) x kNR columns (vector lanes of
// B / C).  The kMR * kNR accumulators must fit in the vector register file,
// so the tile follows the target's vector width (plain predefined macros).
#if defined(PK_GEMM_MR) && defined(PK_GEMM_NR)
constexpr int kMR = PK_GEMM_MR, kNR = PK_GEMM_NR;
#elif defined(__AVX512F__)
constexpr int kMR = 12, kNR = 32;  // 24 accumulators, 32 zmm registers
#elif defined(__AVX__)
constexpr int kMR = 6, kNR = 16;   // 12 accumulators, 16 ymm registers
#elif defined(__aarch64__)
constexpr int kMR = 8, kNR = 12;   // 24 accumulators, 32 NEON q registers
#else
constexpr int kMR = 4, kNR = 8;    // 8 accumulators, 16 SSE registers
#endif
#ifndef PK_GEMM_KC  // block sizes (overridable for tuning)
#define PK_GEMM_KC 128
#define PK_GEMM_MC 24
#define PK_GEMM_NC 96
#endif
constexpr i64 kKC = PK_GEMM_KC;  // depth of one packed block
constexpr i64 kMC = (PK_GEMM_MC + kMR - 1) / kMR * kMR;  // rows of A per packed block
constexpr i64 kNC = (PK_GEMM_NC + kNR - 1) / kNR * kNR;  // columns of B per packed block
static_assert((kMC + kNC) * kKC * sizeof(float) <= 64 * 1024, "packing buffers must stay small (stack)");

// A view of a row-major matrix that may be read transposed: element (r, c) of
// op(X) lives at base[r * rs + c * cs].
struct MatView {
  const float* base;
  i64 rs, cs;
};

// Pack rows [i0, i0+mc) x depth [k0, k0+kc) of op(A) into MR-row panels:
// panel p holds, for each k, the MR values op(A)[i0+p*MR+r][k0+k] (zero-padded).
void pack_a(const MatView& a, i64 i0, i64 mc, i64 k0, i64 kc, float* __restrict out) {
  for (i64 p = 0; p < mc; p += kMR) {
    const i64 rows = mc - p < kMR ? mc - p : kMR;
    float* dst = out + p * kc;
    if (a.cs == 1 && rows == kMR) {
      // op(A) row-major: gather MR rows, one k at a time.
      const float* src = a.base + (i0 + p) * a.rs + k0;
      for (i64 k = 0; k < kc; ++k)
        for (int r = 0; r < kMR; ++r) dst[k * kMR + r] = src[r * a.rs + k];
    } else if (a.rs == 1 && rows == kMR) {
      // op(A) stored transposed: MR contiguous values per k.
      const float* src = a.base + (i0 + p) + k0 * a.cs;
      for (i64 k = 0; k < kc; ++k)
        for (int r = 0; r < kMR; ++r) dst[k * kMR + r] = src[k * a.cs + r];
    } else {
      for (i64 k = 0; k < kc; ++k)
        for (int r = 0; r < kMR; ++r)
          dst[k * kMR + r] = r < rows ? a.base[(i0 + p + r) * a.rs + (k0 + k) * a.cs] : 0.0f;
    }
  }
}

// Pack depth [k0, k0+kc) x columns [j0, j0+nc) of op(B) into NR-column panels:
// panel p holds, for each k, the NR values op(B)[k0+k][j0+p*NR+j] (zero-padded).
void pack_b(const MatView& b, i64 k0, i64 kc, i64 j0, i64 nc, float* __restrict out) {
  for (i64 p = 0; p < nc; p += kNR) {
    const i64 cols = nc - p < kNR ? nc - p : kNR;
    float* dst = out + p * kc;
    if (b.cs == 1 && cols == kNR) {
      const float* src = b.base + k0 * b.rs + (j0 + p);
      for (i64 k = 0; k < kc; ++k) std::memcpy(dst + k * kNR, src + k * b.rs, sizeof(float) * kNR);
    } else if (b.rs == 1 && cols == kNR) {
      // op(B) stored transposed ([N, K]): column j is a contiguous row of B.
      const float* src = b.base + k0 + (j0 + p) * b.cs;
      for (i64 k = 0; k < kc; ++k)
        for (int j = 0; j < kNR; ++j) dst[k * kNR + j] = src[j * b.cs + k];
    } else {
      for (i64 k = 0; k < kc; ++k)
        for (int j = 0; j < kNR; ++j)
          dst[k * kNR + j] = j < cols ? b.base[(k0 + k) * b.rs + (j0 + p + j) * b.cs] : 0.0f;
    }
  }
}

// C[0:mr, 0:nr] (row stride ldc) = beta * C + Apanel @ Bpanel, where beta == 0
// overwrites without reading C (so NaN/garbage in C never leaks).
// a: kc x MR packed, b: kc x NR packed.  The full MR x NR tile is always
// computed (padding is zero); only the valid mr x nr part is written.
void micro_kernel(i64 kc, const float* __restrict a, const float* __restrict b, float* __restrict c,
                  i64 ldc, int mr, int nr, float beta) {
  float acc[kMR][kNR];
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc[r][j] = 0.0f;
  for (i64 k = 0; k < kc; ++k) {
    const float* __restrict bk = b + k * kNR;
    const float* __restrict ak = a + k * kMR;
    // Fully unrolled so that each accumulator row stays in registers.
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const float ar = ak[r];
      for (int j = 0; j < kNR; ++j) acc[r][j] += ar * bk[j];
    }
  }
  if (mr == kMR && nr == kNR) {
    for (int r = 0; r < kMR; ++r) {
      float* __restrict cr = c + r * ldc;
      if (beta == 0.0f)
        for (int j = 0; j < kNR; ++j) cr[j] = acc[r][j];
      else if (beta == 1.0f)
        for (int j = 0; j < kNR; ++j) cr[j] += acc[r][j];
      else
        for (int j = 0; j < kNR; ++j) cr[j] = beta * cr[j] + acc[r][j];
    }
  } else {
    for (int r = 0; r < mr; ++r) {
      float* cr = c + r * ldc;
      for (int j = 0; j < nr; ++j) cr[j] = beta == 0.0f ? acc[r][j] : beta * cr[j] + acc[r][j];
    }
  }
}

// Reader-based packing (implicit GEMM): `read` fills out[r*ld + c] with rows
// [r0, r0+rows) x columns [c0, c0+cols) of a logical matrix.  The A reader
// reads op(A)^T ([K, M]); the B reader reads op(B) ([K, N]).
using BlockReadFn = void (*)(const void* ctx, i64 r0, i64 rows, i64 c0, i64 cols, float* out, i64 ld);

void pack_a_reader(BlockReadFn read, const void* ctx, i64 i0, i64 mc, i64 k0, i64 kc, float* out) {
  for (i64 p = 0; p < mc; p += kMR) {
    const i64 rows = mc - p < kMR ? mc - p : kMR;
    float* dst = out + p * kc;
    read(ctx, k0, kc, i0 + p, rows, dst, kMR);
    for (i64 k = 0; k < kc; ++k)
      for (i64 r = rows; r < kMR; ++r) dst[k * kMR + r] = 0.0f;
  }
}

void pack_b_reader(BlockReadFn read, const void* ctx, i64 k0, i64 kc, i64 j0, i64 nc, float* out) {
  for (i64 p = 0; p < nc; p += kNR) {
    const i64 cols = nc - p < kNR ? nc - p : kNR;
    float* dst = out + p * kc;
    read(ctx, k0, kc, j0 + p, cols, dst, kNR);
    for (i64 k = 0; k < kc; ++k)
      for (i64 j = cols; j < kNR; ++j) dst[k * kNR + j] = 0.0f;
  }
}

// One product C[M,N] (row stride ldc) = op(A) @ op(B) + beta * C,
// blocked as: column blocks (NC) > depth blocks (KC, B packed) > row blocks
// (MC, A packed) > NR x MR micro-tiles.  pack_a(i0, mc, k0, kc, out) and
// pack_b(k0, kc, j0, nc, out) fill the packed panels.
template <class PackA, class PackB>
void gemm_core(const PackA& pack_a, const PackB& pack_b, float* c, i64 ldc, i64 M, i64 N, i64 K, float beta) {
  if (K == 0) {
    if (beta != 1.0f)
      for (i64 i = 0; i < M; ++i)
        for (i64 j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  alignas(64) float a_pack[kMC * kKC];
  alignas(64) float b_pack[kNC * kKC];
  for (i64 j0 = 0; j0 < N; j0 += kNC) {
    const i64 nc = N - j0 < kNC ? N - j0 : kNC;
    for (i64 k0 = 0; k0 < K; k0 += kKC) {
      const i64 kc = K - k0 < kKC ? K - k0 : kKC;
      const float block_beta = k0 == 0 ? beta : 1.0f;  // later depth blocks accumulate
      pack_b(k0, kc, j0, nc, b_pack);
      for (i64 i0 = 0; i0 < M; i0 += kMC) {
        const i64 mc = M - i0 < kMC ? M - i0 : kMC;
        pack_a(i0, mc, k0, kc, a_pack);
        for (i64 jr = 0; jr < nc; jr += kNR) {
          const int nr = static_cast<int>(nc - jr < kNR ? nc - jr : kNR);
          for (i64 ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(mc - ir < kMR ? mc - ir : kMR);
            micro_kernel(kc, a_pack + ir * kc, b_pack + jr * kc, c + (i0 + ir) * ldc + (j0 + jr), ldc, mr, nr,
                         block_beta);
          }
        }
      }
    }
  }
}

void gemm_views(const MatView& a, const MatView& b, float* c, i64 ldc, i64 M, i64 N, i64 K, float beta) {
  gemm_core([&](i64 i0, i64 mc, i64 k0, i64 kc, float* out) { pack_a(a, i0, mc, k0, kc, out); },
            [&](i64 k0, i64 kc, i64 j0, i64 nc, float* out) { pack_b(b, k0, kc, j0, nc, out); }, c, ldc, M, N, K,
            beta);
}

}  // namespace

// Entry points for other kernels of this library (conv2d.cpp, linear.cpp
// declare them where used; not part of the public contract).
namespace detail {
// op(A)[i][k] = A[i*a_rs + k*a_cs], op(B)[k][j] = B[k*b_rs + j*b_cs]:
// C[i][j] (at C[i*ldc + j]) = sum_k op(A)[i][k] op(B)[k][j] (+ C when accumulate).
void gemm_strided(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                  i64 M, i64 N, i64 K, bool accumulate) {
  gemm_views(MatView{A, a_rs, a_cs}, MatView{B, b_rs, b_cs}, C, ldc, M, N, K, accumulate ? 1.0f : 0.0f);
}

// Implicit GEMM: the operands are produced block by block by reader callbacks
// (read_at reads op(A)^T [K, M], read_b reads op(B) [K, N]); e.g. a
// convolution's im2col matrix generated on the fly without any scratch.
void gemm_readers(BlockReadFn read_at, const void* at_ctx, BlockReadFn read_b, const void* b_ctx, float* C,
                  i64 ldc, i64 M, i64 N, i64 K, bool accumulate) {
  gemm_core([&](i64 i0, i64 mc, i64 k0, i64 kc, float* out) { pack_a_reader(read_at, at_ctx, i0, mc, k0, kc, out); },
            [&](i64 k0, i64 kc, i64 j0, i64 nc, float* out) { pack_b_reader(read_b, b_ctx, k0, kc, j0, nc, out); },
            C, ldc, M, N, K, accumulate ? 1.0f : 0.0f);
}
}  // namespace detail

// Batched C_b = op(A_b) @ op(B_b) + beta * C_b, batches in order (so sc = 0
// with beta = 1 sums every batch's product into one C).  The contract uses
// beta 0 (C is never read) or 1; any other beta scales C.
void gemm(const float* A, const float* B, float* C, const GemmParams& p) {
  for (i64 bi = 0; bi < p.batch; ++bi) {
    // op(A)[i][k]: A stored [M,K] (rs=K, cs=1) or [K,M] when ta (rs=1, cs=M).
    const MatView a{A + bi * p.sa, p.ta ? 1 : p.K, p.ta ? p.M : 1};
    // op(B)[k][j]: B stored [K,N] (rs=N, cs=1) or [N,K] when tb (rs=1, cs=K).
    const MatView b{B + bi * p.sb, p.tb ? 1 : p.N, p.tb ? p.K : 1};
    gemm_views(a, b, C + bi * p.sc, p.N, p.M, p.N, p.K, p.beta);
  }
}

}  // namespace pk
