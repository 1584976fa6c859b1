// linear.cpp — fully connected layer (y = x w^T + b) and its gradients, on pk::gemm.
//
// Every product goes through gemm.cpp, which threads large products over the
// current step's pool (pk::parallel_for); the bias and activation of the
// forward pass are applied as gemm stores each tile (no extra pass over y).
#include "pock_kernels.h"
#include "pock_parallel.h"
#include "simd.h"
#include "update_math.h"
#include "gemm_detail.h"

namespace pk {

// y[M,N] = act(x[M,K] @ w[N,K]^T + b[N]); op(B) = w^T: (k, j) at w[j*K + k].
void linear_fwd_act(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K, Act act) {
  detail::gemm_strided_bias_act(x, K, 1, w, /*b_rs=*/1, /*b_cs=*/K, y, N, M, N, K, b, act);
}

// y[M,N] = x[M,K] @ w[N,K]^T + b[N]
void linear_fwd(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K) {
  linear_fwd_act(x, w, b, y, M, N, K, Act::None);
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

// linear_bwd_weight and whether dw is all finite (the exact guard's check before any update),
// tested as the GEMM stores dw rather than by a second pass over it.
bool linear_bwd_weight_finite(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx) {
  bool finite = true;
  if (detail::gemm_strided_checked(dy, 1, N, x, ldx, 1, dw, k, N, k, M, &finite)) return finite;
  linear_bwd_weight(dy, x, dw, M, N, k, ldx);
  return all_finite(dw, N * k);
}

// The fused weight gradient + update: dw = dy^T x[:, 0:k] as linear_bwd_weight computes it,
// each finished tile updating p (the weight, region r: the whole [N, k] or its first k
// input columns, rows r.stride long) and the state (laid out like dw) while it is in
// registers; dw only holds partial sums across depth blocks.  Shapes the blocked GEMM
// does not take, or a region that is not [N, k], run unfused (the same bits either way).
namespace {
template <class Update>
bool bwd_weight_update(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx,
                       const UpdateRegion& r, UpdateEpilogue upd, bool check_finite, Update&& unfused) {
  const bool whole = r.outer == 1 && r.inner == N * k, rows = r.outer == N && r.inner == k;
  if (whole || rows) {
    std::atomic<bool> bad{false};
    upd.ldp = whole ? k : r.stride;
    upd.ldc = k;
    upd.check_finite = check_finite;
    upd.bad = &bad;
    if (detail::gemm_strided_update(dy, 1, N, x, ldx, 1, dw, k, N, k, M, upd))
      return !bad.load(std::memory_order_relaxed);
  }
  linear_bwd_weight(dy, x, dw, M, N, k, ldx);
  return unfused();
}
}  // namespace

bool linear_bwd_weight_sgd(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
                           float* buf, const UpdateRegion& r, float lr, float momentum, float dampening,
                           float weight_decay, bool nesterov, bool first_step, bool check_finite) {
  UpdateEpilogue upd{};
  upd.adamw = false;
  upd.sgd = sgd_consts(lr, momentum, dampening, weight_decay, nesterov, first_step);
  upd.p = p;
  upd.buf = momentum != 0.f ? buf : nullptr;
  return bwd_weight_update(dy, x, dw, M, N, k, ldx, r, upd, check_finite, [&] {
    return sgd_update(p, dw, buf, r, lr, momentum, dampening, weight_decay, nesterov, first_step, check_finite);
  });
}

bool linear_bwd_weight_adamw(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
                             float* m, float* v, const UpdateRegion& r, float lr, float beta1, float beta2, float eps,
                             float weight_decay, i64 step, bool check_finite) {
  UpdateEpilogue upd{};
  upd.adamw = true;
  upd.adam = adamw_consts(lr, beta1, beta2, eps, weight_decay, step);
  upd.p = p;
  upd.m = m;
  upd.v = v;
  return bwd_weight_update(dy, x, dw, M, N, k, ldx, r, upd, check_finite, [&] {
    return adamw_update(p, dw, m, v, r, lr, beta1, beta2, eps, weight_decay, step, check_finite);
  });
}

// db[N] = column sums of dy[M,N]: each column summed in float over blocks of kRows
// rows (row order), the blocks added in double.  The rows stream through memory in
// order, kCols columns at a time: a block's float partial sums live in `part` (L1)
// and are added there one row at a time (simd.h vectors; the column tail, < kW
// columns, in scalar floats, same order), so dy is read once, sequentially (a
// 64-column strip per pass read each row's cache lines from a different page and
// ran at a third of the memory bandwidth).  Threaded over columns, so the sums (and
// their rounding) do not depend on the number of threads.
void bias_bwd(const float* dy, float* db, i64 M, i64 N) {
  using namespace simd;
  constexpr i64 kCols = 1024, kRows = 64, kGrainCols = 64;  // kGrainCols: a thread's fewest columns
  auto run = [&](i64 c0, i64 c1) {
    alignas(64) float part[kCols];
    double acc[kCols];
    for (i64 j0 = c0; j0 < c1; j0 += kCols) {
      const i64 nb = c1 - j0 < kCols ? c1 - j0 : kCols;
      const i64 nv = nb / kW;  // full vectors
      for (i64 j = 0; j < nb; ++j) acc[j] = 0.0;
      for (i64 r0 = 0; r0 < M; r0 += kRows) {
        const i64 r1 = M - r0 < kRows ? M : r0 + kRows;
        for (i64 j = 0; j < nb; ++j) part[j] = 0.f;
        i64 i = r0;
        for (; i + 4 <= r1; i += 4) {  // four rows per pass over part, still added in row order
          const float* r = dy + i * N + j0;
          for (i64 v = 0; v < nv; ++v) {
            const i64 o = v * kW;
            V p = vadd(vload(part + o), vload(r + o));
            p = vadd(p, vload(r + N + o));
            p = vadd(p, vload(r + 2 * N + o));
            vstore(part + o, vadd(p, vload(r + 3 * N + o)));
          }
          for (i64 j = nv * kW; j < nb; ++j) part[j] = (((part[j] + r[j]) + r[N + j]) + r[2 * N + j]) + r[3 * N + j];
        }
        for (; i < r1; ++i) {
          const float* row = dy + i * N + j0;
          for (i64 v = 0; v < nv; ++v) vstore(part + v * kW, vadd(vload(part + v * kW), vload(row + v * kW)));
          for (i64 j = nv * kW; j < nb; ++j) part[j] += row[j];
        }
        for (i64 j = 0; j < nb; ++j) acc[j] += part[j];
      }
      for (i64 j = 0; j < nb; ++j) db[j0 + j] = static_cast<float>(acc[j]);
    }
  };
  if (M * N >= (i64(1) << 16))
    parallel_for(N, kGrainCols, run);
  else
    run(0, N);
}

}  // namespace pk
