// profile.cpp — per-op profiling of the training step (pock_profile_* of pock.h)
// and the hooks the generated step calls (pock_model.h).
//
// The generated step does not know its trainer: it gets a PockCtx, built by
// pock_api.cpp.  So the profiles live here, one per profiled trainer, found by
// the trainer's state buffer (ctx->state), which is unique to a live trainer
// and never moves.  Counters are allocated by pock_profile_enable, never in a
// step.  When no trainer is being profiled, pock_profile_begin is one relaxed
// atomic load; otherwise it takes a mutex once per step (not per node).
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "runtime_internal.h"

using pock_rt::fail;

struct PockProfile {
  const pock_trainer* trainer;
  const uint8_t* state;  // the key pock_profile_begin looks up
  int32_t n_nodes;
  int64_t steps;
  std::unique_ptr<int64_t[]> node_ns;  // [n_nodes]
};

namespace {

std::mutex g_mu;
std::vector<std::unique_ptr<PockProfile>> g_profiles;  // guarded by g_mu
std::atomic<int32_t> g_active{0};                       // g_profiles.size()

// Caller holds g_mu.
PockProfile* find_locked(const pock_trainer* t) {
  for (auto& p : g_profiles)
    if (p->trainer == t && p->state == t->state) return p.get();
  return nullptr;
}

// Caller holds g_mu.  Drop profiles left by trainers closed while profiling
// whose address or state buffer `t` now reuses.
void drop_stale_locked(const pock_trainer* t) {
  for (auto it = g_profiles.begin(); it != g_profiles.end();) {
    const bool stale = ((*it)->trainer == t) != ((*it)->state == t->state);
    it = stale ? g_profiles.erase(it) : it + 1;
  }
  g_active.store(static_cast<int32_t>(g_profiles.size()), std::memory_order_relaxed);
}

const PockNodeTable* node_table(const pock_trainer* t) {
  const PockNodeTable* table = t->model->step_nodes;
  return table && table->n_nodes > 0 && table->nodes ? table : nullptr;
}

#define CHECK_TRAINER(t, fn) \
  if (!(t)) return fail(POCK_ERR_INVALID_ARGUMENT, "%s: trainer is NULL", fn)

}  // namespace

// ---------------------------------------------------------------- step hooks
PockProfile* pock_profile_begin(const PockCtx* ctx) {
  if (g_active.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& p : g_profiles)
    if (p->state == ctx->state) return p.get();
  return nullptr;
}

int64_t pock_profile_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t pock_profile_node(PockProfile* p, int32_t node, int64_t t0) {
  const int64_t now = pock_profile_now();
  if (node >= 0 && node < p->n_nodes) p->node_ns[node] += now - t0;
  return now;
}

void pock_profile_end(PockProfile* p) { p->steps += 1; }

// ---------------------------------------------------------------- C API
extern "C" {

POCK_API pock_status pock_profile_enable(pock_trainer* t, int32_t on) {
  CHECK_TRAINER(t, "pock_profile_enable");
  try {
    std::lock_guard<std::mutex> lock(g_mu);
    drop_stale_locked(t);
    PockProfile* p = find_locked(t);
    if (!on) {
      if (p) {
        for (auto it = g_profiles.begin(); it != g_profiles.end(); ++it)
          if (it->get() == p) {
            g_profiles.erase(it);
            break;
          }
        g_active.store(static_cast<int32_t>(g_profiles.size()), std::memory_order_relaxed);
      }
      return POCK_OK;
    }
    if (p) return POCK_OK;
    const PockNodeTable* table = node_table(t);
    if (!table)
      return fail(POCK_ERR_INVALID_ARGUMENT,
                  "pock_profile_enable: model '%s' was generated without profiling hooks; regenerate it with "
                  "this version of PockEngine",
                  t->model->name);
    std::unique_ptr<PockProfile> fresh(new PockProfile{t, t->state, table->n_nodes, 0, nullptr});
    fresh->node_ns.reset(new int64_t[static_cast<size_t>(table->n_nodes)]());
    g_profiles.push_back(std::move(fresh));
    g_active.store(static_cast<int32_t>(g_profiles.size()), std::memory_order_relaxed);
    return POCK_OK;
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "pock_profile_enable: out of memory");
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "pock_profile_enable: internal error");
  }
}

POCK_API pock_status pock_profile_reset(pock_trainer* t) {
  CHECK_TRAINER(t, "pock_profile_reset");
  std::lock_guard<std::mutex> lock(g_mu);
  if (PockProfile* p = find_locked(t)) {
    p->steps = 0;
    std::memset(p->node_ns.get(), 0, sizeof(int64_t) * static_cast<size_t>(p->n_nodes));
  }
  return POCK_OK;
}

POCK_API int32_t pock_profile_count(pock_trainer* t) {
  if (!t) {
    fail(POCK_ERR_INVALID_ARGUMENT, "pock_profile_count: trainer is NULL");
    return -1;
  }
  const PockNodeTable* table = node_table(t);
  return table ? table->n_nodes : 0;
}

POCK_API pock_status pock_profile_entry(pock_trainer* t, int32_t index, pock_node_profile* out) {
  CHECK_TRAINER(t, "pock_profile_entry");
  if (!out) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_profile_entry: out is NULL");
  const PockNodeTable* table = node_table(t);
  const int32_t n = table ? table->n_nodes : 0;
  if (index < 0 || index >= n)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_profile_entry: index %d is outside [0, %d)", index, n);
  const PockNodeInfo& info = table->nodes[index];
  std::memset(out, 0, sizeof(*out));
  out->index = index;
  out->phase = info.phase;
  out->op = info.op;
  out->kernel = info.kernel;
  out->module = info.module;
  out->flops = info.flops;
  std::lock_guard<std::mutex> lock(g_mu);
  if (const PockProfile* p = find_locked(t)) {
    out->steps = p->steps;
    out->total_ns = p->node_ns[index];
  }
  return POCK_OK;
}

}  // extern "C"
