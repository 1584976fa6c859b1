// runtime_internal.h — what pock_api.cpp and checkpoint.cpp share.  Not public:
// callers see only the opaque pock_trainer of pock.h.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "pock_model.h"

namespace pock_rt {
class ThreadPool;  // threadpool.cpp
}

struct pock_trainer {
  const PockModel* model;
  uint8_t* arena;  // model->arena_bytes, 64-byte aligned, scratch for one call
  uint8_t* state;  // model->state_bytes, 64-byte aligned, persistent: inside state_map
  float lr;
  int64_t steps;   // optimizer steps completed
  int32_t num_threads;
  pock_rt::ThreadPool* pool = nullptr;  // num_threads threads (the caller included); owned
  PockProfile* profile = nullptr;       // per-node counters while profiling (profile.cpp); owned
  void* backend = nullptr;              // model->backend_open's state for this trainer
  // The mapping that holds `state` (checkpoint.cpp): anonymous, or a checkpoint's
  // data region mapped MAP_PRIVATE (frozen tensors read in place from the file).
  uint8_t* state_map = nullptr;
  size_t state_map_bytes = 0;
  bool state_mapped_file = false;
};

namespace pock_rt {

// Record `message` for pock_last_error() on this thread and return `s`.
pock_status fail(pock_status s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

const char* dtype_name(int32_t dtype);
// "(4, 3) float32", "(4,) int64", "() float32": numpy's way of writing shapes.
std::string describe(const int64_t* shape, int32_t ndim, int32_t dtype);
// Index of the state tensor called `name`, or -1.
int32_t find_state(const PockModel* m, const char* name);

// profile.cpp: frees a trainer's profile (pock_close); nullptr is fine.
void profile_free(PockProfile* p);

// checkpoint.cpp
pock_status save_checkpoint(const pock_trainer* t, const char* path);
pock_status load_checkpoint(pock_trainer* t, const char* path);
// load_checkpoint on bytes already in memory (`name` for messages): the fuzz target.
pock_status load_checkpoint_bytes(pock_trainer* t, const char* name, const uint8_t* data, size_t size);
// The trainer's state memory: state_alloc maps zero pages (false: out of memory),
// load_checkpoint may replace them by a checkpoint's mapped data region,
// state_release unmaps either.
bool state_alloc(pock_trainer* t);
void state_release(pock_trainer* t);
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);  // crc32_update(0, ...) starts
// Writes `path` as pock_save writes a checkpoint: through symbolic links (the link
// kept), refusing anything there but a regular file (FIFO, device, directory),
// into a unique temporary file beside it ("<path>.tmp-<pid>-<n>-<random>", cut to
// NAME_MAX) that is fsynced, renamed over the target and its directory fsynced;
// temporary files of dead processes are removed first.  `write` streams the
// content and returns 0 or an errno.  On failure nothing at path changes and the
// message starts with "<what> '<path>'" ("cannot save checkpoint").
pock_status write_file_atomically(const char* path, const char* what, const std::function<int(FILE*)>& write);

// Bounds-checked little-endian reads of a file's bytes (checkpoints): after the
// first read past the end every read gives zeros/"" and ok stays false.
struct ByteReader {
  const uint8_t* p;
  size_t size, pos = 0;
  bool ok = true;
  bool get(void* dst, size_t n) {
    if (!ok || n > size - pos) return ok = false;
    std::memcpy(dst, p + pos, n);
    pos += n;
    return true;
  }
  template <class T>
  T take() {
    T v{};
    get(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint32_t n = take<uint32_t>();
    if (!ok || n > size - pos) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};
// trained_ckpt.cpp: trained-only checkpoints (pock_save_trained; pock_load reads them too).
bool is_trained_checkpoint(const uint8_t* data, size_t size);
pock_status save_trained_checkpoint(const pock_trainer* t, const char* path);
pock_status load_trained_checkpoint(pock_trainer* t, const char* path, const uint8_t* data, size_t size);

// threadpool.cpp: the persistent pool behind pk::parallel_for.
int default_num_threads();                  // online cores, at least 1
ThreadPool* pool_create(int threads);       // threads - 1 workers; throws on failure
void pool_destroy(ThreadPool* pool);        // joins the workers (nullptr is fine)
int pool_size(const ThreadPool* pool);      // 1 for nullptr
// Parallel regions that reached the pool so far (those that ran inline, below
// their kernel's work threshold, outside a step or nested, do not count), and
// of those, the ones handed to the workers (the rest ran on the caller while
// the pool backed off on a busy machine); 0 for nullptr.
int64_t pool_regions(const ThreadPool* pool);
int64_t pool_dispatches(const ThreadPool* pool);
// Backs the pool off as a busy machine would (every region on the caller) for `ns`
// nanoseconds from now: how tests reach the back-off path without loading the machine.
void pool_back_off_for(ThreadPool* pool, int64_t ns);
// Back-off events of the pool so far (sustained evidence of a busy machine; not
// pool_back_off_for), and one window of that evidence fed by hand (busy or calm,
// as a worker's share of a core or the caller's wait would give it): the tests'
// view of the policy in threadpool.cpp.  0 / nothing for nullptr.
int64_t pool_backoffs(const ThreadPool* pool);
void pool_note_window(ThreadPool* pool, bool busy);
bool pool_backed_off(const ThreadPool* pool);  // backed off now (false for nullptr)
// Makes `pool` the current thread's pool (pk::parallel_for uses it) while alive.
class PoolScope {
 public:
  explicit PoolScope(ThreadPool* pool);
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  ThreadPool* prev_;
};

}  // namespace pock_rt
