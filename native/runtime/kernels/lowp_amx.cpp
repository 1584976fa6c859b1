// lowp_amx.cpp — compute_dtype="bf16" products on x86 CPUs with AMX (AMX-TILE + AMX-BF16: Sapphire
// Rapids and later Xeons), chosen at run time (cpuid, and Linux's permission for the tile data:
// arch_prctl(ARCH_REQ_XCOMP_PERM)); lowp_dot.cpp's bf16_dp_gemm takes this path when
// bf16_amx_available(), VDPBF16PS otherwise.
//
// TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a 16 x (16 x 2) tile of B, pairs along the depth,
// into a 16 x 16 fp32 tile (8192 multiply-adds an instruction): exactly lowp_dot.cpp's panels (a
// row of 32 dwords per depth pair, each dword a column's pair), read 16 pairs x 16 columns at a
// time with a 128-byte row stride.  A is copied per call with its depth padded with zeros to a
// multiple of 32 and its rows to a multiple of 32; C is computed 32 x 32 at a time in four tiles
// (two of A, two of B: all eight tile registers), each element's products added in depth order
// in its own fp32 accumulator (Intel's definition: exact products, the even element's then the odd
// one's, round-to-nearest-even, denormals read as zero and flushed; the packers and lowp.cpp keep
// subnormal operands off this path), so the result does not depend on the tiling or the threads.
//
// POCK_EMULATE_AMX (tests only: tests/native/runtime/test_kernels_lowp_dp.py) runs the six tile
// instructions as their definitions in C++ on per-thread tile registers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gemm_detail.h"
#include "pock_kernels.h"
#include "pock_parallel.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pk {
namespace detail {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

namespace {

constexpr i64 kPanelCols = 32;  // lowp_dot.cpp's panel width (kDpCols)
constexpr i64 kBlock = 32;      // rows and columns of C per block: a 2 x 2 of 16 x 16 tiles

// The tile configuration: palette 1, eight tiles of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

#if defined(POCK_EMULATE_AMX)
#define PK_AMX
thread_local uint8_t tmm[8][16][64];
inline float bf16_value(uint16_t h) {  // denormals read as zero
  const uint32_t b = (h & 0x7f80u) ? static_cast<uint32_t>(h) << 16 : static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline float ftz(float f) { return std::fabs(f) < 1.17549435e-38f ? std::copysign(0.0f, f) : f; }
#define PK_TILE_CONFIG(cfg) ((void)(cfg))
#define PK_TILE_RELEASE() ((void)0)
#define PK_TILE_ZERO(t) std::memset(tmm[t], 0, sizeof tmm[t])
#define PK_TILE_LOAD(t, base, stride) \
  for (int r_ = 0; r_ < 16; ++r_) std::memcpy(tmm[t][r_], reinterpret_cast<const uint8_t*>(base) + r_ * (stride), 64)
#define PK_TILE_STORE(t, base, stride) \
  for (int r_ = 0; r_ < 16; ++r_) std::memcpy(reinterpret_cast<uint8_t*>(base) + r_ * (stride), tmm[t][r_], 64)
#define PK_TILE_DP(c, a, b) tile_dp(c, a, b)
void tile_dp(int c, int a, int b) {  // TDPBF16PS as Intel defines it
  for (int m = 0; m < 16; ++m) {
    float acc[16];
    std::memcpy(acc, tmm[c][m], 64);
    for (int k = 0; k < 16; ++k) {
      uint16_t av[2], bv[32];
      std::memcpy(av, tmm[a][m] + 4 * k, 4);
      std::memcpy(bv, tmm[b][k], 64);
      for (int n = 0; n < 16; ++n) {
        acc[n] = ftz(acc[n] + bf16_value(av[0]) * bf16_value(bv[2 * n]));
        acc[n] = ftz(acc[n] + bf16_value(av[1]) * bf16_value(bv[2 * n + 1]));
      }
    }
    std::memcpy(tmm[c][m], acc, 64);
  }
}
bool detect_amx() { return true; }
#else
#define PK_AMX __attribute__((target("amx-tile,amx-bf16")))
#define PK_TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define PK_TILE_RELEASE() _tile_release()
#define PK_TILE_ZERO(t) _tile_zero(t)
#define PK_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define PK_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define PK_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
bool detect_amx() {
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
  // Linux enables the tile data state per process on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

// C[0, rows) x [0, nc) = the 32 x 32 block at A (32 rows, row stride ld u16, depth 2 * pairs) .
// one panel (pairs rows of 32 dwords)
PK_AMX void amx_block(const uint16_t* A, i64 ld, const uint32_t* panel, i64 pairs, float* C, i64 ldc, i64 rows,
                      i64 nc) {
  alignas(64) float tile[kBlock * kBlock];
  PK_TILE_ZERO(0);
  PK_TILE_ZERO(1);
  PK_TILE_ZERO(2);
  PK_TILE_ZERO(3);
  for (i64 p = 0; p < pairs; p += 16) {
    PK_TILE_LOAD(4, A + 2 * p, ld * 2);
    PK_TILE_LOAD(5, A + 16 * ld + 2 * p, ld * 2);
    PK_TILE_LOAD(6, panel + p * kPanelCols, kPanelCols * 4);
    PK_TILE_LOAD(7, panel + p * kPanelCols + 16, kPanelCols * 4);
    PK_TILE_DP(0, 4, 6);
    PK_TILE_DP(1, 4, 7);
    PK_TILE_DP(2, 5, 6);
    PK_TILE_DP(3, 5, 7);
  }
  PK_TILE_STORE(0, tile, kBlock * 4);
  PK_TILE_STORE(1, tile + 16, kBlock * 4);
  PK_TILE_STORE(2, tile + 16 * kBlock, kBlock * 4);
  PK_TILE_STORE(3, tile + 16 * kBlock + 16, kBlock * 4);
  for (i64 r = 0; r < rows; ++r) std::memcpy(C + r * ldc, tile + r * kBlock, sizeof(float) * static_cast<size_t>(nc));
}

PK_AMX void amx_columns(const uint16_t* Ap, i64 ld, i64 M, const uint32_t* panels, i64 R, i64 pairs, float* C, i64 ldc,
                        i64 b0, i64 b1) {
  static const TileConfig config;
  PK_TILE_CONFIG(&config);
  for (i64 blk = b0; blk < b1; ++blk) {
    const i64 j = blk * kPanelCols, nc = std::min<i64>(kPanelCols, R - j);
    for (i64 i = 0; i < M; i += kBlock)
      amx_block(Ap + i * ld, ld, panels + blk * pairs * kPanelCols, pairs, C + i * ldc + j, ldc,
                std::min<i64>(kBlock, M - i), nc);
  }
  PK_TILE_RELEASE();
}

struct ScratchAmxA {};

}  // namespace

bool bf16_amx_available() {
  static const bool has = detect_amx();
  return has;
}

void bf16_amx_gemm(const uint16_t* A, i64 lda, i64 M, const uint32_t* panels, i64 R, i64 D, i64 pairs, float* C,
                   i64 ldc) {
  // A with its rows padded to a multiple of 32 and its depth to 2 * pairs (a multiple of 32), zeros
  const i64 ld = 2 * pairs, Mp = (M + kBlock - 1) / kBlock * kBlock, n = (D + 1) / 2 * 2;
  uint16_t* Ap = reinterpret_cast<uint16_t*>(thread_scratch<ScratchAmxA>((Mp * ld + 1) / 2));
  for (i64 i = 0; i < Mp; ++i) {
    uint16_t* row = Ap + i * ld;
    if (i < M) std::memcpy(row, A + i * lda, sizeof(uint16_t) * static_cast<size_t>(n));
    std::memset(row + (i < M ? n : 0), 0, sizeof(uint16_t) * static_cast<size_t>(ld - (i < M ? n : 0)));
  }
  const i64 blocks = (R + kPanelCols - 1) / kPanelCols;
  parallel_for(blocks, grain_for_work(kPanelCols * Mp * ld, kMinChunkMacs),
               [&](i64 b0, i64 b1) { amx_columns(Ap, ld, M, panels, R, pairs, C, ldc, b0, b1); });
}

#else  // no AMX in this build

bool bf16_amx_available() { return false; }
void bf16_amx_gemm(const uint16_t*, i64, i64, const uint32_t*, i64, i64, i64, float*, i64) {}

#endif

}  // namespace detail
}  // namespace pk
