// lowp_dp_shim.cpp — extern "C" access to lowp_dot.cpp's VDPBF16PS product (gemm_detail.h:
// bf16_dp_*, and lowp_amx.cpp's tiles behind it) for test_kernels_lowp_dp.py, which builds it with
// -DPOCK_EMULATE_DPBF16 or -DPOCK_EMULATE_AMX (the instructions' definitions in C++) so the packing
// and tiling run on any x86 CPU.  Built with
// every kernel, threadpool.cpp and the generated kernel shims.
#include <vector>

#include "kernels/gemm_detail.h"
#include "pock_kernels.h"
#include "runtime_internal.h"

using pk::i64;

namespace {
// Runs f on a pool of `threads` threads made current (threads <= 1: inline).
template <class F>
void on_threads(int threads, F f) {
  pock_rt::ThreadPool* pool = threads > 1 ? pock_rt::pool_create(threads) : nullptr;
  {
    pock_rt::PoolScope scope(pool);
    f();
  }
  if (pool) pock_rt::pool_destroy(pool);
}
}  // namespace

extern "C" {

int shim_bf16_dp_available() { return pk::detail::bf16_dp_available() ? 1 : 0; }
int shim_bf16_amx_available() { return pk::detail::bf16_amx_available() ? 1 : 0; }

// C[M, R] (row stride ldc) = A [M, D] (row stride lda) . B [R, D] (row stride ldb)^T in bf16;
// returns the packer's answer (0: a subnormal in B, C untouched).
int shim_bf16_dp_rows(const uint16_t* A, i64 lda, i64 M, const uint16_t* B, i64 ldb, i64 R, i64 D, float* C, i64 ldc,
                      int threads) {
  std::vector<uint32_t> panels(static_cast<size_t>(pk::detail::bf16_dp_panel_words(R, D)));
  int ok = 0;
  on_threads(threads, [&] {
    ok = pk::detail::bf16_dp_pack_rows(B, R, D, ldb, panels.data());
    if (ok) pk::detail::bf16_dp_gemm(A, lda, M, panels.data(), R, D, C, ldc);
  });
  return ok;
}

// C[M, R] = A [M, D] . W [D, R] in bf16 (W's columns as B's rows)
int shim_bf16_dp_cols(const uint16_t* A, i64 lda, i64 M, const uint16_t* W, i64 D, i64 R, float* C, i64 ldc,
                      int threads) {
  std::vector<uint32_t> panels(static_cast<size_t>(pk::detail::bf16_dp_panel_words(R, D)));
  int ok = 0;
  on_threads(threads, [&] {
    ok = pk::detail::bf16_dp_pack_cols(W, D, R, panels.data());
    if (ok) pk::detail::bf16_dp_gemm(A, lda, M, panels.data(), R, D, C, ldc);
  });
  return ok;
}

}  // extern "C"
