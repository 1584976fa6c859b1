// elementwise.cpp — unary ops, scalar ops, broadcasting binary ops and where.
//
// Broadcasting kernels first "coalesce" the iteration space: size-1 dims are
// dropped and neighbouring dims that are contiguous for every operand are
// merged.  Equal-shape contiguous operands become one flat loop, a scalar
// operand becomes one flat loop with stride 0, and a row vector becomes rows
// of contiguous+contiguous loops.  The innermost loop is then specialised on
// the operand strides (1/1, 1/0, 0/1, general) so the common cases vectorize.
//
// Threads (pk::parallel_for): flat loops are split in chunks whose boundaries
// are multiples of kAlign (every element runs the same instructions whatever
// the split), broadcast loops by whole innermost rows; results are
// bit-identical for any thread count.  exp uses fast_exp (1 ulp, vectorizes;
// the same function as in activation.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fast_math.h"
#include "pock_kernels.h"
#include "pock_parallel.h"

namespace pk {

namespace {

constexpr i64 kGrain = 1 << 15;  // elements per chunk, at least
constexpr i64 kAlign = 64;


using fastmath::fast_exp;

// A coalesced iteration space over a contiguous output and K strided inputs.
template <int K>
struct Layout {
  int nd = 0;
  i64 total = 1;
  i64 shape[kMaxDims];
  i64 st[K][kMaxDims];
};

template <int K>
Layout<K> coalesce(int ndim, const i64* shape, const i64* const* strides) {
  Layout<K> L;
  for (int d = 0; d < ndim; ++d) L.total *= shape[d];
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    if (L.nd > 0) {
      bool merge = true;
      for (int k = 0; k < K; ++k) merge = merge && L.st[k][L.nd - 1] == strides[k][d] * shape[d];
      if (merge) {
        L.shape[L.nd - 1] *= shape[d];
        for (int k = 0; k < K; ++k) L.st[k][L.nd - 1] = strides[k][d];
        continue;
      }
    }
    L.shape[L.nd] = shape[d];
    for (int k = 0; k < K; ++k) L.st[k][L.nd] = strides[k][d];
    ++L.nd;
  }
  if (L.nd == 0) {  // a scalar (or all dims of size 1)
    L.nd = 1;
    L.shape[0] = 1;
    for (int k = 0; k < K; ++k) L.st[k][0] = 0;
  }
  return L;
}

// Calls row(out_offset, in_offsets[K], n) for every innermost row, the rows
// split over the threads (one row: its [0, n) split, aligned).
template <int K, class Row>
void for_each_row(const Layout<K>& L, Row row) {
  if (L.total == 0) return;
  const int nd = L.nd;
  const i64 n = L.shape[nd - 1];
  const i64 rows = L.total / n;
  if (rows == 1) {
    parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
      i64 off[K];
      for (int k = 0; k < K; ++k) off[k] = b * L.st[k][nd - 1];
      row(b, off, e - b);
    });
    return;
  }
  parallel_for(rows, n >= kGrain ? 1 : kGrain / n, [&](i64 r0, i64 r1) {
    i64 idx[kMaxDims] = {0};
    i64 off[K] = {0};
    i64 rem = r0;
    for (int d = nd - 2; d >= 0; --d) {  // position at row r0
      idx[d] = rem % L.shape[d];
      rem /= L.shape[d];
      for (int k = 0; k < K; ++k) off[k] += idx[d] * L.st[k][d];
    }
    i64 out = r0 * n;
    for (i64 r = r0; r < r1; ++r) {
      row(out, off, n);
      out += n;
      for (int d = nd - 2; d >= 0; --d) {
        if (++idx[d] < L.shape[d]) {
          for (int k = 0; k < K; ++k) off[k] += L.st[k][d];
          break;
        }
        for (int k = 0; k < K; ++k) off[k] -= L.st[k][d] * (L.shape[d] - 1);
        idx[d] = 0;
      }
    }
  });
}

template <Binary OP>
inline float bop(float a, float b) {
  if constexpr (OP == Binary::Add) return a + b;
  if constexpr (OP == Binary::Sub) return a - b;
  if constexpr (OP == Binary::Mul) return a * b;
  return a / b;
}

// One innermost row of a binary op, specialised on the operand strides.
template <Binary OP>
void binary_row(const float* a, i64 sa, const float* b, i64 sb, float* o, i64 n) {
  if (sa == 1 && sb == 1) {
    for (i64 i = 0; i < n; ++i) o[i] = bop<OP>(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = *b;
    for (i64 i = 0; i < n; ++i) o[i] = bop<OP>(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = *a;
    for (i64 i = 0; i < n; ++i) o[i] = bop<OP>(av, b[i]);
  } else {
    for (i64 i = 0; i < n; ++i) o[i] = bop<OP>(a[i * sa], b[i * sb]);
  }
}

template <Binary OP>
void binary_impl(const float* a, const float* b, float* out, const Broadcast& p) {
  const i64* strides[2] = {p.sa, p.sb};
  const Layout<2> L = coalesce<2>(p.ndim, p.shape, strides);
  const i64 sa = L.st[0][L.nd - 1], sb = L.st[1][L.nd - 1];
  for_each_row<2>(L, [&](i64 o, const i64* off, i64 n) { binary_row<OP>(a + off[0], sa, b + off[1], sb, out + o, n); });
}

// x^e with PyTorch's special cases for common exponents (pow_tensor_scalar).
void pow_row(const float* x, float* y, i64 n, float e) {
  if (e == 2.f) {
    for (i64 i = 0; i < n; ++i) y[i] = x[i] * x[i];
  } else if (e == 3.f) {
    for (i64 i = 0; i < n; ++i) y[i] = x[i] * x[i] * x[i];
  } else if (e == 1.f) {
    for (i64 i = 0; i < n; ++i) y[i] = x[i];
  } else if (e == 0.5f) {
    for (i64 i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
  } else if (e == -0.5f) {
    for (i64 i = 0; i < n; ++i) y[i] = 1.f / std::sqrt(x[i]);
  } else if (e == -1.f) {
    for (i64 i = 0; i < n; ++i) y[i] = 1.f / x[i];
  } else if (e == -2.f) {
    for (i64 i = 0; i < n; ++i) y[i] = 1.f / (x[i] * x[i]);
  } else if (e == 0.f) {
    for (i64 i = 0; i < n; ++i) y[i] = 1.f;
  } else {
    for (i64 i = 0; i < n; ++i) y[i] = std::pow(x[i], e);
  }
}

}  // namespace

// y = op(x) elementwise.
void unary(Unary op, const float* x, float* y, i64 n) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    switch (op) {
      case Unary::Exp:
        for (i64 i = b; i < e; ++i) y[i] = fast_exp(x[i]);
        break;
      case Unary::Log:
        for (i64 i = b; i < e; ++i) y[i] = std::log(x[i]);
        break;
      case Unary::Sqrt:
        for (i64 i = b; i < e; ++i) y[i] = std::sqrt(x[i]);
        break;
      case Unary::Rsqrt:
        for (i64 i = b; i < e; ++i) y[i] = 1.f / std::sqrt(x[i]);
        break;
      case Unary::Neg:
        for (i64 i = b; i < e; ++i) y[i] = -x[i];
        break;
      case Unary::Abs:
        for (i64 i = b; i < e; ++i) y[i] = std::fabs(x[i]);
        break;
      case Unary::Reciprocal:
        for (i64 i = b; i < e; ++i) y[i] = 1.f / x[i];
        break;
    }
  });
}

// y = x + c
void add_scalar(const float* x, float* y, i64 n, float c) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) y[i] = x[i] + c;
  });
}

// y = x * c
void mul_scalar(const float* x, float* y, i64 n, float c) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) y[i] = x[i] * c;
  });
}

// y = c - x
void rsub_scalar(const float* x, float* y, i64 n, float c) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) y[i] = c - x[i];
  });
}

// y = x ^ e
void pow_scalar(const float* x, float* y, i64 n, float e) {
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 end) { pow_row(x + b, y + b, end - b, e); });
}

// dx = dy * e * x^(e-1); e == 0 gives exactly 0 (as PyTorch's pow_backward).
void pow_scalar_bwd(const float* dy, const float* x, float* dx, i64 n, float e) {
  if (e == 0.f) {
    parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 end) {
      for (i64 i = b; i < end; ++i) dx[i] = 0.f;
    });
    return;
  }
  // Chunked through a stack buffer so dx may alias dy or x.
  parallel_for_aligned(n, kGrain, kAlign, [&](i64 b, i64 end) {
    constexpr i64 kChunk = 256;
    float t[kChunk];
    for (i64 i0 = b; i0 < end; i0 += kChunk) {
      const i64 m = end - i0 < kChunk ? end - i0 : kChunk;
      pow_row(x + i0, t, m, e - 1.f);
      for (i64 i = 0; i < m; ++i) dx[i0 + i] = dy[i0 + i] * (e * t[i]);
    }
  });
}

// out = a op b with numpy broadcasting (strides 0 broadcast).
void binary(Binary op, const float* a, const float* b, float* out, const Broadcast& p) {
  switch (op) {
    case Binary::Add: binary_impl<Binary::Add>(a, b, out, p); break;
    case Binary::Sub: binary_impl<Binary::Sub>(a, b, out, p); break;
    case Binary::Mul: binary_impl<Binary::Mul>(a, b, out, p); break;
    case Binary::Div: binary_impl<Binary::Div>(a, b, out, p); break;
  }
}

// out = cond ? a : b with broadcasting.
void where(const uint8_t* cond, const float* a, const float* b, float* out, const Where& p) {
  const i64* strides[3] = {p.sc, p.sa, p.sb};
  const Layout<3> L = coalesce<3>(p.ndim, p.shape, strides);
  const i64 sc = L.st[0][L.nd - 1], sa = L.st[1][L.nd - 1], sb = L.st[2][L.nd - 1];
  for_each_row<3>(L, [&](i64 o, const i64* off, i64 n) {
    const uint8_t* c = cond + off[0];
    const float* pa = a + off[1];
    const float* pb = b + off[2];
    float* po = out + o;
    if (sc == 1 && sa == 1 && sb == 1) {
      for (i64 i = 0; i < n; ++i) po[i] = c[i] ? pa[i] : pb[i];
    } else {
      for (i64 i = 0; i < n; ++i) po[i] = c[i * sc] ? pa[i * sa] : pb[i * sb];
    }
  });
}

}  // namespace pk
