// pock_parallel.h — the one way kernels use threads.
//
//   pk::parallel_for(n, grain, [&](i64 begin, i64 end) { ... });
//
// splits [0, n) into contiguous chunks of at least `grain` items and runs
// them on the calling trainer's persistent thread pool (the calling thread
// takes part). It returns when every chunk is done. Nothing allocates: the
// callable is passed by reference through a type-erased function_ref.
// Outside a step, or with one thread, the whole range runs inline.
// Kernels must give each chunk disjoint outputs (no atomics needed).
#pragma once
#include <cstdint>
#include <utility>

namespace pk {

using i64 = int64_t;

// A non-owning, non-allocating reference to a callable void(i64, i64).
class RangeFn {
 public:
  template <typename F>
  RangeFn(F& f) : obj_(&f), call_([](void* o, i64 b, i64 e) { (*static_cast<F*>(o))(b, e); }) {}
  void operator()(i64 b, i64 e) const { call_(obj_, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, i64, i64);
};

// Work thresholds.  Handing chunks to the other threads costs several
// microseconds (waking a sleeping core, then the join), more on a busy machine,
// so a chunk must hold enough work to pay for it; a kernel whose whole work is
// less than two chunks runs on the calling thread (parallel_for never splits
// below `grain`).  Kernels size their grain from these, in one of two units:
//   kMinChunkMacs   vectorized multiply-adds (~10 us at ~25 G/s on one core);
//   kMinChunkElems  floats streamed through memory by a cheap pointwise or
//                   row kernel (~10 us at a few GB/s).
constexpr i64 kMinChunkMacs = i64(1) << 18;
constexpr i64 kMinChunkElems = i64(1) << 15;
// Items per chunk so that a chunk holds at least `min_work` when one item costs `per_item`.
inline i64 grain_for_work(i64 per_item, i64 min_work) {
  if (per_item < 1) per_item = 1;
  return per_item >= min_work ? 1 : (min_work + per_item - 1) / per_item;
}

// Implemented in native/runtime/threadpool.cpp.
void parallel_for_impl(i64 n, i64 grain, RangeFn fn);
// Threads available to the current step (1 outside a step).
int num_threads();
// Whether a parallel_for now would really share its chunks: false outside a
// step, inside a chunk, on one thread, and while the pool is backed off on a
// busy machine (threadpool.cpp), when every chunk runs on the caller.  A kernel
// whose split costs more than its unsplit form when run in one thread (and
// gives the same results) picks the split only when this holds.
bool parallel_now();

template <typename F>
inline void parallel_for(i64 n, i64 grain, F&& f) {
  if (n <= 0) return;
  auto& ref = f;
  parallel_for_impl(n, grain < 1 ? 1 : grain, RangeFn(ref));
}

// parallel_for whose chunk boundaries are multiples of `align` elements (the
// last chunk ends at n): element i always goes through the same instructions
// (a vector body, never a remainder a thread split created), so results are
// bit-identical for any thread count.
template <typename F>
inline void parallel_for_aligned(i64 n, i64 grain, i64 align, F&& f) {
  parallel_for(n, grain, [&](i64 b, i64 e) {
    b = (b + align - 1) / align * align;
    e = e == n ? n : (e + align - 1) / align * align;
    if (e > n) e = n;
    if (b < e) f(b, e);
  });
}

}  // namespace pk
