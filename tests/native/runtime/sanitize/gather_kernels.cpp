// gather_kernels.cpp — the gather-like kernels called directly with hostile indices,
// built with -fsanitize=address,undefined by tests/native/runtime/test_sanitize_gathers.py
// (issue 13).  Every table, logit and target array is its own heap allocation of exactly
// its size, so a read one element out of bounds is an AddressSanitizer report.  Each kernel
// must never read with an index outside its range, must report the first bad position
// (return value), and must give the in-range rows what it gives them with good indices.
// Also: sgd_update/adamw_update with check_finite (the non-finite guard of exact_skip=False).
// Prints "ALL OK" and exits 0 when every check holds.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "pock_kernels.h"

using pk::i64;

namespace {

int g_failures = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);    \
      std::printf(__VA_ARGS__);                           \
      std::printf("\n");                                  \
      ++g_failures;                                       \
    }                                                     \
  } while (0)

const int64_t kHostile[] = {-1, -2, 12, 13, 1000000, -1000000, int64_t{1} << 32, int64_t{1} << 40,
                            std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};

// A heap array of exactly n elements (ASan redzones on both sides).
template <class T>
struct Heap {
  T* p;
  i64 n;
  explicit Heap(i64 count, T fill = T()) : p(new T[count > 0 ? count : 1]), n(count) {
    for (i64 i = 0; i < count; ++i) p[i] = fill;
  }
  ~Heap() { delete[] p; }
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;
};

float value(i64 i) { return static_cast<float>((i * 7919) % 1000) / 250.f - 2.f; }

bool same_bits(const float* a, const float* b, i64 n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

void check_embedding(i64 V, i64 D, i64 n, i64 bad_pos) {
  Heap<float> w(V * D);
  for (i64 i = 0; i < V * D; ++i) w.p[i] = value(i);
  for (int64_t hostile : kHostile) {
    if (hostile >= 0 && hostile < V) continue;
    Heap<int64_t> idx(n);
    for (i64 i = 0; i < n; ++i) idx.p[i] = (i * 5) % V;
    idx.p[bad_pos] = hostile;
    Heap<float> y(n * D, 123.f);
    const i64 r = pk::embedding_fwd(w.p, idx.p, y.p, n, V, D);
    CHECK(r == bad_pos, "embedding_fwd V=%lld id=%lld: returned %lld, want %lld", (long long)V, (long long)hostile,
          (long long)r, (long long)bad_pos);
    for (i64 i = 0; i < n; ++i) {
      if (i == bad_pos) {
        for (i64 d = 0; d < D; ++d) CHECK(y.p[i * D + d] == 0.f, "embedding_fwd: bad row %lld not zeroed", (long long)i);
      } else {
        CHECK(same_bits(y.p + i * D, w.p + idx.p[i] * D, D), "embedding_fwd: row %lld wrong", (long long)i);
      }
    }
    // the backward: the bad row adds nothing, the others their dy rows
    const i64 k = D > 1 ? D - 1 : 1;
    Heap<float> dy(n * D), dw(V * k, 9.f), want(V * k, 0.f);
    for (i64 i = 0; i < n * D; ++i) dy.p[i] = value(i + 17);
    for (i64 i = 0; i < n; ++i)
      if (i != bad_pos)
        for (i64 j = 0; j < k; ++j) want.p[idx.p[i] * k + j] += dy.p[i * D + j];
    const i64 rb = pk::embedding_bwd(dy.p, idx.p, dw.p, n, V, D, k, -1);
    CHECK(rb == bad_pos, "embedding_bwd id=%lld: returned %lld", (long long)hostile, (long long)rb);
    CHECK(same_bits(dw.p, want.p, V * k), "embedding_bwd id=%lld: dw wrong", (long long)hostile);
    // low precision tables (frozen_dtype): bf16, f16, i8 with a per-row scale
    Heap<uint16_t> w16(V * D, 0x3F80);  // 1.0 in bf16; 0x3F80 is ~1.875 in f16
    Heap<int8_t> w8(V * D, 3);
    Heap<float> scale(V, 0.5f);
    const pk::LowpDtype dts[] = {pk::LowpDtype::BF16, pk::LowpDtype::F16, pk::LowpDtype::I8};
    for (pk::LowpDtype dt : dts) {
      Heap<float> yl(n * D, 123.f);
      const void* table = dt == pk::LowpDtype::I8 ? static_cast<const void*>(w8.p) : static_cast<const void*>(w16.p);
      const i64 rl = pk::embedding_fwd_lowp(table, dt, dt == pk::LowpDtype::I8 ? scale.p : nullptr, idx.p, yl.p, n,
                                            V, D);
      CHECK(rl == bad_pos, "embedding_fwd_lowp dt=%d id=%lld: returned %lld", (int)dt, (long long)hostile,
            (long long)rl);
      for (i64 d = 0; d < D; ++d) CHECK(yl.p[bad_pos * D + d] == 0.f, "embedding_fwd_lowp: bad row not zeroed");
      const float want_v = dt == pk::LowpDtype::BF16 ? 1.f : dt == pk::LowpDtype::I8 ? 1.5f : 1.875f;
      for (i64 i = 0; i < n; ++i)
        if (i != bad_pos)
          for (i64 d = 0; d < D; ++d)
            CHECK(yl.p[i * D + d] == want_v, "embedding_fwd_lowp dt=%d: row %lld is %g", (int)dt, (long long)i,
                  yl.p[i * D + d]);
    }
    // the guard the generated step runs first finds the same position
    CHECK(pk::first_bad_index(idx.p, n, 0, V, -100, true) == bad_pos, "first_bad_index id=%lld", (long long)hostile);
  }
  // good ids: -1 everywhere
  Heap<int64_t> idx(n);
  for (i64 i = 0; i < n; ++i) idx.p[i] = (i * 3) % V;
  Heap<float> y(n * D);
  CHECK(pk::embedding_fwd(w.p, idx.p, y.p, n, V, D) == -1, "embedding_fwd good ids");
  CHECK(pk::first_bad_index(idx.p, n, 0, V, 0, false) == -1, "first_bad_index good ids");
}

void check_losses(i64 N, i64 C, i64 bad_pos) {
  const i64 ignore = -100;
  Heap<float> logits(N * C), logp(N * C);
  for (i64 i = 0; i < N * C; ++i) {
    logits.p[i] = value(i);
    logp.p[i] = -std::fabs(value(i + 3)) - 0.1f;
  }
  for (int64_t hostile : kHostile) {
    if (hostile == ignore || (hostile >= 0 && hostile < C)) continue;
    for (float ls : {0.f, 0.1f}) {
      Heap<int64_t> t(N), t_ign(N);
      for (i64 i = 0; i < N; ++i) t.p[i] = t_ign.p[i] = (i * 7) % C;
      t.p[bad_pos] = hostile;
      t_ign.p[bad_pos] = ignore;  // what the bad row must count as: ignored
      Heap<float> loss(1), loss_ref(1), dl(1, 1.f), d(N * C), d_ref(N * C);
      const i64 r = pk::cross_entropy_fwd(logits.p, t.p, loss.p, N, C, ignore, ls);
      pk::cross_entropy_fwd(logits.p, t_ign.p, loss_ref.p, N, C, ignore, ls);
      CHECK(r == bad_pos, "cross_entropy_fwd target=%lld: returned %lld", (long long)hostile, (long long)r);
      CHECK(same_bits(loss.p, loss_ref.p, 1), "cross_entropy_fwd target=%lld: loss %g != %g", (long long)hostile,
            loss.p[0], loss_ref.p[0]);
      const i64 rb = pk::cross_entropy_bwd(dl.p, logits.p, t.p, d.p, N, C, ignore, ls);
      pk::cross_entropy_bwd(dl.p, logits.p, t_ign.p, d_ref.p, N, C, ignore, ls);
      CHECK(rb == bad_pos, "cross_entropy_bwd target=%lld: returned %lld", (long long)hostile, (long long)rb);
      CHECK(same_bits(d.p, d_ref.p, N * C), "cross_entropy_bwd target=%lld: dlogits differ", (long long)hostile);
      if (ls != 0.f) continue;
      const i64 rn = pk::nll_loss_fwd(logp.p, t.p, loss.p, N, C, ignore);
      pk::nll_loss_fwd(logp.p, t_ign.p, loss_ref.p, N, C, ignore);
      CHECK(rn == bad_pos && same_bits(loss.p, loss_ref.p, 1), "nll_loss_fwd target=%lld", (long long)hostile);
      const i64 rnb = pk::nll_loss_bwd(dl.p, t.p, d.p, N, C, ignore);
      pk::nll_loss_bwd(dl.p, t_ign.p, d_ref.p, N, C, ignore);
      CHECK(rnb == bad_pos && same_bits(d.p, d_ref.p, N * C), "nll_loss_bwd target=%lld", (long long)hostile);
      CHECK(pk::first_bad_index(t.p, N, 0, C, ignore, true) == bad_pos, "first_bad_index target=%lld",
            (long long)hostile);
    }
  }
  // every target bad: loss 0 (nothing valid), still reported, nothing read
  Heap<int64_t> t(N, std::numeric_limits<int64_t>::max());
  Heap<float> loss(1), dl(1, 1.f), d(N * C);
  CHECK(pk::cross_entropy_fwd(logits.p, t.p, loss.p, N, C, ignore, 0.f) == 0 && loss.p[0] == 0.f, "all bad: fwd");
  CHECK(pk::cross_entropy_bwd(dl.p, logits.p, t.p, d.p, N, C, ignore, 0.f) == 0, "all bad: bwd");
  // good targets (and ignored ones): -1
  for (i64 i = 0; i < N; ++i) t.p[i] = i % 3 == 0 ? ignore : i % C;
  CHECK(pk::cross_entropy_fwd(logits.p, t.p, loss.p, N, C, ignore, 0.f) == -1, "good targets: fwd");
  CHECK(pk::nll_loss_fwd(logp.p, t.p, loss.p, N, C, ignore) == -1, "good targets: nll");
}

// The non-finite guard folded into the update kernels (exact_skip=False): with check_finite
// a NaN/inf anywhere in the region's gradient returns false and leaves the parameter and the
// optimizer state bit-identical; a finite gradient updates exactly as without the check.
void check_updates(i64 outer, i64 inner, i64 stride) {
  const i64 np = outer * stride, ng = outer * inner;
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (i64 where : {i64{0}, ng / 2, ng - 1}) {
      Heap<float> p(np), g(ng), m(ng), v(ng), p0(np), m0(ng), v0(ng);
      for (i64 i = 0; i < np; ++i) p.p[i] = p0.p[i] = value(i);
      for (i64 i = 0; i < ng; ++i) {
        g.p[i] = value(i + 5) * 0.1f;
        m.p[i] = m0.p[i] = value(i + 7) * 0.01f;
        v.p[i] = v0.p[i] = std::fabs(value(i + 9)) * 0.01f;
      }
      const float good = g.p[where];
      g.p[where] = poison;
      const pk::UpdateRegion r{outer, inner, stride};
      CHECK(!pk::adamw_update(p.p, g.p, m.p, v.p, r, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, true), "adamw: not skipped");
      CHECK(same_bits(p.p, p0.p, np) && same_bits(m.p, m0.p, ng) && same_bits(v.p, v0.p, ng), "adamw: state changed");
      CHECK(!pk::sgd_update(p.p, g.p, m.p, r, 0.1f, 0.9f, 0.f, 0.f, false, false, true), "sgd: not skipped");
      CHECK(same_bits(p.p, p0.p, np) && same_bits(m.p, m0.p, ng), "sgd: state changed");
      g.p[where] = good;  // finite: the checked update is the unchecked one
      Heap<float> q(np), mq(ng), vq(ng);
      std::memcpy(q.p, p.p, sizeof(float) * np);
      std::memcpy(mq.p, m.p, sizeof(float) * ng);
      std::memcpy(vq.p, v.p, sizeof(float) * ng);
      CHECK(pk::adamw_update(p.p, g.p, m.p, v.p, r, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, true), "adamw: skipped");
      pk::adamw_update(q.p, g.p, mq.p, vq.p, r, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
      CHECK(same_bits(p.p, q.p, np) && same_bits(m.p, mq.p, ng) && same_bits(v.p, vq.p, ng), "adamw: checked differs");
    }
  }
}

}  // namespace

int main() {
  check_updates(1, 100, 100);
  check_updates(1, 70000, 70000);  // one row split in chunks
  check_updates(8, 3, 5);          // a partial update: the first 3 of 5 columns
  check_updates(300, 200, 256);    // rows in parallel
  check_embedding(12, 4, 6, 3);
  check_embedding(12, 4, 6, 0);
  check_embedding(12, 4, 6, 5);
  check_embedding(50, 1024, 40, 17);  // n*D >= 2^15: the low-precision kernel's threaded path
  check_losses(6, 12, 2);
  check_losses(6, 12, 5);
  check_losses(300, 64, 123);        // the losses' partitioned sums
  if (g_failures) {
    std::printf("%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("ALL OK\n");
  return 0;
}
