// pock_kernels.h — the kernel library the generated training step calls.
//
// Conventions (every kernel):
//   * out-variant: the caller owns every buffer; a kernel never allocates.
//   * all tensors are dense, contiguous, row-major; float32 unless noted;
//     integer indices/targets are int64_t.
//   * a nullable pointer (documented per kernel) means "absent" (no bias, no
//     affine weight, gradient not wanted).
//   * forward and backward of one op live side by side in kernels/<op>.cpp.
//   * shapes are compile-time constants in the generated code; they come in
//     through plain integers or the small parameter structs below.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pk {

using i64 = int64_t;
constexpr int kMaxDims = 6;

// Fused activation epilogues: applied to a kernel's output before it is
// stored. Only activations whose backward reads the output (relu, relu6)
// are fused, so the pre-activation tensor never needs to exist.
enum class Act { None = 0, Relu = 1, Relu6 = 2 };

// ---------------------------------------------------------------- gemm.cpp
// For b in [0,batch):  C_b = op(A_b) @ op(B_b) + beta * C_b
//   op(A_b) is [M,K] (A_b stored [M,K], or [K,M] when ta);
//   op(B_b) is [K,N] (B_b stored [K,N], or [N,K] when tb);
//   X_b = X + b * sX (sX = 0 broadcasts one matrix over the batch).
// beta is 0 (overwrite) or 1 (accumulate).
struct GemmParams {
  i64 batch, M, N, K;
  bool ta, tb;
  i64 sa, sb, sc;
  float beta;
};
void gemm(const float* A, const float* B, float* C, const GemmParams& p);

// ---------------------------------------------------------------- linear.cpp
// y[M,N] = x[M,K] @ w[N,K]^T + b[N]          (b nullable)
void linear_fwd(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K);
// y = act(x @ w^T + b)
void linear_fwd_act(const float* x, const float* w, const float* b, float* y, i64 M, i64 N, i64 K, Act act);
// dx[M,K] = dy[M,N] @ w[N,K]
void linear_bwd_input(const float* dy, const float* w, float* dx, i64 M, i64 N, i64 K);
// dw[N,k] = dy[M,N]^T @ x[M, 0:k], x stored with row length ldx (ldx >= k)
void linear_bwd_weight(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx);
// linear_bwd_weight (the same dw, bit for bit), returning whether dw holds no NaN/inf: the
// exact non-finite guard's check, made as the product stores dw (no second pass over it)
bool linear_bwd_weight_finite(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx);
// db[N] = sum over rows of dy[M,N]
void bias_bwd(const float* dy, float* db, i64 M, i64 N);

// ---------------------------------------------------------------- lowp.cpp
// A frozen weight stored in low precision (compile(frozen_dtype=...)),
// dequantized inside the kernel; scale[N] is used by I8 only (nullable otherwise).
enum class LowpDtype { BF16 = 0, F16 = 1, I8 = 2, Q4 = 3 };  // Q4: scale = per-block (d, m), see lowp.cpp
void linear_fwd_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                     i64 M, i64 N, i64 K, Act act);
void linear_bwd_input_lowp(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                           i64 N, i64 K);
// Rows whose index is outside [0, V) become zeros; returns the first such i, or -1.
i64 embedding_fwd_lowp(const void* w, LowpDtype dt, const float* scale, const int64_t* idx, float* y, i64 n,
                       i64 V, i64 D);
// gemv.cpp: y[N] = dequant(w)[N, K] x[K] + b[N] for one row x (a decode step), b nullable;
// the same weights as above (int8's and q4's scales applied to each row's / block's product,
// not to each weight), fp32 accumulation, the same bits for any thread count.
void gemv_lowp(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y, i64 N,
               i64 K);
// compute_dtype: the products above in cd (BF16 or F16) with fp32 accumulation: x (dy) and the
// dequantized w rounded to cd, fp16's x (dy) scaled by a power of two per call (lowp.cpp).
void linear_fwd_lowp_cd(const float* x, const void* w, LowpDtype dt, const float* scale, const float* b, float* y,
                        i64 M, i64 N, i64 K, Act act, LowpDtype cd);
void linear_bwd_input_lowp_cd(const float* dy, const void* w, LowpDtype dt, const float* scale, float* dx, i64 M,
                              i64 N, i64 K, LowpDtype cd);

// ---------------------------------------------------------------- linear_ce.cpp
// A loss head without its logits: loss[0] = cross_entropy(x[M,K] @ w[V,K]^T + b[V], target[M])
// (mean over rows whose target != ignore_index; 0 when there are none), over tiles of `rows`
// x `cols` logits in the scratch (rows * cols floats; the backward rows * (cols + K) when lowp),
// never all M x V.  w is float, or (lowp) a low-precision frozen weight of dtype dt (scale as
// lowp.cpp).  lse[M] saves each row's log-sum-exp for the backward.  b nullable.  Both return
// the first row whose target is neither ignore_index nor in [0, V) (skipped), -1 when none.
// k: dw's columns, dw[V,k] = the gradient of w[:, 0:k] (a partial-channel update).
struct LinearCeParams {
  i64 M, V, K, k;
  i64 ignore_index;
  i64 rows, cols;
  bool lowp = false;
  int dt = 0;  // a LowpDtype, when lowp
};
i64 linear_ce_fwd(const float* x, const void* w, const float* scale, const float* b, const int64_t* target,
                  float* loss, float* lse, float* scratch, const LinearCeParams& p);
// linear_ce_fwd, and dx[M,K] of dscale * loss in the same pass (no logits recomputed: a frozen
// head's backward); scratch rows * cols floats, rows * (cols + K) when lowp.
i64 linear_ce_fwd_dx(const float* x, const void* w, const float* scale, const float* b, const int64_t* target,
                     float* loss, float* lse, float* dx, float dscale, float* scratch, const LinearCeParams& p);
// dx[0:n] = dloss[0] * dx1[0:n]: linear_ce_fwd_dx's dx (dscale 1) for the step's loss gradient.
void linear_ce_bwd_scale(const float* dloss, const float* dx1, float* dx, i64 n);
// dx[M,K], dw[V,k], db[V] (each nullable) of dloss[0] * loss.
i64 linear_ce_bwd(const float* dloss, const float* x, const void* w, const float* scale, const float* b,
                  const int64_t* target, const float* lse, float* dx, float* dw, float* db, float* scratch,
                  const LinearCeParams& p);

// ---------------------------------------------------------------- conv2d.cpp
// x[N,C,H,W], w[O, C/groups, KH, KW], b[O] (nullable), y[N,O,OH,OW]
struct Conv2dParams {
  i64 N, C, H, W, O, KH, KW, OH, OW;
  i64 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
};
void conv2d_fwd(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p);
// y = act(conv2d(x, w) + b)
void conv2d_fwd_act(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, Act act);
void conv2d_bwd_input(const float* dy, const float* w, float* dx, const Conv2dParams& p);
// dw[O, k, KH, KW]: the gradient of the first k input channels (per group) of
// the weight.  x holds xc channels: xc == C (the full input) or, only when
// groups == 1, xc == k (the input already sliced to its first k channels).
void conv2d_bwd_weight(const float* dy, const float* x, float* dw, const Conv2dParams& p, i64 k, i64 xc);
// db[O] = sum over N, OH, OW of dy
void conv2d_bwd_bias(const float* dy, float* db, const Conv2dParams& p);

// ---------------------------------------------------------------- pool2d.cpp
// PyTorch semantics, incl. ceil_mode (OH/OW already computed by the compiler).
struct Pool2dParams {
  i64 N, C, H, W, OH, OW, KH, KW;
  i64 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  bool count_include_pad;
  i64 divisor_override;  // 0 = none
};
// idx holds the flat h*W+w argmax inside each [H,W] plane (int32)
void max_pool2d_fwd(const float* x, float* y, int32_t* idx, const Pool2dParams& p);
void max_pool2d_bwd(const float* dy, const int32_t* idx, float* dx, const Pool2dParams& p);
void avg_pool2d_fwd(const float* x, float* y, const Pool2dParams& p);
void avg_pool2d_bwd(const float* dy, float* dx, const Pool2dParams& p);
// adaptive average pooling, PyTorch's start=floor(i*H/OH), end=ceil((i+1)*H/OH)
void adaptive_avg_pool2d_fwd(const float* x, float* y, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW);
void adaptive_avg_pool2d_bwd(const float* dy, float* dx, i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW);

// ---------------------------------------------------------------- embedding.cpp
// y[n, D] = w[idx[n], :]   (the generated step checks the indices first; a row whose
// index is outside [0, V) is zeros, never read with, and the first such n is returned, -1 if none)
i64 embedding_fwd(const float* w, const int64_t* idx, float* y, i64 n, i64 V, i64 D);
// dw[V, k] = 0; dw[idx[i], 0:k] += dy[i, 0:k]  (skipping idx == padding_idx; -1 = none;
// and skipping an idx outside [0, V): the first such i is returned, -1 if none)
i64 embedding_bwd(const float* dy, const int64_t* idx, float* dw, i64 n, i64 V, i64 D, i64 k, i64 padding_idx);
// dw = base (another gradient of the table; base == dw: in place, only n rows touched),
// then the same row sums as embedding_bwd
i64 embedding_bwd_onto(const float* dy, const int64_t* idx, const float* base, float* dw, i64 n, i64 V, i64 D,
                       i64 k, i64 padding_idx);
// Whether the rows dw[idx[i], 0:k] that embedding_bwd(_onto) wrote hold no NaN/inf (rows at
// padding_idx or outside [0, V) are skipped, as there): the exact guard's check of its
// gradient, where every other row is zero (or base's rows, checked where base was made)
bool embedding_rows_finite(const float* dw, const int64_t* idx, i64 n, i64 V, i64 k, i64 padding_idx);

// ---------------------------------------------------------------- rms_norm.cpp
// y = w * x / sqrt(mean(x^2) + eps) per row of cols (w nullable); rstd [rows] saved.
void rms_norm_fwd(const float* x, const float* w, float* y, float* rstd, i64 rows, i64 cols, float eps);
// dx, dw nullable (not wanted); dw overwritten.
void rms_norm_bwd(const float* dy, const float* x, const float* rstd, const float* w, float* dx, float* dw, i64 rows,
                  i64 cols);

// ---------------------------------------------------------------- swiglu.cpp
// y = silu(gate) * up;  backward: dgate, dup (either nullable).
void swiglu_fwd(const float* gate, const float* up, float* y, i64 n);
void swiglu_bwd(const float* dy, const float* gate, const float* up, float* dgate, float* dup, i64 n);

// ---------------------------------------------------------------- rope.cpp
// y = x * cos + rotate_half(x) * sin over rows of D (x, y [outer, rep, inner]; cos, sin
// [outer if cos_outer else 1, inner], broadcast over rep); backward: dx from dy (the transpose).
// tmajor: x, y are [outer, inner / D, rep, D] instead (heads inside positions: a projection
// split into heads, [B, T, H, D], read in place).
void rope_fwd(const float* x, const float* cos, const float* sin, float* y, i64 outer, i64 rep, i64 inner, i64 D,
              i64 cos_outer, i64 tmajor = 0);
void rope_bwd(const float* dy, const float* cos, const float* sin, float* dx, i64 outer, i64 rep, i64 inner, i64 D,
              i64 cos_outer, i64 tmajor = 0);

// ---------------------------------------------------------------- layer_norm.cpp
// rows x cols, normalised over cols; w, b nullable; mean/rstd [rows] are saved.
void layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                    i64 rows, i64 cols, float eps);
// dx, dw, db nullable (not wanted). dw/db are overwritten (not accumulated).
void layer_norm_bwd(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                    float* dx, float* dw, float* db, i64 rows, i64 cols);

// ---------------------------------------------------------------- batch_norm.cpp
// x[N,C,S] (S = product of spatial dims, may be 1). w, b nullable.
// Train mode: batch statistics; save_mean/save_invstd [C]; new_rm/new_rv [C]
// are the updated running statistics (momentum, unbiased variance) as PyTorch.
void batch_norm_train_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                          float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                          i64 N, i64 C, i64 S, float momentum, float eps);
// y = act(batch_norm(x)); the other outputs as batch_norm_train_fwd
void batch_norm_train_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                              float* y, float* save_mean, float* save_invstd, float* new_rm, float* new_rv,
                              i64 N, i64 C, i64 S, float momentum, float eps, Act act);
void batch_norm_train_bwd(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const float* w, float* dx, float* dw, float* db, i64 N, i64 C, i64 S);
// The backward of the _act forward: dy masked by act's derivative at its output y, then as above.
void batch_norm_train_bwd_act(const float* dy, const float* y, const float* x, const float* save_mean,
                              const float* save_invstd, const float* w, float* dx, float* dw, float* db, i64 N,
                              i64 C, i64 S, Act act);
// Eval mode: running statistics.
void batch_norm_eval_fwd(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                         float* y, i64 N, i64 C, i64 S, float eps);
void batch_norm_eval_fwd_act(const float* x, const float* w, const float* b, const float* rm, const float* rv,
                             float* y, i64 N, i64 C, i64 S, float eps, Act act);
// dx = dy*w*invstd; dw = sum dy*(x-rm)*invstd; db = sum dy   (each nullable)
void batch_norm_eval_bwd(const float* dy, const float* x, const float* rm, const float* rv, const float* w,
                         float* dx, float* dw, float* db, i64 N, i64 C, i64 S, float eps);

// ---------------------------------------------------------------- activation.cpp
void relu_fwd(const float* x, float* y, i64 n);
void relu_bwd(const float* dy, const float* y, float* dx, i64 n);        // uses the output
void hardtanh_fwd(const float* x, float* y, i64 n, float lo, float hi);
void hardtanh_bwd(const float* dy, const float* x, float* dx, i64 n, float lo, float hi);  // 0 outside (lo,hi)
void sigmoid_fwd(const float* x, float* y, i64 n);
void sigmoid_bwd(const float* dy, const float* y, float* dx, i64 n);     // uses the output
void tanh_fwd(const float* x, float* y, i64 n);
void tanh_bwd(const float* dy, const float* y, float* dx, i64 n);        // uses the output
void silu_fwd(const float* x, float* y, i64 n);
void silu_bwd(const float* dy, const float* x, float* dx, i64 n);
// approximate: false = erf form, true = tanh form (PyTorch approximate="tanh")
void gelu_fwd(const float* x, float* y, i64 n, bool approximate);
void gelu_bwd(const float* dy, const float* x, float* dx, i64 n, bool approximate);

// ---------------------------------------------------------------- elementwise.cpp
enum class Unary { Exp, Log, Sqrt, Rsqrt, Neg, Abs, Reciprocal };
void unary(Unary op, const float* x, float* y, i64 n);
// y = x + c, y = x * c, y = c - x, y = x ^ e
void add_scalar(const float* x, float* y, i64 n, float c);
void mul_scalar(const float* x, float* y, i64 n, float c);
void rsub_scalar(const float* x, float* y, i64 n, float c);
void pow_scalar(const float* x, float* y, i64 n, float e);
// dx = dy * e * x^(e-1)
void pow_scalar_bwd(const float* dy, const float* x, float* dx, i64 n, float e);

// Binary ops with numpy broadcasting. out has `ndim` dims of sizes shape[];
// a/b are read at sum_d i_d * sa[d] (resp. sb[d]); stride 0 broadcasts.
enum class Binary { Add, Sub, Mul, Div };
struct Broadcast {
  int ndim;
  i64 shape[kMaxDims];
  i64 sa[kMaxDims];
  i64 sb[kMaxDims];
};
void binary(Binary op, const float* a, const float* b, float* out, const Broadcast& p);
// out = where(cond, a, b) with broadcasting (cond is uint8 0/1, strides in sc)
struct Where {
  int ndim;
  i64 shape[kMaxDims];
  i64 sc[kMaxDims], sa[kMaxDims], sb[kMaxDims];
};
void where(const uint8_t* cond, const float* a, const float* b, float* out, const Where& p);

// ---------------------------------------------------------------- compare.cpp
// out = (a op b) as uint8 0/1 with broadcasting (And/Or: both/either nonzero).
enum class Compare { Eq, Ne, Lt, Le, Gt, Ge, And, Or };
template <typename T> void compare(Compare op, const T* a, const T* b, uint8_t* out, const Broadcast& p);
// y = D(x) elementwise (bool/int -> float masks, float -> int ids).
template <typename S, typename D> void cast(const S* x, D* y, i64 n);
enum class Trig { Cos, Sin };
void trig(Trig op, const float* x, float* y, i64 n);
// out = a op b on integer tensors (position ids, masks) with broadcasting; Div is not used.
template <typename T> void ibinary(Binary op, const T* a, const T* b, T* out, const Broadcast& p);
// y = running sum of x along the middle dim of [outer, n, inner] (reverse: from the end),
// accumulated in D (int64 for integer x, float for float x).
template <typename S, typename D> void cumsum(const S* x, D* y, i64 outer, i64 n, i64 inner, bool reverse);

// ---------------------------------------------------------------- reduce.cpp
// y = scale * sum of x over the dims with reduce[d] = true.
// x has `ndim` dims of sizes shape[]; y is contiguous with the reduced dims
// of size 1 (so keepdim and not-keepdim share the same memory layout).
// Used for sum, mean (scale = 1/count) and the gradient of broadcasting.
struct Reduce {
  int ndim;
  i64 shape[kMaxDims];
  bool reduce[kMaxDims];
  float scale;
};
void reduce_sum(const float* x, float* y, const Reduce& p);

// ---------------------------------------------------------------- copy.cpp
// The one data-movement kernel: permute, expand, slice (with step), cat,
// the backward of slice, and contiguous copies are all strided copies:
//   for every index i over shape[]:
//     y[out_offset + sum_d i_d*out_strides[d]] = x[in_offset + sum_d i_d*in_strides[d]]
struct StridedCopy {
  int ndim;
  i64 shape[kMaxDims];
  i64 in_strides[kMaxDims];
  i64 in_offset;
  i64 out_strides[kMaxDims];
  i64 out_offset;
};
template <typename T> void strided_copy(const T* x, T* y, const StridedCopy& p);
template <typename T> void fill(T* y, i64 n, T value);

// ---------------------------------------------------------------- softmax.cpp
// x viewed as [outer, dim, inner]; softmax over the middle axis.
void softmax_fwd(const float* x, float* y, i64 outer, i64 dim, i64 inner);
void softmax_bwd(const float* dy, const float* y, float* dx, i64 outer, i64 dim, i64 inner);
void log_softmax_fwd(const float* x, float* y, i64 outer, i64 dim, i64 inner);
void log_softmax_bwd(const float* dy, const float* y, float* dx, i64 outer, i64 dim, i64 inner);

// ---------------------------------------------------------------- loss.cpp
// Mean over the targets that are != ignore_index (PyTorch reduction="mean").
// label_smoothing as in F.cross_entropy. loss is a single float.
// These four skip a target that is neither ignore_index nor in [0, C) (never read with)
// and return the first such row, -1 when none.
i64 cross_entropy_fwd(const float* logits, const int64_t* target, float* loss, i64 N, i64 C,
                      i64 ignore_index, float label_smoothing);
// dlogits = dloss[0] * d(loss)/d(logits)
i64 cross_entropy_bwd(const float* dloss, const float* logits, const int64_t* target, float* dlogits,
                      i64 N, i64 C, i64 ignore_index, float label_smoothing);
// nll_loss on log-probabilities logp[N,C], mean reduction
i64 nll_loss_fwd(const float* logp, const int64_t* target, float* loss, i64 N, i64 C, i64 ignore_index);
i64 nll_loss_bwd(const float* dloss, const int64_t* target, float* dlogp, i64 N, i64 C, i64 ignore_index);
// loss = mean((a-b)^2) over n elements; da = dloss*2(a-b)/n (db = -da, nullable)
void mse_loss_fwd(const float* a, const float* b, float* loss, i64 n);
void mse_loss_bwd(const float* dloss, const float* a, const float* b, float* da, float* db, i64 n);

// ---------------------------------------------------------------- attention.cpp
// q[B,L,E], k[B,S,E], v[B,S,Ev] (B = all leading dims flattened), out[B,L,Ev];
// lse[B,L] saves each row's log-sum-exp of the masked, scaled scores (+inf for a
// fully masked row): with q, k, v and out all the backward needs (flash-style,
// it recomputes the probabilities block by block; no [L,S] buffer is kept).
// mask: mask_kind 0 none, 1 bool (uint8, 1 = attend), 2 float (added to the
// scores); element (b,l,s) is at mask[b*mask_sb + l*mask_sl + s*mask_ss].
// causal: s > l is masked (PyTorch is_causal, top-left aligned).
// Rows with every position masked give zeros (PyTorch gives NaN; documented).
// Heads and layouts (the defaults give the dense layout above): B = N * H
// (batch, query head); k and v have H / group heads and query head h reads kv
// head h / group (grouped-query attention).  Operand x of q, k, v, out holds
// element (n, h, row, e) at x[n*sb + h*sh + row*sr + e] (sr == 0: dense, e.g.
// [N, H, L, E]; a [N, L, H, E] tensor has sb = L*H*E, sh = E, sr = H*E); dq, dk,
// dv and dout share the layouts of q, k, v and out.
struct SdpaLayout {
  i64 sb = 0, sh = 0, sr = 0;
};
struct SdpaParams {
  i64 B, L, S, E, Ev;
  float scale;
  bool causal;
  int mask_kind;
  i64 mask_sb, mask_sl, mask_ss;
  i64 H = 1, group = 1;
  SdpaLayout q{}, k{}, v{}, o{};
};
void sdpa_fwd(const float* q, const float* k, const float* v, const void* mask, float* out, float* lse,
              const SdpaParams& p);
// dq, dk, dv nullable; out and lse as the forward left them.  scratch: B*S*(E+Ev)
// floats under grouped-query attention (group > 1) when dk or dv is wanted (each
// query head's dk, dv before a group's are summed), else unused (nullable).
void sdpa_bwd(const float* dout, const float* q, const float* k, const float* v, const float* out,
              const float* lse, const void* mask, float* dq, float* dk, float* dv, float* scratch,
              const SdpaParams& p);
// probs[B,L,S] = the attention probabilities again, from q, k, mask and the
// forward's lse (the gradient of a learned additive mask needs them whole).
void sdpa_probs(const float* q, const float* k, const void* mask, const float* lse, float* probs,
                const SdpaParams& p);

// ---------------------------------------------------------------- lstm.cpp
// One layer, one direction, batch-first, PyTorch gate order (i, f, g, o).
//   x[B,T,I]; h0[B,P], c0[B,H] (nullable = zeros)
//   w_ih[4H,I], w_hh[4H,P], b_ih[4H], b_hh[4H] (biases nullable together),
//   w_hr[P,H] when proj (P = proj_size), else P == H and w_hr is null.
// Outputs: y[B,T,P], hn[B,P], cn[B,H].
// Saved for the backward: gates[T,B,4H] (activated i,f,g,o), cells[T,B,H] (c_t),
//   hraw[T,B,H] (o*tanh(c_t), only used when proj; may be null otherwise).
struct LstmParams {
  i64 B, T, I, H, P;
  bool has_bias, has_proj;
};
void lstm_fwd(const float* x, const float* h0, const float* c0, const float* w_ih, const float* w_hh,
              const float* b_ih, const float* b_hh, const float* w_hr, float* y, float* hn, float* cn,
              float* gates, float* cells, float* hraw, const LstmParams& p);
// Gradients, each nullable (not wanted). dw_ih is [4H, k_ih] (first k_ih input
// columns), dw_hh is [4H, k_hh], dw_hr is [P, k_hr]; db_ih == db_hh (both
// written when non-null). dy [B,T,P]; dhn [B,P] and dcn [B,H] nullable (= 0).
// scratch: lstm_bwd_scratch_floats(p) floats, laid out as
//   dG[T,B,4H] | dc[B,H] | proj: dh[T,B,P] dr[B,H]  /  no proj: dh[B,P].
inline i64 lstm_bwd_scratch_floats(const LstmParams& p) {
  return p.T * p.B * 4 * p.H + p.B * p.H + (p.has_proj ? p.T * p.B * p.P + p.B * p.H : p.B * p.P);
}
void lstm_bwd(const float* dy, const float* dhn, const float* dcn, const float* x, const float* h0,
              const float* c0, const float* w_ih, const float* w_hh, const float* w_hr, const float* y,
              const float* gates, const float* cells, const float* hraw, float* dx, float* dh0, float* dc0,
              float* dw_ih, float* dw_hh, float* db_ih, float* db_hh, float* dw_hr, float* scratch,
              const LstmParams& p, i64 k_ih, i64 k_hh, i64 k_hr);

// ---------------------------------------------------------------- gru.cpp
// One layer, one direction, batch-first, PyTorch gate order (r, z, n):
//   r = σ(W_ir x + b_ir + W_hr h + b_hr); z = σ(...); n = tanh(W_in x + b_in + r*(W_hn h + b_hn))
//   h' = (1-z)*n + z*h
// x[B,T,I], h0[B,H] nullable, w_ih[3H,I], w_hh[3H,H], b_ih/b_hh[3H] nullable.
// Outputs y[B,T,H], hn[B,H]; saved[T,B,4H] = (r, z, n, W_hn h + b_hn) per step.
struct GruParams {
  i64 B, T, I, H;
  bool has_bias;
};
void gru_fwd(const float* x, const float* h0, const float* w_ih, const float* w_hh, const float* b_ih,
             const float* b_hh, float* y, float* hn, float* saved, const GruParams& p);
// scratch: gru_bwd_scratch_floats(p) floats, laid out as dG[T,B,4H] | dh[B,H].
inline i64 gru_bwd_scratch_floats(const GruParams& p) { return p.T * p.B * 4 * p.H + p.B * p.H; }
void gru_bwd(const float* dy, const float* dhn, const float* x, const float* h0, const float* w_ih,
             const float* w_hh, const float* y, const float* saved, float* dx, float* dh0, float* dw_ih,
             float* dw_hh, float* db_ih, float* db_hh, float* scratch, const GruParams& p, i64 k_ih, i64 k_hh);

// ---------------------------------------------------------------- dropout.cpp
// Our own counter-based RNG (not PyTorch's stream): keep element i iff
// hash(seed, i) >= p; kept elements are scaled by 1/(1-p). mask is 0/1.
void dropout_fwd(const float* x, float* y, uint8_t* mask, i64 n, float p, uint64_t seed);
void dropout_bwd(const float* dy, const uint8_t* mask, float* dx, i64 n, float p);

// ---------------------------------------------------------------- optimizer.cpp
// The updated elements of a parameter: for o in [0,outer), j in [0,inner):
//   param[o*stride + j]  <->  grad/state[o*inner + j]
// (the whole tensor: outer=1, inner=stride=numel; the first k input channels of
//  a weight [O, C, ...]: outer=O, inner=k*prod(rest), stride=C*prod(rest)).
struct UpdateRegion {
  i64 outer, inner, stride;
};
// torch.optim.SGD: d = g + wd*p; if momentum: buf = first_step ? d : momentum*buf + (1-dampening)*d;
// d = nesterov ? d + momentum*buf : buf;  p -= lr*d.   buf nullable when momentum == 0.
// check_finite: scan g first (the non-finite guard folded into the update, over the same
// thread split); a NaN/inf leaves p and buf untouched and returns false.  true otherwise.
bool sgd_update(float* p, const float* g, float* buf, const UpdateRegion& r, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step, bool check_finite = false);
// torch.optim.AdamW (amsgrad=False): p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps).   step t is 1-based.
// check_finite: as for sgd_update (p, m and v untouched and false on a NaN/inf in g).
bool adamw_update(float* p, const float* g, float* m, float* v, const UpdateRegion& r, float lr, float beta1,
                  float beta2, float eps, float weight_decay, i64 step, bool check_finite = false);
// The optimizer update fused into the weight gradient (linear.cpp): dw = dy^T x[:, 0:k]
// exactly as linear_bwd_weight computes it, each finished tile updating p (region r, as
// sgd_update/adamw_update take it for this gradient) and the state in place; dw is
// scratch (it ends up holding partial sums, not the gradient).  p and the state end
// bit-identical to linear_bwd_weight followed by sgd_update/adamw_update.
// check_finite: a tile with a NaN/inf gradient is not applied and false is returned;
// unlike the unfused kernels the other tiles may already be updated (the partial-step
// semantics of exact_skip=False, where alone this fusion is used).
bool linear_bwd_weight_sgd(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
                           float* buf, const UpdateRegion& r, float lr, float momentum, float dampening,
                           float weight_decay, bool nesterov, bool first_step, bool check_finite = false);
bool linear_bwd_weight_adamw(const float* dy, const float* x, float* dw, i64 M, i64 N, i64 k, i64 ldx, float* p,
                             float* m, float* v, const UpdateRegion& r, float lr, float beta1, float beta2, float eps,
                             float weight_decay, i64 step, bool check_finite = false);

}  // namespace pk

// ---------------------------------------------------------------- guards.cpp
namespace pk {
// The first i in [0, n) whose idx[i] is outside [lo, hi) and not ignore_index
// (when has_ignore), or -1: the generated step runs it on the indices of every
// gather (embedding rows, class targets) before the gather itself.
i64 first_bad_index(const int64_t* idx, i64 n, i64 lo, i64 hi, i64 ignore_index, bool has_ignore);
// Whether x[0:n] holds no NaN or inf (the non-finite guard, before an update).
bool all_finite(const float* x, i64 n);
}  // namespace pk
