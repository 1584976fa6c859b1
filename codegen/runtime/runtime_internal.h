// runtime_internal.h — what pock_api.cpp and checkpoint.cpp share.  Not public:
// callers see only the opaque pock_trainer of pock.h.
#pragma once
#include <cstdint>
#include <string>

#include "pock_model.h"

namespace pock_rt {
class ThreadPool;  // threadpool.cpp
}

struct pock_trainer {
  const PockModel* model;
  uint8_t* arena;  // model->arena_bytes, 64-byte aligned, scratch for one call
  uint8_t* state;  // model->state_bytes, 64-byte aligned, persistent
  float lr;
  int64_t steps;   // optimizer steps completed
  int32_t num_threads;
  pock_rt::ThreadPool* pool = nullptr;  // num_threads threads (the caller included); owned
  PockProfile* profile = nullptr;       // per-node counters while profiling (profile.cpp); owned
  void* backend = nullptr;              // model->backend_open's state for this trainer
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
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);  // crc32_update(0, ...) starts
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
