// threadpool.cpp — the persistent per-trainer thread pool behind pk::parallel_for.
//
// A pool of `size` threads is the calling thread plus size-1 workers, created
// once (pock_open / pock_set_num_threads) and joined by pock_close.  During
// pock_step / pock_forward a PoolScope makes the trainer's pool current on the
// calling thread (a thread_local pointer); everywhere else, and inside a chunk
// (nested parallel_for), the whole range runs inline.
//
// One job at a time, handed over without locks or system calls while the
// workers are awake: run() writes the job, opens it and bumps a generation
// counter; a worker that sees the new generation counts itself in (active_),
// checks the job is still open and claims chunks with an atomic counter, the
// calling thread claiming chunks too.  run() then closes the job and waits
// until every worker that counted itself in has left, so the job (and the
// caller's callable) is never touched after run() returns.  (Count in, then
// check open, against run()'s close, then read the count: all sequentially
// consistent, so a worker either is waited for or never touches the job.)
//
// Idle workers.  A step's parallel regions are short (a batch-1 LSTM step has
// ~80 of a few microseconds each) and come close together, so an idle worker
// spins for the next job -- kPauseSpins pauses, then sched_yield, which hands
// the core to any other thread that wants it -- for kSpinNs of running time,
// then sleeps on a condition variable.  Waking a sleeper costs a system call
// and, on a virtual machine, an inter-processor interrupt: tens of microseconds,
// more than such a region's work (the worker then arrives after the caller has
// done every chunk).  run() makes that call only when a worker sleeps, and once.
//
// A busy machine.  When other processes want the cores, a second thread gains
// nothing and costs the caller: the worker is descheduled (the caller does
// every chunk, or waits for one the worker claimed), and the scheduler shares
// CPU time between processes (autogroups, cgroups), so a runnable worker takes
// its share from the caller.  The evidence comes in windows: a worker's share
// of a core over kShareWindowNs of wall time (its thread CPU time against the
// clock, looked at after a job and while spinning), and the caller's wait for a
// worker still inside a chunk after the caller ran out of chunks (longer than
// the caller's own work in that region and than kCallerWaitNs: the worker was
// descheduled mid-chunk).  One short dip proves nothing -- a quiet 2-core VM
// takes a timer tick, a daemon's wake-up, the hypervisor's steal now and then,
// and a single 1 ms window under 85% once made the pool give up its second core
// for spells of 100 ms to 1.6 s on such a machine -- so the pool backs off only
// after kBusyWindows busy windows in a row (a calm window starts the count over):
// the worker sleeps, and run() does every chunk itself, in order, without waking
// anyone (the same chunks, so the same results).  A back-off lasts kBackoffNs;
// then the pool tries again, and the first busy window of that try backs off at
// once for twice as long (up to kBackoffNs << kMaxBackoffLevel), while one calm
// window ends the busy spell: the pool is back on both cores within
// kShareWindowNs of the machine going quiet, after at most the current spell.
// The back-off events are counted (pool_backoffs) for tests.
//
// Nothing is allocated per call.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
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

namespace {
// How long (running time) an idle worker spins for the next job before it
// sleeps: longer than the gaps between a step's parallel regions and between
// the steps of a training loop, short enough that an idle trainer frees the core.
constexpr int64_t kSpinNs = 2'000'000;
constexpr int kPauseSpins = 1 << 10;  // ~30-60 us of pauses before the spin yields
// A gap this long between two looks at the clock while spinning: the worker was
// descheduled (the gap is not running time; its window tells the pool).
constexpr int64_t kGapNs = 200'000;
// Back-off after sustained evidence of a busy machine: regions run on the caller
// alone for kBackoffNs << level.
constexpr int64_t kBackoffNs = 25'000'000;
constexpr int kMaxBackoffLevel = 3;
constexpr int kBusyWindows = 6;  // busy windows in a row before the first back-off
// A worker's window: wall time over which its share of a core is judged; below
// kMinShare the window is busy.
constexpr int64_t kShareWindowNs = 2'000'000;
constexpr double kMinShare = 0.75;
// The caller's wait for a worker inside its chunk that counts as a busy window
// (when it is also longer than the caller's own work in the region).
constexpr int64_t kCallerWaitNs = 300'000;
int64_t thread_cpu_ns() {  // CPU time of the calling thread (-1 where unknown)
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
#endif
  return -1;
}
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

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
  // Whether the pool is backed off (run() would do every chunk on the caller).
  bool backed_off() const {
    return backoff_.load(std::memory_order_relaxed) && now_ns() < backoff_until_.load(std::memory_order_relaxed);
  }
  // Backed off for ns from now, as a busy machine would do it (a test's way there).
  void back_off_for(int64_t ns) {
    backoff_until_.store(now_ns() + ns, std::memory_order_relaxed);
    backoff_.store(true, std::memory_order_relaxed);
  }
  // One window of evidence from a worker or the caller: busy (the machine wants
  // the cores) or calm.  Backs off after kBusyWindows busy windows in a row, or
  // at the first busy one after a back-off of the same spell; a calm window
  // ends the spell.  Evidence that arrives while backed off changes nothing.
  void note_window(bool busy, int64_t now) {
    if (backoff_.load(std::memory_order_relaxed) && now < backoff_until_.load(std::memory_order_relaxed)) return;
    if (!busy) {
      strikes_.store(0, std::memory_order_relaxed);
      backoff_level_.store(0, std::memory_order_relaxed);
      return;
    }
    const int strikes = strikes_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (backoff_level_.load(std::memory_order_relaxed) > 0 || strikes >= kBusyWindows) back_off(now);
  }
  int64_t backoffs() const { return backoffs_.load(std::memory_order_relaxed); }
  int64_t regions() const { return regions_.load(std::memory_order_relaxed); }
  int64_t dispatches() const { return dispatches_.load(std::memory_order_relaxed); }

  // Runs chunks [0, nchunks) of [0, n) (chunk c is [c*n/nchunks, (c+1)*n/nchunks)).
  // Returns false (having run nothing) when the pool is already busy, e.g.
  // two threads stepping one trainer at once; the caller then runs inline.
  bool run(pk::i64 n, int nchunks, pk::RangeFn fn) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    regions_.fetch_add(1, std::memory_order_relaxed);
    if (backoff_.load(std::memory_order_relaxed)) {
      if (now_ns() < backoff_until_.load(std::memory_order_relaxed)) {
        struct Release {  // busy_ is released even if fn throws
          std::atomic<bool>& b;
          ~Release() { b.store(false, std::memory_order_release); }
        } release{busy_};
        for (int c = 0; c < nchunks; ++c) fn(n * c / nchunks, n * (c + 1) / nchunks);
        return true;
      }
      backoff_.store(false, std::memory_order_relaxed);
    }
    dispatch(n, nchunks, fn);
    return true;
  }

 private:
  void dispatch(pk::i64 n, int nchunks, pk::RangeFn& fn) {
    // No worker is inside a job here (the last dispatch waited for active_ == 0),
    // and a worker that counts itself in from now on reads open_ first.
    fn_ = &fn;
    n_ = n;
    nchunks_ = nchunks;
    next_.store(0, std::memory_order_relaxed);
    open_.store(true);  // seq_cst (a release: the fields above are visible to whoever sees it open)
    gen_.fetch_add(1);
    dispatches_.fetch_add(1, std::memory_order_relaxed);
    // Wake the sleepers, once: a worker woken earlier but not running yet (a
    // busy machine) is not woken again by every region that follows.
    if (sleepers_.load() > 0 && !wake_sent_.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        wake_sent_.store(true, std::memory_order_relaxed);
      }
      wake_.notify_all();
    }
    std::exception_ptr err;
    const int64_t t0 = now_ns();
    try {
      work();
    } catch (...) {  // let no worker start another chunk, wait for the rest, rethrow
      err = std::current_exception();
      next_.store(nchunks_, std::memory_order_relaxed);
    }
    open_.store(false);  // no worker joins from now on
    if (active_.load() != 0) {  // a worker is still inside a chunk
      const int64_t t1 = now_ns();
      wait_workers();
      const int64_t waited = now_ns() - t1;
      // It took longer than the caller's whole share of the region: descheduled mid-chunk.
      if (waited > kCallerWaitNs && waited > t1 - t0) note_window(true, t1 + waited);
    }
    fn_ = nullptr;
    busy_.store(false, std::memory_order_release);
    if (err) std::rethrow_exception(err);
  }

  // Spins until the workers inside the closed job have left (yielding after a
  // while: a worker descheduled inside its chunk needs a core to finish it).
  void wait_workers() {
    for (int i = 1; active_.load() != 0; ++i) {
      if (i < kPauseSpins) PK_CPU_RELAX();
      else std::this_thread::yield();
    }
  }
  void back_off(int64_t now) {
    const int level = backoff_level_.load(std::memory_order_relaxed);
    backoff_until_.store(now + (kBackoffNs << level), std::memory_order_relaxed);
    backoff_.store(true, std::memory_order_relaxed);
    strikes_.store(0, std::memory_order_relaxed);
    if (level < kMaxBackoffLevel) backoff_level_.store(level + 1, std::memory_order_relaxed);
    backoffs_.fetch_add(1, std::memory_order_relaxed);
  }

  // Claim and run chunks of the current job until none is left.
  void work() {
    for (;;) {
      const int c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= nchunks_) return;
      const pk::i64 b = n_ * c / nchunks_, e = n_ * (c + 1) / nchunks_;
      (*fn_)(b, e);
    }
  }

  // A worker's share of a core since it last woke, judged per kShareWindowNs.
  struct Window {
    int64_t wall, cpu;
    void start() {
      wall = now_ns();
      cpu = thread_cpu_ns();
    }
  };
  // Closes the worker's window `w` (a busy or calm note) once it spans kShareWindowNs.
  void check_window(Window& w, int64_t now) {
    if (now - w.wall < kShareWindowNs) return;
    const int64_t cpu = thread_cpu_ns();
    if (cpu >= 0 && w.cpu >= 0)
      note_window(static_cast<double>(cpu - w.cpu) < kMinShare * static_cast<double>(now - w.wall), now);
    w.wall = now;
    w.cpu = cpu;
  }
  // Spins until gen_ moves past `seen` (returns true, the new value in g) or
  // the spin ends (false): kSpinNs of running time.  Closes windows on the way.
  bool spin(uint64_t seen, uint64_t& g, Window& w);
  void worker_loop();
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
      gen_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;  // only for sleeping and waking
  std::condition_variable wake_;
  std::atomic<bool> busy_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> backoff_{false};           // regions run on the caller alone ...
  std::atomic<int64_t> backoff_until_{0};      // ... until then (now_ns)
  std::atomic<int> backoff_level_{0};          // the next back-off lasts kBackoffNs << level
  std::atomic<int> strikes_{0};                // busy windows in a row
  std::atomic<int64_t> backoffs_{0};           // back-off events (note_window), for tests
  std::atomic<int64_t> regions_{0};            // parallel regions that reached the pool
  std::atomic<int64_t> dispatches_{0};         // of those, handed to the workers
  // The hot words on their own cache lines: the caller writes gen_/open_ once a
  // job, every thread claims chunks on next_, workers count in and out on active_.
  alignas(64) std::atomic<uint64_t> gen_{0};  // bumped for every job and for stop
  std::atomic<bool> open_{false};             // the current job takes workers
  std::atomic<int> sleepers_{0};              // workers asleep (or about to be) on wake_
  std::atomic<bool> wake_sent_{false};        // notified since a worker last went to sleep (set under mu_)
  // The current job; written only while no worker is inside one.
  const pk::RangeFn* fn_ = nullptr;
  pk::i64 n_ = 0;
  int nchunks_ = 0;
  alignas(64) std::atomic<int> next_{0};    // next chunk to claim
  alignas(64) std::atomic<int> active_{0};  // workers counted into the current job
};

namespace {
thread_local ThreadPool* tl_pool = nullptr;    // the current step's pool
thread_local bool tl_in_parallel = false;      // inside a chunk: nested calls run inline
}  // namespace

bool ThreadPool::spin(uint64_t seen, uint64_t& g, Window& w) {
  int64_t spun = 0, t = now_ns();
  for (int i = 1;; ++i) {
    if ((g = gen_.load(std::memory_order_acquire)) != seen) return true;
    const bool yielding = i > kPauseSpins;
    if (yielding) std::this_thread::yield();  // the core goes to any other thread that wants it
    else PK_CPU_RELAX();
    if (yielding || (i & 63) == 0) {
      const int64_t t1 = now_ns(), dt = t1 - t;
      t = t1;
      check_window(w, t1);
      if (dt < kGapNs && (spun += dt) > kSpinNs) return false;  // a gap was not running time
    }
  }
}

void ThreadPool::worker_loop() {
  tl_in_parallel = true;  // a worker never starts a parallel region of its own
  // gen_ was 0 when the pool was constructed: a job or stop published before
  // this thread got here is still seen as new.
  uint64_t seen = 0;
  // The share of wall time this worker is on a core (jobs and spinning), in
  // windows since it last woke: it is descheduled inside jobs too, which the
  // spin cannot see.
  Window w;
  w.start();
  for (;;) {
    uint64_t g = gen_.load(std::memory_order_acquire);
    if (g == seen && !spin(seen, g, w)) {  // sleep until run() or shutdown() bumps gen_
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);  // seq_cst, then gen_ read: dispatch() bumps gen_, then reads sleepers_
      wake_sent_.store(false, std::memory_order_relaxed);
      wake_.wait(lk, [&] { return (g = gen_.load()) != seen; });
      sleepers_.fetch_sub(1);
      lk.unlock();
      w.start();
    }
    seen = g;
    if (stop_.load()) return;
    active_.fetch_add(1);  // count in, then check open (dispatch() closes, then reads active_)
    if (open_.load()) work();
    active_.fetch_sub(1, std::memory_order_release);
    check_window(w, now_ns());
  }
}

int default_num_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min(n, 1024u));
}

ThreadPool* pool_create(int threads) { return new ThreadPool(threads); }
void pool_destroy(ThreadPool* pool) { delete pool; }
int pool_size(const ThreadPool* pool) { return pool ? pool->size() : 1; }
int64_t pool_regions(const ThreadPool* pool) { return pool ? pool->regions() : 0; }
int64_t pool_dispatches(const ThreadPool* pool) { return pool ? pool->dispatches() : 0; }
void pool_back_off_for(ThreadPool* pool, int64_t ns) {
  if (pool) pool->back_off_for(ns);
}
int64_t pool_backoffs(const ThreadPool* pool) { return pool ? pool->backoffs() : 0; }
void pool_note_window(ThreadPool* pool, bool busy) {
  if (pool) pool->note_window(busy, now_ns());
}
bool pool_backed_off(const ThreadPool* pool) { return pool && pool->backed_off(); }

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

bool parallel_now() {
  pock_rt::ThreadPool* pool = pock_rt::tl_pool;
  return pool != nullptr && !pock_rt::tl_in_parallel && pool->size() > 1 && !pool->backed_off();
}

int num_threads() {
  pock_rt::ThreadPool* pool = pock_rt::tl_pool;
  return pool == nullptr || pock_rt::tl_in_parallel ? 1 : pool->size();
}

}  // namespace pk
