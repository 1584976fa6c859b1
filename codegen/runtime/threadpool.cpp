// threadpool.cpp — the persistent per-trainer thread pool behind pk::parallel_for.
//
// A pool of `size` threads is the calling thread plus size-1 workers, created
// once (pock_open / pock_set_num_threads) and joined by pock_close.  During
// pock_step / pock_forward a PoolScope makes the trainer's pool current on the
// calling thread (a thread_local pointer); everywhere else, and inside a chunk
// (nested parallel_for), the whole range runs inline.
//
// One job at a time: run() publishes the job under the mutex and bumps a
// generation counter; workers (spinning briefly, then sleeping on a condition
// variable) join it under the mutex while it is open and then claim chunks
// with an atomic counter, the calling thread claiming chunks too.  run()
// closes the job and waits until every worker that joined has left it, so the
// job (and the caller's callable) is never touched after run() returns.
// Nothing is allocated per call.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "pock_parallel.h"
#include "runtime_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PK_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define PK_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define PK_CPU_RELAX() ((void)0)
#endif

namespace pock_rt {

class ThreadPool {
 public:
  explicit ThreadPool(int size) : size_(size < 1 ? 1 : size) {
    workers_.reserve(static_cast<size_t>(size_ - 1));
    try {
      for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ~ThreadPool() { shutdown(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Runs chunks [0, nchunks) of [0, n) (chunk c is [c*n/nchunks, (c+1)*n/nchunks)).
  // Returns false (having run nothing) when the pool is already busy, e.g.
  // two threads stepping one trainer at once; the caller then runs inline.
  bool run(pk::i64 n, int nchunks, pk::RangeFn fn) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      nchunks_ = nchunks;
      next_.store(0, std::memory_order_relaxed);
      open_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr err;
    try {
      work();
    } catch (...) {  // let no worker start another chunk, wait for the rest, rethrow
      err = std::current_exception();
      next_.store(nchunks_, std::memory_order_relaxed);
    }
    {
      std::unique_lock<std::mutex> lk(mu_);
      open_ = false;  // no worker joins from now on
      done_.wait(lk, [this] { return active_ == 0; });
      fn_ = nullptr;
    }
    busy_.store(false, std::memory_order_release);
    if (err) std::rethrow_exception(err);
    return true;
  }

 private:
  // Claim and run chunks of the current job until none is left.
  void work() {
    for (;;) {
      const int c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= nchunks_) return;
      const pk::i64 b = n_ * c / nchunks_, e = n_ * (c + 1) / nchunks_;
      (*fn_)(b, e);
    }
  }

  void worker_loop();
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> gen_{0};  // bumped (under mu_) for every job and for stop
  std::atomic<int> next_{0};      // next chunk to claim
  // The current job; written under mu_ while no worker is active.
  const pk::RangeFn* fn_ = nullptr;
  pk::i64 n_ = 0;
  int nchunks_ = 0;
  bool open_ = false;
  bool stop_ = false;
  int active_ = 0;  // workers inside the current job
};

namespace {
thread_local ThreadPool* tl_pool = nullptr;    // the current step's pool
thread_local bool tl_in_parallel = false;      // inside a chunk: nested calls run inline
}  // namespace

void ThreadPool::worker_loop() {
  tl_in_parallel = true;  // a worker never starts a parallel region of its own
  // gen_ was 0 when the pool was constructed: a job or stop published before
  // this thread got here is still seen as new.
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly (back-to-back parallel_for calls in one step), then sleep.
    for (int i = 0; i < 4000 && gen_.load(std::memory_order_acquire) == seen; ++i) PK_CPU_RELAX();
    std::unique_lock<std::mutex> lk(mu_);
    wake_.wait(lk, [&] { return gen_.load(std::memory_order_relaxed) != seen; });
    seen = gen_.load(std::memory_order_relaxed);
    if (stop_) return;
    if (!open_) continue;  // woke after that job closed
    ++active_;
    lk.unlock();
    work();
    lk.lock();
    if (--active_ == 0) done_.notify_one();
  }
}

int default_num_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min(n, 1024u));
}

ThreadPool* pool_create(int threads) { return new ThreadPool(threads); }
void pool_destroy(ThreadPool* pool) { delete pool; }
int pool_size(const ThreadPool* pool) { return pool ? pool->size() : 1; }

PoolScope::PoolScope(ThreadPool* pool) : prev_(tl_pool) { tl_pool = pool; }
PoolScope::~PoolScope() { tl_pool = prev_; }

}  // namespace pock_rt

namespace pk {

void parallel_for_impl(i64 n, i64 grain, RangeFn fn) {
  pock_rt::ThreadPool* pool = pock_rt::tl_pool;
  const i64 max_chunks = n / grain;
  if (pool == nullptr || pock_rt::tl_in_parallel || pool->size() <= 1 || max_chunks <= 1) {
    fn(0, n);
    return;
  }
  // Up to 4 chunks per thread, claimed dynamically: a thread that is slow
  // (a busy or a little core) holds the others back by one small chunk only.
  const int nchunks = static_cast<int>(std::min<i64>(max_chunks, 4 * i64(pool->size())));
  struct InParallel {  // restores the flag even if fn throws
    InParallel() { pock_rt::tl_in_parallel = true; }
    ~InParallel() { pock_rt::tl_in_parallel = false; }
  } guard;
  if (!pool->run(n, nchunks, fn)) fn(0, n);
}

int num_threads() {
  pock_rt::ThreadPool* pool = pock_rt::tl_pool;
  return pool == nullptr || pock_rt::tl_in_parallel ? 1 : pool->size();
}

}  // namespace pk
