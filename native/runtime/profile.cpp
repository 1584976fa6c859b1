// profile.cpp — per-op profiling of the training step (pock_profile_* of pock.h)
// and the hooks the generated step calls (pock_model.h).
//
// A trainer's profile is its own: pock_profile_enable allocates the counters
// into the pock_trainer, make_ctx (pock_api.cpp) hands them to the step in
// ctx->profile, pock_profile_enable(t, 0) and pock_close free them.  No
// registry, no lock: calls on one trainer are serialised by the caller
// (pock.h), and nothing in a step allocates.
#include <chrono>
#include <cstring>
#include <memory>
#include <new>

#include "runtime_internal.h"

using pock_rt::fail;

struct PockProfile {
  int32_t n_nodes;
  int64_t steps;
  std::unique_ptr<int64_t[]> node_ns;  // [n_nodes]
};

namespace {

const PockNodeTable* node_table(const pock_trainer* t) {
  const PockNodeTable* table = t->model->step_nodes;
  return table && table->n_nodes > 0 && table->nodes ? table : nullptr;
}

#define CHECK_TRAINER(t, fn) \
  if (!(t)) return fail(POCK_ERR_INVALID_ARGUMENT, "%s: trainer is NULL", fn)

}  // namespace

void pock_rt::profile_free(PockProfile* p) { delete p; }

// ---------------------------------------------------------------- step hooks
PockProfile* pock_profile_begin(const PockCtx* ctx) { return ctx->profile; }

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
    if (!on) {
      pock_rt::profile_free(t->profile);
      t->profile = nullptr;
      return POCK_OK;
    }
    if (t->profile) return POCK_OK;
    const PockNodeTable* table = node_table(t);
    if (!table)
      return fail(POCK_ERR_INVALID_ARGUMENT,
                  "pock_profile_enable: model '%s' was generated without profiling hooks; regenerate it with "
                  "this version of PockEngine",
                  t->model->name);
    std::unique_ptr<PockProfile> fresh(new PockProfile{table->n_nodes, 0, nullptr});
    fresh->node_ns.reset(new int64_t[static_cast<size_t>(table->n_nodes)]());
    t->profile = fresh.release();
    return POCK_OK;
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "pock_profile_enable: out of memory");
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "pock_profile_enable: internal error");
  }
}

POCK_API pock_status pock_profile_reset(pock_trainer* t) {
  CHECK_TRAINER(t, "pock_profile_reset");
  if (PockProfile* p = t->profile) {
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
  if (const PockProfile* p = t->profile) {
    out->steps = p->steps;
    out->total_ns = p->node_ns[index];
  }
  return POCK_OK;
}

}  // extern "C"
