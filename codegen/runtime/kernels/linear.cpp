// linear.cpp — fully connected layer (y = x w^T + b) and its gradients, on pk::gemm.
#include "pock_kernels.h"

namespace pk {
namespace detail {
// Defined in gemm.cpp: C[M,N] (row stride ldc) = op(A) @ op(B) (+ C when
// accumulate), op(A)[i][k] = A[i*a_rs + k*a_cs], op(B)[k][j] = B[k*b_rs + j*b_cs].
void gemm_strided(const float* A, i64 a_rs, i64 a_cs, const float* B, i64 b_rs, i64 b_cs, float* C, i64 ldc,
                  i64 M, i64 N, i64 K, bool accumulate);
}  // namespace detail

// y[M,N] = x[M,K] @ w[N,K]^T + b[N]; the bias (if any) is written first and
// the product accumulated onto it.
void linear_fwd(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K) {
  if (b != nullptr) {
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) y[i * N + j] = b[j];
  }
  const GemmParams p{1, M, N, K, /*ta=*/false, /*tb=*/true, 0, 0, 0, b != nullptr ? 1.0f : 0.0f};
  gemm(x, w, y, p);
}

// dx[M,K] = dy[M,N] @ w[N,K]
void linear_bwd_input(const float* dy, const float* w, float* dx, i64 M, i64 N, i64 K) {
  const GemmParams p{1, M, K, N, /*ta=*/false, /*tb=*/false, 0, 0, 0, 0.0f};
  gemm(dy, w, dx, p);
}

// dw[N,k] = dy[M,N]^T @ x[M, 0:k], x rows being ldx floats long.
void linear_bwd_weight(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx) {
  // op(A) = dy^T: element (n, m) at dy[m*N + n]; op(B) = x[:, 0:k]: (m, j) at x[m*ldx + j].
  detail::gemm_strided(dy, /*a_rs=*/1, /*a_cs=*/N, x, /*b_rs=*/ldx, /*b_cs=*/1, dw, /*ldc=*/k, N, k, M, false);
}

// db[N] = column sums of dy[M,N], accumulated in double (in column blocks so
// the accumulators live on the stack).
void bias_bwd(const float* dy, float* db, i64 M, i64 N) {
  constexpr i64 kBlock = 256;
  double acc[kBlock];
  for (i64 j0 = 0; j0 < N; j0 += kBlock) {
    const i64 nb = N - j0 < kBlock ? N - j0 : kBlock;
    for (i64 j = 0; j < nb; ++j) acc[j] = 0.0;
    for (i64 i = 0; i < M; ++i) {
      const float* row = dy + i * N + j0;
      for (i64 j = 0; j < nb; ++j) acc[j] += row[j];
    }
    for (i64 j = 0; j < nb; ++j) db[j0 + j] = static_cast<float>(acc[j]);
  }
}

}  // namespace pk
