// gemm.cpp — pk::gemm, a cache-blocked single-precision GEMM.
//
// Design:
//   * C is cut into units of [rows x nc columns] (nc up to kNCMax, so a packed
//     kKC x nc block of op(B) stays in L2 and each operand streams through
//     memory about once); units run on pk::parallel_for (large products only:
//     small ones stay on the calling thread), cut finer on several threads.
//   * Within a unit, for each depth block of kKC: op(B)[kKC x nc] is packed into
//     kNR-wide column panels (zero-padded; a transposed op(B), e.g. x @ w^T, is
//     packed through kT x kT register transposes, simd.h), then every strip of
//     up to kMR rows of op(A) is multiplied into the C tiles.  op(A) is read in
//     place when it is row-major or column-major (only reader-produced and
//     strided operands are packed), so A costs no packing traffic at all.
//     The packed block lives in a per-thread buffer allocated on first use.
//   * Small M with a row-major op(B) reads B in place too (each element is used
//     once or twice, packing would cost more than it saves), and small M with a
//     transposed op(B) (x @ w^T, e.g. an LSTM's recurrent step) uses dot
//     products along the contiguous K of both operands instead of packing B.
//   * The micro-kernel keeps an R x kNR tile of C in vector registers (R = kMR,
//     or the rows left at the bottom edge: an edge strip computes no padding
//     rows).  It is written once over the vector type of simd.h, chosen at
//     compile time: AVX-512 (__AVX512F__), AVX2+FMA (__AVX2__ && __FMA__), NEON
//     (__aarch64__), or a portable C++ struct of 4 floats that compiles everywhere.
//   * The store applies beta, then (last depth block) an optional bias per
//     column and a relu/relu6 epilogue, so linear_fwd_act needs no extra pass.
//   * Every element of C is the same chain of FMAs over k (blocks of kKC, a short
//     last one merged into the block before it, in order) whatever the tiling and the thread count: results do not depend
//     on the number of threads.
#include <atomic>
#include <cstring>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"
#include "update_math.h"
#include "gemm_detail.h"

namespace pk {

namespace {

// ------------------------------------------------------------ vector type (simd.h) and tile shape
using namespace simd;
#if defined(__AVX512F__)
constexpr int kMR = 12, kNV = 2;  // 24 accumulators of 32 zmm
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kMR = 6, kNV = 2;  // 12 accumulators of 16 ymm
#elif PK_NEON
constexpr int kMR = 8, kNV = 3;  // 24 accumulators of 32 q registers
#else
constexpr int kMR = 4, kNV = 2;  // 8 accumulators
#endif

constexpr int kNR = kNV * kW;  // micro-tile: kMR rows x kNR columns
#ifndef PK_GEMM_KC  // block sizes (overridable for tuning)
#define PK_GEMM_KC 256
#define PK_GEMM_NC 512
#endif
constexpr i64 kKC = PK_GEMM_KC;                                         // depth of one packed block
constexpr i64 kNCMax = PK_GEMM_NC / kNR > 0 ? PK_GEMM_NC / kNR * kNR : kNR;  // columns of B per block (K >= kKC)
// A shallow product (K < kKC, e.g. a weight gradient over 128 tokens) packs blocks of
// K x nc: the same kKC x kNCMax floats of L2 hold wider blocks, up to kNCCap columns, so
// fewer column blocks pack op(A) again (a packed dy^T of SmolLM2's 49152 x 576 head
// gradient: once instead of twice).
constexpr i64 kNCCap = 4 * kNCMax;
// Depth blocks of kKC, but a last block of at most kKC / 4 joins the one before it: a weight
// gradient over 288 tokens runs one block of 288, not 256 and then a 32-deep pass that loads
// and stores C again for an eighth of the work (~5% slower, AVX2, one thread).
constexpr i64 kKCMerge = kKC / 4;
inline i64 depth_block(i64 K, i64 k0) { return K - k0 <= kKC + kKCMerge ? K - k0 : kKC; }
// The deepest block depth_block gives K.
inline i64 max_depth_block(i64 K) {
  const i64 r = K % kKC;
  return K <= kKC + kKCMerge ? K : (r > 0 && r <= kKCMerge ? kKC + r : kKC);
}
i64 nc_limit(i64 K) {
  const i64 kc = K < 1 ? 1 : max_depth_block(K);
  const i64 nc = kKC * kNCMax / kc / kNR * kNR;
  return nc > kNCCap ? kNCCap : nc;
}
// Several threads: columns are cut down to this width before rows are cut.
constexpr i64 kNCMinSplit = 4 * kNR;
// Work below this many multiply-adds stays on the calling thread.
constexpr i64 kParallelMinFlops = i64(1) << 20;
// Up to this many rows, a row-major op(B) is read in place (not packed).
constexpr i64 kDirectBMaxRows = 2 * kMR;
// Up to this many rows, op(A) @ w^T uses dot products instead of packing w (overridable for
// tuning).  Measured (one thread, x @ w^T, w 10000 x 96 and 2680 x 670): dots win up to 8
// rows on AVX2 (M = 4: 0.30 vs 0.42 ms), packing from 12 (M = 16: 0.70 vs 1.11 ms).
#ifndef PK_DOT_MAX_ROWS
#define PK_DOT_MAX_ROWS 8
#endif
constexpr i64 kDotMaxRows = PK_DOT_MAX_ROWS;

// ------------------------------------------------------------ epilogue
// What the store does: first depth block C = beta*C + acc (beta 0 never reads
// C), later blocks C += acc; the last block then adds bias[j] and applies act.
struct Epi {
  float beta;
  const float* bias;  // nullable, indexed by the global column
  Act act;
  // nullable: the last block hands each finished row of a tile to upd->apply (an optimizer
  // update of the weight this gradient belongs to) instead of storing it; beta 0, no bias/act
  const UpdateEpilogue* upd = nullptr;
  const float* c0 = nullptr;  // C's base (with upd: the tile's offset in C)
  // nullable: the last block tests each stored row for a NaN/inf and sets *nonfinite
  // (the exact guard's check of a gradient, with no second pass over it)
  std::atomic<bool>* nonfinite = nullptr;
};

// The last block of a fused update: the finished row (acc, plus C's partial sums from
// the earlier depth blocks) goes to the update, never to C.
inline void store_row_update(float* c, const V* acc, int nr, bool first, const Epi& e) {
  alignas(64) float t[kNR];
  if (nr == kNR) {
    for (int v = 0; v < kNV; ++v) vstore(t + v * kW, first ? acc[v] : vadd(acc[v], vload(c + v * kW)));
  } else {
    for (int v = 0; v < kNV; ++v) vstore(t + v * kW, acc[v]);
    if (!first)
      for (int j = 0; j < nr; ++j) t[j] += c[j];
  }
  e.upd->apply(c - e.c0, t, nr);
}

inline float act_scalar(float x, Act act) {
  if (act == Act::Relu) return x < 0.0f ? 0.0f : x;  // NaN propagates
  if (act == Act::Relu6) return x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x);
  return x;
}

// Stores one vector of a row of C (its first n <= kW lanes; n is the constant kW on the
// full-tile path, so the partial loads fold away there) with the epilogue.
// col: global column of c[0] (for the bias).
__attribute__((always_inline)) inline V store_vec(float* c, V x, int n, i64 col, bool first, bool last,
                                                  const Epi& e) {
  const bool full = n == kW;
  if (!first || e.beta == 1.0f)
    x = vadd(x, full ? vload(c) : load_part(c, n));
  else if (e.beta != 0.0f)
    x = vfma(vbcast(e.beta), full ? vload(c) : load_part(c, n), x);
  if (last) {
    if (e.bias) x = vadd(x, full ? vload(e.bias + col) : load_part(e.bias + col, n));
    if (e.act == Act::Relu) x = vmax(vzero(), x);
    else if (e.act == Act::Relu6) x = vmin(vbcast(6.0f), vmax(vzero(), x));
  }
  if (full) vstore(c, x);
  else store_part(c, x, n);
  return x;
}

// Stores one row of acc (nr valid columns).  A partial tile (the last columns of C,
// e.g. a 4x4 plane's 16 columns against AVX-512's 32) stores its full vectors and a
// partial one through the same vector epilogue (scalar per column, it ran at half the
// speed of the AVX2 build on a 1x1 convolution of 16 columns).
// With e.nonfinite, the last block adds x - x of every stored full row into z (0 while
// every value is finite, NaN from the first NaN/inf: micro_kernel tests it once per tile);
// a partial row is tested as stored.
__attribute__((always_inline)) inline void store_row(float* c, const V* acc, int nr, i64 col, bool first, bool last,
                                                  const Epi& e, V& z) {
  if (last && e.upd) return store_row_update(c, acc, nr, first, e);
  const bool check = last && e.nonfinite;
  if (nr == kNR) {
    for (int v = 0; v < kNV; ++v) {
      const V x = store_vec(c + v * kW, acc[v], kW, col + v * kW, first, last, e);
      if (check) z = vadd(z, vsub(x, x));
    }
    return;
  }
  for (int v = 0; v < kNV && v * kW < nr; ++v)
    store_vec(c + v * kW, acc[v], nr - v * kW < kW ? nr - v * kW : kW, col + v * kW, first, last, e);
  if (check && upd::has_nonfinite(c, nr)) e.nonfinite->store(true, std::memory_order_relaxed);
}

// ------------------------------------------------------------ micro-kernel
// C[0:R, 0:nr] (row stride ldc) <- acc = op(A)[0:R, 0:kc] @ Bpanel[0:kc, 0:kNR].
// kRowMode: op(A)(r, k) at a[r*ars + k] (row-major strip, read in place);
// otherwise at a[k*acs + r] (a packed panel, acs = kMR, or column-major op(A)).
// b: the panel, row k at b + k*ldb (ldb = kNR when packed).
template <bool kRowMode, int R>
void micro_kernel(i64 kc, const float* __restrict a, i64 ars, i64 acs, const float* __restrict b, i64 ldb,
                  float* __restrict c, i64 ldc, int nr, i64 col, bool first, bool last, const Epi& epi) {
  // a local copy: the stores into C cannot alias it, so the epilogue's fields stay in registers
  // (through the reference they were reloaded and re-tested after every stored vector)
  const Epi e = epi;
  V acc[R][kNV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kNV; ++v) acc[r][v] = vzero();
  // row mode: rows in halves of up to 6 from two bases, so the addresses need
  // few index registers (base + {0, 1, 2, 4} * ars, 3 * ars, 5 * ars)
  const float* a_hi = a + (R > 6 ? 6 : 0) * ars;
  for (i64 k = 0; k < kc; ++k) {
    V bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = vload(b + k * ldb + v * kW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const V ar = vbcast(kRowMode ? (r < 6 ? a : a_hi)[(r < 6 ? r : r - 6) * ars + k] : a[k * acs + r]);
      for (int v = 0; v < kNV; ++v) acc[r][v] = vfma(ar, bv[v], acc[r][v]);
    }
  }
  V z = vzero();
  for (int r = 0; r < R; ++r) store_row(c + r * ldc, acc[r], nr, col, first, last, e, z);
  if (last && e.nonfinite) {
    const float s = vsum(z);
    if (upd::has_nonfinite(&s, 1)) e.nonfinite->store(true, std::memory_order_relaxed);
  }
}

// micro_kernel for a strip of `rows` (1..kMR) rows.
template <bool kRowMode, int R = kMR>
inline void micro_rows(int rows, i64 kc, const float* a, i64 ars, i64 acs, const float* b, i64 ldb, float* c, i64 ldc,
                       int nr, i64 col, bool first, bool last, const Epi& e) {
  if constexpr (R > 1) {
    if (rows < R) return micro_rows<kRowMode, R - 1>(rows, kc, a, ars, acs, b, ldb, c, ldc, nr, col, first, last, e);
  }
  micro_kernel<kRowMode, R>(kc, a, ars, acs, b, ldb, c, ldc, nr, col, first, last, e);
}

// ------------------------------------------------------------ operands
// A view of a row-major matrix that may be read transposed: element (r, c) of
// op(X) lives at base[r * rs + c * cs].
struct MatView {
  const float* base;
  i64 rs, cs;
};

// Reader-based operands (implicit GEMM, gemm_detail.h): the A reader reads op(A)^T
// ([K, M]); the B reader reads op(B) ([K, N]).
using detail::BlockReadFn;

// Pack depth [k0, k0+kc) x columns [j0, j0+cols) (cols <= kNR) of op(B) into one
// zero-padded kNR-wide panel (row k at out + k*kNR).
void pack_b_panel(const MatView& b, i64 k0, i64 kc, i64 j0, i64 cols, float* __restrict out) {
  if (b.cs == 1 && cols == kNR) {
    const float* src = b.base + k0 * b.rs + j0;
    for (i64 k = 0; k < kc; ++k)
      for (int v = 0; v < kNV; ++v) vstore(out + k * kNR + v * kW, vload(src + k * b.rs + v * kW));
  } else if (b.cs == 1) {  // the last, partial panel of a row-major op(B): vectors, a partial one, zeros
    const float* src = b.base + k0 * b.rs + j0;
    const int nv = static_cast<int>(cols / kW), rem = static_cast<int>(cols % kW);
    for (i64 k = 0; k < kc; ++k) {
      const float* s = src + k * b.rs;
      float* o = out + k * kNR;
      int v = 0;
      for (; v < nv; ++v) vstore(o + v * kW, vload(s + v * kW));
      if (rem > 0) vstore(o + v * kW, load_part(s + v * kW, rem)), ++v;
      for (; v < kNV; ++v) vstore(o + v * kW, vzero());
    }
  } else if (b.rs == 1) {
    // op(B) stored transposed ([N, K]): column j is a contiguous row of B;
    // kT x kT tiles are transposed in registers.
    transpose_copy(b.base + k0 + j0 * b.cs, b.cs, kc, cols, out, kNR);
    if (cols < kNR)
      for (i64 k = 0; k < kc; ++k)
        for (i64 j = cols; j < kNR; ++j) out[k * kNR + j] = 0.0f;
  } else {
    for (i64 k = 0; k < kc; ++k)
      for (i64 j = 0; j < kNR; ++j)
        out[k * kNR + j] = j < cols ? b.base[(k0 + k) * b.rs + (j0 + j) * b.cs] : 0.0f;
  }
}

// Pack rows [i0, i0+rows) x depth [k0, k0+kc) of op(A) into one zero-padded
// kMR-row panel (element (r, k) at out[k*kMR + r]).
void pack_a_panel(const MatView& a, i64 i0, i64 rows, i64 k0, i64 kc, float* __restrict out) {
  for (i64 k = 0; k < kc; ++k)
    for (int r = 0; r < kMR; ++r)
      out[k * kMR + r] = r < rows ? a.base[(i0 + r) * a.rs + (k0 + k) * a.cs] : 0.0f;
}

// Pack a column-major strip (rows <= kMR, element (r, k) at a[k*cs + r]) into a
// zero-padded kMR-row panel: out[k*kMR + r].
void pack_a_cols(const float* __restrict a, i64 cs, i64 rows, i64 kc, float* __restrict out) {
  if (rows == kMR) {
    for (i64 k = 0; k < kc; ++k)
      for (int r = 0; r < kMR; ++r) out[k * kMR + r] = a[k * cs + r];
    return;
  }
  for (i64 k = 0; k < kc; ++k)
    for (int r = 0; r < kMR; ++r) out[k * kMR + r] = r < rows ? a[k * cs + r] : 0.0f;
}

// Operands given as strided views.
struct ViewOps {
  MatView a, b;
  // op(A) strip [i0, i0+rows) x [k0, k0+kc): in place when possible, else packed into buf.
  // Returns the pointer and sets the strides and mode for micro_kernel.
  const float* a_strip(i64 i0, i64 rows, i64 k0, i64 kc, float* buf, i64& ars, i64& acs, bool& row_mode) const {
    if (a.cs == 1) {
      row_mode = true, ars = a.rs, acs = 1;
      return a.base + i0 * a.rs + k0;
    }
    if (a.rs == 1 && a.cs <= detail::kColMajorInPlace) {
      row_mode = false, ars = 1, acs = a.cs;
      return a.base + i0 + k0 * a.cs;
    }
    if (a.rs == 1) {  // column-major with a long stride (dy^T of a weight gradient): copy kMR floats per k
      pack_a_cols(a.base + i0 + k0 * a.cs, a.cs, rows, kc, buf);
      row_mode = false, ars = 1, acs = kMR;
      return buf;
    }
    pack_a_panel(a, i0, rows, k0, kc, buf);
    row_mode = false, ars = 1, acs = kMR;
    return buf;
  }
  // Whether a_strip copies (packs) op(A): then every column block packs it again.
  bool a_packed() const { return a.cs != 1 && !(a.rs == 1 && a.cs <= detail::kColMajorInPlace); }
  bool b_direct(i64 cols) const { return b.cs == 1 && cols == kNR; }
  const float* b_direct_ptr(i64 k0, i64 j0, i64& ldb) const {
    ldb = b.rs;
    return b.base + k0 * b.rs + j0;
  }
  void b_panel(i64 k0, i64 kc, i64 j0, i64 cols, float* out) const { pack_b_panel(b, k0, kc, j0, cols, out); }
};

struct ReaderOps {
  BlockReadFn read_at, read_b;
  const void *at_ctx, *b_ctx;
  const float* a_strip(i64 i0, i64 rows, i64 k0, i64 kc, float* buf, i64& ars, i64& acs, bool& row_mode) const {
    read_at(at_ctx, k0, kc, i0, rows, buf, kMR);
    row_mode = false, ars = 1, acs = kMR;
    return buf;
  }
  bool a_packed() const { return true; }
  bool b_direct(i64) const { return false; }
  const float* b_direct_ptr(i64, i64, i64&) const { return nullptr; }
  void b_panel(i64 k0, i64 kc, i64 j0, i64 cols, float* out) const {
    read_b(b_ctx, k0, kc, j0, cols, out, kNR);
    if (cols < kNR)
      for (i64 k = 0; k < kc; ++k)
        for (i64 j = cols; j < kNR; ++j) out[k * kNR + j] = 0.0f;
  }
};

// op(A) a strided view, op(B) produced by a reader (e.g. a low-precision weight
// dequantized while it is packed, lowp.cpp).
struct ViewReaderOps {
  ViewOps view;
  BlockReadFn read_b;
  const void* b_ctx;
  const float* a_strip(i64 i0, i64 rows, i64 k0, i64 kc, float* buf, i64& ars, i64& acs, bool& row_mode) const {
    return view.a_strip(i0, rows, k0, kc, buf, ars, acs, row_mode);
  }
  bool a_packed() const { return view.a_packed(); }
  bool b_direct(i64) const { return false; }
  const float* b_direct_ptr(i64, i64, i64&) const { return nullptr; }
  void b_panel(i64 k0, i64 kc, i64 j0, i64 cols, float* out) const {
    ReaderOps{nullptr, read_b, nullptr, b_ctx}.b_panel(k0, kc, j0, cols, out);
  }
};

// The packed block of op(B) (kKC x kNCMax floats): one buffer per thread, made on first use.
float* b_pack_buffer() { return detail::thread_scratch<struct PackScratch>(kKC * kNCMax + 16); }

// ------------------------------------------------------------ blocked product
// C[rows m0..m1, cols n0..n1] of C = op(A) @ op(B) (+ epilogue); n1 - n0 <= nc_limit(K).
template <class Ops>
void gemm_unit(const Ops& ops, float* c, i64 ldc, i64 m0, i64 m1, i64 n0, i64 n1, i64 K, bool direct_b,
               const Epi& e) {
  float* b_pack = b_pack_buffer();
  alignas(64) float a_pack[kMR * (kKC + kKCMerge)];
  const float* bp[kNCCap / kNR];
  i64 ldb[kNCCap / kNR];
  const i64 npanels = (n1 - n0 + kNR - 1) / kNR;
  for (i64 k0 = 0, kc = 0; k0 < K; k0 += kc) {
    kc = depth_block(K, k0);
    const bool first = k0 == 0, last = k0 + kc == K;
    for (i64 p = 0; p < npanels; ++p) {
      const i64 j0 = n0 + p * kNR, cols = n1 - j0 < kNR ? n1 - j0 : kNR;
      if (direct_b && ops.b_direct(cols)) {
        bp[p] = ops.b_direct_ptr(k0, j0, ldb[p]);
      } else {
        float* dst = b_pack + p * kNR * kc;
        ops.b_panel(k0, kc, j0, cols, dst);
        bp[p] = dst, ldb[p] = kNR;
      }
    }
    for (i64 i0 = m0; i0 < m1; i0 += kMR) {
      const int rows = static_cast<int>(m1 - i0 < kMR ? m1 - i0 : kMR);
      i64 ars, acs;
      bool row_mode;
      const float* ap = ops.a_strip(i0, rows, k0, kc, a_pack, ars, acs, row_mode);
      for (i64 p = 0; p < npanels; ++p) {
        const i64 j0 = n0 + p * kNR;
        const int nr = static_cast<int>(n1 - j0 < kNR ? n1 - j0 : kNR);
        float* ct = c + i0 * ldc + j0;
        if (row_mode)
          micro_rows<true>(rows, kc, ap, ars, acs, bp[p], ldb[p], ct, ldc, nr, j0, first, last, e);
        else
          micro_rows<false>(rows, kc, ap, ars, acs, bp[p], ldb[p], ct, ldc, nr, j0, first, last, e);
      }
    }
  }
}

// Stores x (one element of C) with the epilogue: beta*C + x, bias, act.
inline void store_one(float& out, float x, i64 j, const Epi& e) {
  if (e.beta == 1.0f) x += out;
  else if (e.beta != 0.0f) x += e.beta * out;
  if (e.bias) x += e.bias[j];
  out = act_scalar(x, e.act);
}

// Small M, op(A) row-major and op(B) = W^T with W [N, K] row-major (ldw):
// C[i][j] = dot(A row i, W row j), vectorised along K; no packing at all.
// kDI rows of A (all valid) against kDJ rows of W at a time.
template <int kDI>
void gemm_dot_rows(const float* a, i64 lda, const float* w, i64 ldw, float* c, i64 ldc, i64 n0, i64 n1, i64 K,
                   const Epi& e) {
  constexpr int kDJ = kDI <= 2 ? 8 : 4;
  const i64 kv = K / kW * kW;
  const float* ar[kDI];
  for (int r = 0; r < kDI; ++r) ar[r] = a + r * lda;
  for (i64 j0 = n0; j0 < n1; j0 += kDJ) {
    const float* wr[kDJ];
    for (int s = 0; s < kDJ; ++s) wr[s] = w + (j0 + s < n1 ? j0 + s : n1 - 1) * ldw;  // clamp: computed, not stored
    V acc[kDI][kDJ];
    for (int r = 0; r < kDI; ++r)
      for (int s = 0; s < kDJ; ++s) acc[r][s] = vzero();
    // one row of A (a decode step): W streams from memory once, so each pass also asks for the
    // next pass's rows, a cache line at a time (the hardware prefetcher alone leaves the loads
    // waiting); a hint only, the same products in the same order
    const i64 next = kDI == 1 && j0 + 2 * kDJ <= n1 ? kDJ : 0;
    for (i64 k = 0; k < kv; k += kW) {
      V av[kDI], wv[kDJ];
      if (next && (k * static_cast<i64>(sizeof(float))) % 64 == 0)
        for (int s = 0; s < kDJ; ++s) __builtin_prefetch(wr[s] + next * ldw + k);
      for (int r = 0; r < kDI; ++r) av[r] = vload(ar[r] + k);
      for (int s = 0; s < kDJ; ++s) wv[s] = vload(wr[s] + k);
      for (int r = 0; r < kDI; ++r)
        for (int s = 0; s < kDJ; ++s) acc[r][s] = vfma(av[r], wv[s], acc[r][s]);
    }
    const i64 nj = n1 - j0 < kDJ ? n1 - j0 : kDJ;
    for (int r = 0; r < kDI; ++r)
      for (i64 s = 0; s < nj; ++s) {
        float x = vsum(acc[r][s]);
        for (i64 k = kv; k < K; ++k) x += ar[r][k] * wr[s][k];
        store_one(c[r * ldc + j0 + s], x, j0 + s, e);
      }
  }
}

// Rows of W per block of gemm_dot: about this many bytes, so the block stays in L2 while
// every group of rows of A passes over it (unblocked, W streamed from memory M / 4 times:
// an LSTM LM's 10000 x 96 output layer at 16 tokens read its 3.8 MB four times).
constexpr i64 kDotBlockBytes = 128 * 1024;

void gemm_dot(const float* a, i64 lda, const float* w, i64 ldw, float* c, i64 ldc, i64 M, i64 n0, i64 n1, i64 K,
              const Epi& e) {
  const i64 row_bytes = (K > 0 ? K : 1) * static_cast<i64>(sizeof(float));
  const i64 jb = kDotBlockBytes / row_bytes < 8 ? 8 : kDotBlockBytes / row_bytes / 8 * 8;
  for (i64 j0 = n0; j0 < n1; j0 += jb) {  // each C element: the same dot product, whatever the blocks
    const i64 j1 = n1 - j0 < jb ? n1 : j0 + jb;
    i64 i = 0;
    for (; i + 4 <= M; i += 4) gemm_dot_rows<4>(a + i * lda, lda, w, ldw, c + i * ldc, ldc, j0, j1, K, e);
    if (M - i == 3) gemm_dot_rows<3>(a + i * lda, lda, w, ldw, c + i * ldc, ldc, j0, j1, K, e);
    if (M - i == 2) gemm_dot_rows<2>(a + i * lda, lda, w, ldw, c + i * ldc, ldc, j0, j1, K, e);
    if (M - i == 1) gemm_dot_rows<1>(a + i * lda, lda, w, ldw, c + i * ldc, ldc, j0, j1, K, e);
  }
}

// GEMV-like small M (<= kGemvMaxRows) with a row-major op(B) (e.g. an LSTM's
// backward step dG_t @ W_hh at batch 1): C[i, j] = sum_k op(A)(i, k) B[k, j].
// B is streamed once per block of kGemvNV vectors of columns, the kRows rows'
// accumulators stay in registers; columns past the last full vector are scalar.
constexpr i64 kGemvMaxRows = 4;
constexpr int kGemvNV = 4;
// C[0:kRows, j0 : j0 + NV*kW] of the GEMV below.
// With few accumulators (one row, few vectors) K is split round-robin over kU
// independent sets, so a long K (e.g. dG_t @ W_hh, K = 4H) is not one FMA
// latency chain; the sets are added in a fixed order (thread-count independent).
template <int kRows, int NV>
void gemv_block(const MatView& a, const MatView& b, float* c, i64 ldc, i64 j0, i64 K, const Epi& e) {
  constexpr int kU = kRows * NV >= 8 ? 1 : 8 / (kRows * NV);
  V acc[kU][kRows][NV];
  for (int u = 0; u < kU; ++u)
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < NV; ++v) acc[u][r][v] = vzero();
  auto step = [&](i64 k, V(&ac)[kRows][NV]) {
    const float* brow = b.base + k * b.rs + j0;
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = vload(brow + v * kW);
    for (int r = 0; r < kRows; ++r) {
      const V ar = vbcast(a.base[r * a.rs + k * a.cs]);
      for (int v = 0; v < NV; ++v) ac[r][v] = vfma(ar, bv[v], ac[r][v]);
    }
  };
  i64 k = 0;
  for (; k + kU <= K; k += kU)
    for (int u = 0; u < kU; ++u) step(k + u, acc[u]);
  for (; k < K; ++k) step(k, acc[0]);
  for (int u = 1; u < kU; ++u)
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < NV; ++v) acc[0][r][v] = vadd(acc[0][r][v], acc[u][r][v]);
  for (int r = 0; r < kRows; ++r) {
    alignas(64) float t[NV * kW];
    for (int v = 0; v < NV; ++v) vstore(t + v * kW, acc[0][r][v]);
    for (int q = 0; q < NV * kW; ++q) store_one(c[r * ldc + j0 + q], t[q], j0 + q, e);
  }
}

template <int kRows>
void gemv_rows(const MatView& a, const MatView& b, float* c, i64 ldc, i64 n0, i64 n1, i64 K, const Epi& e) {
  i64 j0 = n0;
  for (; j0 + kGemvNV * kW <= n1; j0 += kGemvNV * kW) gemv_block<kRows, kGemvNV>(a, b, c, ldc, j0, K, e);
  for (; j0 + kW <= n1; j0 += kW) gemv_block<kRows, 1>(a, b, c, ldc, j0, K, e);
  for (; j0 < n1; ++j0)
    for (int r = 0; r < kRows; ++r) {
      float x = 0.0f;
      for (i64 k = 0; k < K; ++k) x += a.base[r * a.rs + k * a.cs] * b.base[k * b.rs + j0];
      store_one(c[r * ldc + j0], x, j0, e);
    }
}

void gemv(const MatView& a, const MatView& b, float* c, i64 ldc, i64 M, i64 n0, i64 n1, i64 K, const Epi& e) {
  switch (M) {
    case 4: gemv_rows<4>(a, b, c, ldc, n0, n1, K, e); break;
    case 3: gemv_rows<3>(a, b, c, ldc, n0, n1, K, e); break;
    case 2: gemv_rows<2>(a, b, c, ldc, n0, n1, K, e); break;
    default: gemv_rows<1>(a, b, c, ldc, n0, n1, K, e); break;
  }
}

// C[M,N] (row stride ldc) = op(A) @ op(B) + beta*C (+ bias, act), threaded
// over units of columns (and rows when there are few column blocks).
template <class Ops>
void gemm_core(const Ops& ops, float* c, i64 ldc, i64 M, i64 N, i64 K, const Epi& e, bool direct_b) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) {
        float x = e.beta == 0.0f ? 0.0f : (e.beta == 1.0f ? c[i * ldc + j] : e.beta * c[i * ldc + j]);
        if (e.bias) x += e.bias[j];
        c[i * ldc + j] = act_scalar(x, e.act);
      }
    return;
  }
  // planned for the threads that will really run it: while the pool is backed off on a busy
  // machine (parallel_now() false) every unit runs on the caller, and a plan cut for several
  // threads (narrower column blocks, B packed once per row block) is slower there than the
  // one-thread plan. Either plan gives every element the same FMA chain.
  const int threads = M * N * K >= kParallelMinFlops && parallel_now() ? num_threads() : 1;
  // Column blocks of nc (a multiple of kNR, at most nc_limit(K)) and row blocks of
  // whole strips. Several threads: about 4 units per thread (parallel_for's
  // chunks), from narrower column blocks first (down to kNCMinSplit), then from
  // row blocks of at least 2 strips (each row block packs its own B).
  const i64 strips = (M + kMR - 1) / kMR, panels = (N + kNR - 1) / kNR;
  const i64 nc_max = nc_limit(K);
  i64 ncb = (N + nc_max - 1) / nc_max, nrb = 1;
  if (threads > 1) {
    const i64 want = 4 * threads;
    if (ncb < want) {
      const i64 most = (N + kNCMinSplit - 1) / kNCMinSplit;
      ncb = ncb > (want < most ? want : most) ? ncb : (want < most ? want : most);
    }
    const i64 max_rb = strips / 2 < 1 ? 1 : strips / 2;
    if (ncb < want) {
      nrb = (want + ncb - 1) / ncb;
      if (nrb > max_rb) nrb = max_rb;
    }
    // A packed op(A) (e.g. dy^T of a weight gradient) is packed again by every column
    // block, op(B) by every row block: where rows first (the fewest column blocks) packs
    // fewer floats and still gives each thread two units, cut rows first.
    if (ops.a_packed()) {
      const i64 ncb_r = (N + nc_max - 1) / nc_max;
      i64 nrb_r = (want + ncb_r - 1) / ncb_r;
      if (nrb_r > max_rb) nrb_r = max_rb;
      const i64 b_floats = direct_b ? 0 : K * N;
      if (ncb_r * nrb_r >= 2 * threads && M * K * ncb_r + b_floats * nrb_r < M * K * ncb + b_floats * nrb)
        ncb = ncb_r, nrb = nrb_r;
    }
  }
  const i64 pnc = (panels + ncb - 1) / ncb;  // panels per column block
  ncb = (panels + pnc - 1) / pnc;
  const i64 nc = pnc * kNR;
  auto run = [&](i64 u0, i64 u1) {
    for (i64 u = u0; u < u1; ++u) {
      const i64 cb = u / nrb, rb = u % nrb;
      const i64 m0 = strips * rb / nrb * kMR, m1 = strips * (rb + 1) / nrb * kMR;
      const i64 n0 = cb * nc, n1 = N - n0 < nc ? N : n0 + nc;
      gemm_unit(ops, c, ldc, m0, m1 < M ? m1 : M, n0, n1, K, direct_b, e);
    }
  };
  if (threads > 1)
    parallel_for(ncb * nrb, 1, run);
  else
    run(0, ncb * nrb);
}

// ------------------------------------------------------------ small M against w^T, swapped
// Small M with a transposed op(B) = w^T (x @ w^T, w [N, K] row-major, e.g. an LSTM LM's
// 10000-word output layer at 16 tokens): packing w^T (register transposes of all of w) costs
// about as much as the product, each packed element serving only M rows.  Instead C^T =
// w @ op(A)^T is computed into a per-thread scratch with w read in place as the row-major
// op(A) (only op(A)^T, M columns, is packed), then transposed into C with the epilogue.
// Every element is the same FMA chain over k as the direct product's (the products commute),
// and the epilogue adds the bias and applies the activation as store_vec does: the same bits.
// Only M a multiple of kNR (C^T's columns fill whole panels: M = 16 on AVX-512, half a panel, was
// slower than packing).  AVX2, one thread, best of 30 (cache-hot): 16 x 10000 x 96 0.92 ->
// 0.74 ms, 16 x 2680 x 96 0.23 -> 0.18, 16 x 576 x 1536 0.77 -> 0.47; M = 12 or 20 slower.
constexpr i64 kSwapMaxRows = 32;
constexpr i64 kSwapMaxFloats = i64(1) << 20;  // scratch for C^T (4 MB); larger C: direct

bool views_use_swap(const MatView& a, const MatView& b, i64 M, i64 N, i64 K, const Epi& e) {
  return M > kDotMaxRows && M <= kSwapMaxRows && M % kNR == 0 && a.cs == 1 && b.rs == 1 && b.cs != 1 &&
         e.beta == 0.0f && !e.upd && N >= 4 * kNR && K > 0 && M * N <= kSwapMaxFloats;
}

void gemm_swapped(const MatView& a, const MatView& b, float* c, i64 ldc, i64 M, i64 N, i64 K, const Epi& e) {
  float* t = detail::thread_scratch<struct SwapScratch>(M * N);  // C^T [N, M]
  const MatView w{b.base, b.cs, 1}, at{a.base, 1, a.rs};
  gemm_core(ViewOps{w, at}, t, M, N, M, K, Epi{0.0f, nullptr, Act::None}, false);
  constexpr i64 kJB = 64;  // columns of C per block: their rows of t (kJB * M floats) stay in L1
  auto run = [&](i64 j0, i64 j1) {
    for (i64 jb = j0; jb < j1; jb += kJB) {
      const i64 je = j1 - jb < kJB ? j1 : jb + kJB;
      for (i64 i = 0; i < M; ++i)
        for (i64 j = jb; j < je; ++j) {
          float x = t[j * M + i];
          if (e.bias) x += e.bias[j];
          c[i * ldc + j] = act_scalar(x, e.act);
        }
    }
  };
  if (M * N >= kMinChunkElems && parallel_now())
    parallel_for(N, kJB * 4, run);
  else
    run(0, N);
}

// Whether gemm_views takes the dot-product or GEMV path (else gemm_core).
bool views_use_dot(const MatView& a, const MatView& b, i64 M, i64 N, i64 K) {
  return M <= kDotMaxRows && a.cs == 1 && b.rs == 1 && K >= kW && M > 0 && N > 0;
}
bool views_use_gemv(const MatView& a, const MatView& b, i64 M, i64 N, i64 K) {
  return M <= kGemvMaxRows && b.cs == 1 && M > 0 && N > 0 && K > 0;
}

// Whether gemm_views runs a non-empty product on gemm_core, where the per-tile epilogues (a
// fused update, the finite check) live; its other paths (dot, GEMV, swapped) have none.
bool views_use_core(const MatView& a, const MatView& b, i64 M, i64 N, i64 K, const Epi& e) {
  return M > 0 && N > 0 && K > 0 && !views_use_dot(a, b, M, N, K) && !views_use_gemv(a, b, M, N, K) &&
         !views_use_swap(a, b, M, N, K, e);
}

void gemm_views(const MatView& a, const MatView& b, float* c, i64 ldc, i64 M, i64 N, i64 K, const Epi& e) {
  if (views_use_dot(a, b, M, N, K)) {
    auto run = [&](i64 j0, i64 j1) { gemm_dot(a.base, a.rs, b.base, b.cs, c, ldc, M, j0, j1, K, e); };
    if (M * N * K >= kParallelMinFlops && num_threads() > 1)
      parallel_for(N, 64, run);
    else
      run(0, N);
    return;
  }
  if (views_use_gemv(a, b, M, N, K)) {
    auto run = [&](i64 j0, i64 j1) { gemv(a, b, c, ldc, M, j0, j1, K, e); };
    if (M * N * K >= kParallelMinFlops && num_threads() > 1)
      parallel_for_aligned(N, kGemvNV * kW, kGemvNV * kW, run);
    else
      run(0, N);
    return;
  }
  if (views_use_swap(a, b, M, N, K, e)) return gemm_swapped(a, b, c, ldc, M, N, K, e);
  gemm_core(ViewOps{a, b}, c, ldc, M, N, K, e, M <= kDirectBMaxRows);
}

}  // namespace

// Entry points for other kernels of this library (conv2d.cpp, linear.cpp
// declare them where used; not part of the public contract).
namespace detail {
// op(A)[i][k] = A[i*a_rs + k*a_cs], op(B)[k][j] = B[k*b_rs + j*b_cs]:
// C[i][j] (at C[i*ldc + j]) = sum_k op(A)[i][k] op(B)[k][j] (+ C when accumulate).
void gemm_strided(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                  i64 M, i64 N, i64 K, bool accumulate) {
  gemm_views(MatView{A, a_rs, a_cs}, MatView{B, b_rs, b_cs}, C, ldc, M, N, K,
             Epi{accumulate ? 1.0f : 0.0f, nullptr, Act::None});
}

// As gemm_strided with beta 0, but the last depth block hands each finished row of a
// tile to upd.apply instead of storing it (C holds only the earlier blocks' partial
// sums): the optimizer update fused into a weight gradient.  The gradient values are
// those gemm_strided would store, bit for bit.  false (nothing done) where gemm_strided
// would not take the blocked path (dot-product/GEMV shapes, K == 0): the caller then
// runs gemm_strided and the update kernel.
bool gemm_strided_update(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                         i64 M, i64 N, i64 K, const UpdateEpilogue& upd) {
  const MatView a{A, a_rs, a_cs}, b{B, b_rs, b_cs};
  Epi e{0.0f, nullptr, Act::None};
  e.upd = &upd;
  e.c0 = C;
  if (!views_use_core(a, b, M, N, K, e)) return false;
  gemm_core(ViewOps{a, b}, C, ldc, M, N, K, e, M <= kDirectBMaxRows);
  return true;
}

// As gemm_strided with beta 0, and *finite = whether every element of C is finite, tested
// as the last depth block stores each row (the same values, bit for bit).  false (nothing
// done) where gemm_strided would not take the blocked path: the caller then runs
// gemm_strided and scans C.
bool gemm_strided_checked(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C,
                          i64 ldc, i64 M, i64 N, i64 K, bool* finite) {
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
  return false;  // the store's x - x test folds to 0 under -ffinite-math-only: the caller's bit-test scan
#endif
  const MatView a{A, a_rs, a_cs}, b{B, b_rs, b_cs};
  std::atomic<bool> bad{false};
  Epi e{0.0f, nullptr, Act::None};
  e.nonfinite = &bad;
  if (!views_use_core(a, b, M, N, K, e)) return false;
  gemm_core(ViewOps{a, b}, C, ldc, M, N, K, e, M <= kDirectBMaxRows);
  *finite = !bad.load(std::memory_order_relaxed);
  return true;
}

// As gemm_strided with beta 0, then C[i][j] = act(C[i][j] + bias[j]) (bias
// nullable) applied as each tile is stored.
void gemm_strided_bias_act(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C,
                           i64 ldc, i64 M, i64 N, i64 K, const float* bias, Act act) {
  gemm_views(MatView{A, a_rs, a_cs}, MatView{B, b_rs, b_cs}, C, ldc, M, N, K, Epi{0.0f, bias, act});
}

// Implicit GEMM: the operands are produced block by block by reader callbacks
// (read_at reads op(A)^T [K, M], read_b reads op(B) [K, N]); e.g. a
// convolution's im2col matrix generated on the fly without any scratch.
// The readers may be called from several threads at once.
void gemm_readers(BlockReadFn read_at, const void* at_ctx, BlockReadFn read_b, const void* b_ctx, float* C,
                  i64 ldc, i64 M, i64 N, i64 K, bool accumulate) {
  gemm_core(ReaderOps{read_at, read_b, at_ctx, b_ctx}, C, ldc, M, N, K,
            Epi{accumulate ? 1.0f : 0.0f, nullptr, Act::None}, false);
}

// op(A) a strided view (as gemm_strided), op(B) [K, N] from a reader (read_b
// fills out[k*ld + j] for a block; it may be called from several threads at
// once): C = op(A) @ op(B) + beta*C, then bias (nullable) and act per tile.
void gemm_view_reader(const float* A, i64 a_rs, i64 a_cs, BlockReadFn read_b, const void* b_ctx, float* C, i64 ldc,
                      i64 M, i64 N, i64 K, float beta, const float* bias, Act act) {
  gemm_core(ViewReaderOps{ViewOps{MatView{A, a_rs, a_cs}, MatView{nullptr, 0, 0}}, read_b, b_ctx}, C, ldc, M, N, K,
            Epi{beta, bias, act}, false);
}
}  // namespace detail

// Batched C_b = op(A_b) @ op(B_b) + beta * C_b, batches in order (so sc = 0
// with beta = 1 sums every batch's product into one C).  The contract uses
// beta 0 (C is never read) or 1; any other beta scales C.
void gemm(const float* A, const float* B, float* C, const GemmParams& p) {
  const Epi e{p.beta, nullptr, Act::None};
  auto one = [&](i64 bi) {
    // op(A)[i][k]: A stored [M,K] (rs=K, cs=1) or [K,M] when ta (rs=1, cs=M).
    const MatView a{A + bi * p.sa, p.ta ? 1 : p.K, p.ta ? p.M : 1};
    // op(B)[k][j]: B stored [K,N] (rs=N, cs=1) or [N,K] when tb (rs=1, cs=K).
    const MatView b{B + bi * p.sb, p.tb ? 1 : p.N, p.tb ? p.K : 1};
    gemm_views(a, b, C + bi * p.sc, p.N, p.M, p.N, p.K, e);
  };
  // Many small products with disjoint outputs (e.g. attention heads): one
  // product per task; otherwise each product is threaded on its own.
  const i64 flops = p.M * p.N * p.K;
  if (p.batch > 1 && p.sc >= p.M * p.N && flops < kParallelMinFlops && flops * p.batch >= kParallelMinFlops &&
      num_threads() > 1) {
    parallel_for(p.batch, 1, [&](i64 b0, i64 b1) {
      for (i64 bi = b0; bi < b1; ++bi) one(bi);
    });
    return;
  }
  for (i64 bi = 0; bi < p.batch; ++bi) one(bi);
}

}  // namespace pk
