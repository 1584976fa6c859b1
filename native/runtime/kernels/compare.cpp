// compare.cpp — the integer/boolean bookkeeping kernels of Hugging Face-style models:
// broadcasting comparisons and boolean and/or (uint8 0/1 out), dtype casts, cos/sin,
// integer add/sub/mul and cumsum (RoBERTa-style position ids from input_ids).
//
// Comparisons walk the broadcast index space with an odometer over Broadcast's strides
// (masks are small: [B, T] or [B, 1, T, T]); casts and trig are flat loops.
#include <cmath>
#include <cstdint>

#include "pock_kernels.h"

namespace pk {

namespace {

template <typename T>
inline uint8_t cmp(Compare op, T a, T b) {
  switch (op) {
    case Compare::Eq: return a == b;
    case Compare::Ne: return a != b;
    case Compare::Lt: return a < b;
    case Compare::Le: return a <= b;
    case Compare::Gt: return a > b;
    case Compare::Ge: return a >= b;
    case Compare::And: return (a != T(0)) && (b != T(0));
    case Compare::Or: return (a != T(0)) || (b != T(0));
  }
  return 0;
}

}  // namespace

// f(i, oa, ob) for every output element i, with oa / ob its offsets into a / b under the
// broadcast strides (an odometer over the output shape).
template <typename F>
void for_each_broadcast(const Broadcast& p, F f) {
  i64 idx[kMaxDims] = {0};
  i64 total = 1;
  for (int d = 0; d < p.ndim; ++d) total *= p.shape[d];
  i64 oa = 0, ob = 0;
  for (i64 i = 0; i < total; ++i) {
    f(i, oa, ob);
    for (int d = p.ndim - 1; d >= 0; --d) {  // odometer step
      ++idx[d];
      oa += p.sa[d];
      ob += p.sb[d];
      if (idx[d] < p.shape[d]) break;
      oa -= p.sa[d] * p.shape[d];
      ob -= p.sb[d] * p.shape[d];
      idx[d] = 0;
    }
  }
}

template <typename T>
void compare(Compare op, const T* a, const T* b, uint8_t* out, const Broadcast& p) {
  for_each_broadcast(p, [&](i64 i, i64 oa, i64 ob) { out[i] = cmp<T>(op, a[oa], b[ob]); });
}

template void compare<float>(Compare, const float*, const float*, uint8_t*, const Broadcast&);
template void compare<int64_t>(Compare, const int64_t*, const int64_t*, uint8_t*, const Broadcast&);
template void compare<int32_t>(Compare, const int32_t*, const int32_t*, uint8_t*, const Broadcast&);
template void compare<uint8_t>(Compare, const uint8_t*, const uint8_t*, uint8_t*, const Broadcast&);

template <typename S, typename D>
void cast(const S* x, D* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = static_cast<D>(x[i]);
}

#define PK_CAST(S, D) template void cast<S, D>(const S*, D*, i64);
PK_CAST(float, int64_t) PK_CAST(float, int32_t) PK_CAST(float, uint8_t)
PK_CAST(int64_t, float) PK_CAST(int64_t, int32_t) PK_CAST(int64_t, uint8_t)
PK_CAST(int32_t, float) PK_CAST(int32_t, int64_t) PK_CAST(int32_t, uint8_t)
PK_CAST(uint8_t, float) PK_CAST(uint8_t, int64_t) PK_CAST(uint8_t, int32_t)
#undef PK_CAST

template <typename T>
void ibinary(Binary op, const T* a, const T* b, T* out, const Broadcast& p) {
  for_each_broadcast(p, [&](i64 i, i64 oa, i64 ob) {
    const T x = a[oa], z = b[ob];
    out[i] = op == Binary::Add ? T(x + z) : op == Binary::Sub ? T(x - z) : T(x * z);
  });
}

template void ibinary<int64_t>(Binary, const int64_t*, const int64_t*, int64_t*, const Broadcast&);
template void ibinary<int32_t>(Binary, const int32_t*, const int32_t*, int32_t*, const Broadcast&);
template void ibinary<uint8_t>(Binary, const uint8_t*, const uint8_t*, uint8_t*, const Broadcast&);

template <typename S, typename D>
void cumsum(const S* x, D* y, i64 outer, i64 n, i64 inner, bool reverse) {
  for (i64 o = 0; o < outer; ++o) {
    for (i64 j = 0; j < inner; ++j) {
      D acc = D(0);
      for (i64 t = 0; t < n; ++t) {
        const i64 k = reverse ? n - 1 - t : t;
        const i64 at = (o * n + k) * inner + j;
        acc += static_cast<D>(x[at]);
        y[at] = acc;
      }
    }
  }
}

template void cumsum<float, float>(const float*, float*, i64, i64, i64, bool);
template void cumsum<int64_t, int64_t>(const int64_t*, int64_t*, i64, i64, i64, bool);
template void cumsum<int32_t, int64_t>(const int32_t*, int64_t*, i64, i64, i64, bool);
template void cumsum<uint8_t, int64_t>(const uint8_t*, int64_t*, i64, i64, i64, bool);

void trig(Trig op, const float* x, float* y, i64 n) {
  if (op == Trig::Cos) {
    for (i64 i = 0; i < n; ++i) y[i] = std::cos(x[i]);
  } else {
    for (i64 i = 0; i < n; ++i) y[i] = std::sin(x[i]);
  }
}

}  // namespace pk
