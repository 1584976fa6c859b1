// pock_api.cpp — the C API of pock.h, written once over the PockModel that the
// generated translation unit hands back from pock_compiled_model().
//
// Every entry point: checks its pointers, validates what the caller gives it
// against the compiled description, and reports failures as a status plus a
// thread-local message.  No C++ exception crosses the C boundary.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include <sys/mman.h>

#include "runtime_internal.h"

#define POCK_RUNTIME_VERSION "0.1.0"

using pock_rt::describe;
using pock_rt::fail;

namespace {

thread_local std::string g_last_error;

constexpr size_t kAlign = 64;
constexpr int32_t kMaxThreads = 1024;

template <class F>
pock_status guarded(F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(POCK_ERR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "internal error: unknown exception");
  }
}

int64_t element_size(int32_t dtype) {
  switch (dtype) {
    case POCK_F32: return 4;
    case POCK_I64: return 8;
    case POCK_I32: return 4;
    case POCK_U8: return 1;
    case POCK_BF16: return 2;
    case POCK_F16: return 2;
    case POCK_I8: return 1;
    default: return 0;
  }
}

int64_t numel(const int64_t* shape, int32_t ndim) {
  int64_t n = 1;
  for (int32_t d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// The arena: zero pages mapped anonymous (page-aligned), so only the pages a call writes become
// private memory.  The arena serves the step's plan and forward()'s, and the larger one is often
// forward()'s (a fused LM head's step never holds the logits forward() returns): an app that
// only trains never pays for it.
size_t arena_size(int64_t nbytes) {
  const size_t size = (static_cast<size_t>(nbytes) + kAlign - 1) / kAlign * kAlign;
  return size == 0 ? kAlign : size;
}

uint8_t* alloc_zeroed(int64_t nbytes) {
  void* p = mmap(nullptr, arena_size(nbytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// The generated model is trusted, but a wrong offset would corrupt memory
// silently; check its description once when a trainer opens.
pock_status check_io_table(const PockModel* m, const char* what, const PockIO* io, int32_t n) {
  if (n > 0 && !io) return fail(POCK_ERR_INTERNAL, "model '%s': %s table is NULL", m->name, what);
  for (int32_t i = 0; i < n; ++i) {
    const PockIO& e = io[i];
    if (e.ndim < 0 || e.ndim > POCK_MAX_DIMS || element_size(e.dtype) == 0 ||
        e.nbytes != numel(e.shape, e.ndim) * element_size(e.dtype) || e.offset < 0 ||
        e.offset + e.nbytes > m->arena_bytes)
      return fail(POCK_ERR_INTERNAL, "model '%s': %s %d '%s' does not fit its arena (offset %lld, %lld of %lld bytes)",
                  m->name, what, i, e.name, (long long)e.offset, (long long)e.nbytes, (long long)m->arena_bytes);
  }
  return POCK_OK;
}

pock_status check_model(const PockModel* m) {
  if (!m) return fail(POCK_ERR_INTERNAL, "pock_compiled_model() returned NULL");
  if (m->arena_bytes < 0 || m->state_bytes < 0 || m->n_state < 0 || (m->n_state > 0 && !m->state))
    return fail(POCK_ERR_INTERNAL, "model '%s': malformed description", m->name);
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    if (s.ndim < 0 || s.ndim > POCK_MAX_DIMS || element_size(s.dtype) == 0 ||
        s.nbytes != numel(s.shape, s.ndim) * element_size(s.dtype) || s.offset < 0 ||
        s.offset + s.nbytes > m->state_bytes)
      return fail(POCK_ERR_INTERNAL, "model '%s': state tensor '%s' does not fit (offset %lld, %lld of %lld bytes)",
                  m->name, s.name, (long long)s.offset, (long long)s.nbytes, (long long)m->state_bytes);
  }
  if (m->step && (m->loss_offset < 0 || m->loss_offset + 4 > m->arena_bytes))
    return fail(POCK_ERR_INTERNAL, "model '%s': loss offset %lld is outside the arena", m->name,
                (long long)m->loss_offset);
  pock_status s = check_io_table(m, "input", m->inputs, m->n_inputs);
  if (s == POCK_OK) s = check_io_table(m, "target", m->targets, m->n_targets);
  if (s == POCK_OK) s = check_io_table(m, "forward input", m->fwd_inputs, m->n_fwd_inputs);
  if (s == POCK_OK) s = check_io_table(m, "output", m->outputs, m->n_outputs);
  return s;
}

std::string io_names(const PockIO* io, int32_t n) {
  std::string s;
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::string(io[i].name);
  return s;
}

template <class T>
pock_status check_range(const char* what, int32_t i, const PockIO& e, const T* v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const long long x = static_cast<long long>(v[k]);
    if ((x >= e.int_lo && x < e.int_hi) || (e.has_ignore && x == e.int_ignore)) continue;
    const long long lo = e.int_lo, hi = e.int_hi, ignore = e.int_ignore;
    if (e.has_ignore)
      return fail(POCK_ERR_VALUE,
                  "%s %d '%s' holds %lld at flat index %lld, outside [%lld, %lld) and not the ignore index %lld",
                  what, i, e.name, x, (long long)k, lo, hi, ignore);
    return fail(POCK_ERR_VALUE, "%s %d '%s' holds %lld at flat index %lld, outside [%lld, %lld)", what, i, e.name, x,
                (long long)k, lo, hi);
  }
  return POCK_OK;
}

// Validate caller tensors against the compiled ones: count, shape, dtype
// (int32 data is accepted where int64 is compiled), pointers and int ranges.
pock_status check_group(const char* what, const PockIO* io, int32_t n_io, const pock_tensor* ts, int32_t n) {
  if (n != n_io)
    return fail(POCK_ERR_INVALID_ARGUMENT, "expected %d %ss (%s), got %d", n_io, what, io_names(io, n_io).c_str(), n);
  if (n > 0 && !ts) return fail(POCK_ERR_INVALID_ARGUMENT, "%ss: the tensor array is NULL", what);
  for (int32_t i = 0; i < n; ++i) {
    const pock_tensor& t = ts[i];
    const PockIO& e = io[i];
    if (t.ndim < 0 || t.ndim > POCK_MAX_DIMS)
      return fail(POCK_ERR_SHAPE, "%s %d '%s': ndim %d is outside [0, %d]", what, i, e.name, t.ndim, POCK_MAX_DIMS);
    if (t.ndim > 0 && !t.shape) return fail(POCK_ERR_INVALID_ARGUMENT, "%s %d '%s': shape is NULL", what, i, e.name);
    bool shape_ok = t.ndim == e.ndim;
    for (int32_t d = 0; shape_ok && d < t.ndim; ++d) shape_ok = t.shape[d] == e.shape[d];
    const bool dtype_ok = t.dtype == e.dtype || (e.dtype == POCK_I64 && t.dtype == POCK_I32);
    if (!shape_ok || !dtype_ok)
      return fail(shape_ok ? POCK_ERR_DTYPE : POCK_ERR_SHAPE, "%s %d '%s': expected shape %s, got %s", what, i, e.name,
                  describe(e.shape, e.ndim, e.dtype).c_str(), describe(t.shape, t.ndim, t.dtype).c_str());
    if (!t.data && e.nbytes > 0) return fail(POCK_ERR_INVALID_ARGUMENT, "%s %d '%s': data is NULL", what, i, e.name);
    if (e.int_lo < e.int_hi) {
      const int64_t count = numel(e.shape, e.ndim);
      pock_status s = POCK_OK;
      if (t.dtype == POCK_I64) s = check_range(what, i, e, static_cast<const int64_t*>(t.data), count);
      if (t.dtype == POCK_I32) s = check_range(what, i, e, static_cast<const int32_t*>(t.data), count);
      if (t.dtype == POCK_U8) s = check_range(what, i, e, static_cast<const uint8_t*>(t.data), count);
      if (s != POCK_OK) return s;
    }
  }
  return POCK_OK;
}

// The non-finite guard at the door: a NaN/inf in a float input or target skips
// the step before anything runs (nothing changes, not even BatchNorm's running
// statistics).  Bit test, so it holds under any floating-point flags.
pock_status check_finite_group(const char* what, const PockIO* io, const pock_tensor* ts, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (io[i].dtype != POCK_F32) continue;
    const uint32_t* u = static_cast<const uint32_t*>(ts[i].data);
    const int64_t count = numel(io[i].shape, io[i].ndim);
    uint32_t bad = 0;
    for (int64_t k = 0; k < count; ++k) bad |= static_cast<uint32_t>((u[k] & 0x7F800000u) == 0x7F800000u);
    if (!bad) continue;
    for (int64_t k = 0; k < count; ++k)
      if ((u[k] & 0x7F800000u) == 0x7F800000u) {
        float v;
        std::memcpy(&v, u + k, 4);
        return fail(POCK_ERR_NONFINITE, "non-finite %s: %s %d '%s' holds %g at flat index %lld; step skipped, "
                    "no update applied", what, what, i, io[i].name, (double)v, (long long)k);
      }
  }
  return POCK_OK;
}

// No real target: every target with an ignore index (a cross-entropy's class targets)
// holds only that index, so the loss has nothing to average (PyTorch: 0/0) and the
// step is skipped at the door, before anything runs.
pock_status check_real_targets(const PockIO* io, const pock_tensor* ts, int32_t n) {
  bool any = false;
  int64_t ignore = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!io[i].has_ignore) continue;
    any = true;
    ignore = io[i].int_ignore;
    const int64_t count = numel(io[i].shape, io[i].ndim), ig = io[i].int_ignore;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t v = ts[i].dtype == POCK_I32 ? static_cast<const int32_t*>(ts[i].data)[k]
                                                : static_cast<const int64_t*>(ts[i].data)[k];
      if (v != ig) return POCK_OK;
    }
  }
  if (!any) return POCK_OK;
  return fail(POCK_ERR_NO_TARGETS, "no real target: every target is the ignore index %lld; step skipped, no update "
              "applied", (long long)ignore);
}

void copy_group(uint8_t* arena, const PockIO* io, const pock_tensor* ts, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    const PockIO& e = io[i];
    if (ts[i].dtype == POCK_I32 && e.dtype == POCK_I64) {
      const int32_t* src = static_cast<const int32_t*>(ts[i].data);
      int64_t* dst = reinterpret_cast<int64_t*>(arena + e.offset);
      const int64_t count = numel(e.shape, e.ndim);
      for (int64_t k = 0; k < count; ++k) dst[k] = src[k];
    } else if (e.nbytes > 0) {
      std::memcpy(arena + e.offset, ts[i].data, static_cast<size_t>(e.nbytes));
    }
  }
}

uint64_t step_seed(int64_t step) {  // splitmix64: decorrelated seeds for consecutive steps
  uint64_t z = static_cast<uint64_t>(step) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

PockCtx make_ctx(pock_trainer* t) {
  PockCtx ctx;
  ctx.arena = t->arena;
  ctx.state = t->state;
  ctx.lr = t->lr;
  ctx.step = t->steps;
  ctx.seed = step_seed(t->steps);
  ctx.num_threads = t->num_threads;
  ctx.updates_done = 0;
  ctx.profile = t->profile;
  ctx.backend = t->backend;
  return ctx;
}

void fill_info(pock_tensor_info* out, const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
               int64_t nbytes, int32_t kind) {
  std::memset(out, 0, sizeof(*out));
  out->name = name;
  out->dtype = dtype;
  out->ndim = ndim;
  for (int32_t d = 0; d < ndim; ++d) out->shape[d] = shape[d];
  out->nbytes = nbytes;
  out->kind = kind;
}

const PockIO* io_group(int32_t group, int32_t* n) {
  const PockModel* m = pock_compiled_model();
  switch (group) {
    case POCK_INPUTS: *n = m->n_inputs; return m->inputs;
    case POCK_TARGETS: *n = m->n_targets; return m->targets;
    case POCK_OUTPUTS: *n = m->n_outputs; return m->outputs;
    default: *n = -1; return nullptr;
  }
}

#define CHECK_TRAINER(t, fn) \
  if (!(t)) return fail(POCK_ERR_INVALID_ARGUMENT, "%s: trainer is NULL", fn)

}  // namespace

namespace pock_rt {

pock_status fail(pock_status s, const char* fmt, ...) {
  try {  // fail() must not throw: it runs outside guarded() too
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    const int n = std::vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
      g_last_error = fmt;
    } else if (static_cast<size_t>(n) < sizeof small) {
      g_last_error.assign(small, static_cast<size_t>(n));
    } else {
      std::string big(static_cast<size_t>(n) + 1, '\0');
      va_start(ap, fmt);
      std::vsnprintf(&big[0], big.size(), fmt, ap);
      va_end(ap);
      big.resize(static_cast<size_t>(n));
      g_last_error.swap(big);
    }
  } catch (...) {
    g_last_error.clear();
  }
  return s;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case POCK_F32: return "float32";
    case POCK_I64: return "int64";
    case POCK_I32: return "int32";
    case POCK_U8: return "uint8";
    case POCK_BF16: return "bfloat16";
    case POCK_F16: return "float16";
    case POCK_I8: return "int8";
    default: return "unknown-dtype";
  }
}

std::string describe(const int64_t* shape, int32_t ndim, int32_t dtype) {
  std::string s = "(";
  for (int32_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  s += ndim == 1 ? ",) " : ") ";
  return s + dtype_name(dtype);
}

int32_t find_state(const PockModel* m, const char* name) {
  for (int32_t i = 0; i < m->n_state; ++i)
    if (std::strcmp(m->state[i].name, name) == 0) return i;
  return -1;
}

}  // namespace pock_rt

extern "C" {

POCK_API const char* pock_last_error(void) { return g_last_error.c_str(); }
POCK_API const char* pock_version(void) { return POCK_RUNTIME_VERSION; }
POCK_API const char* pock_model_name(void) { return pock_compiled_model()->name; }
POCK_API const char* pock_model_hash(void) { return pock_compiled_model()->hash; }

POCK_API pock_status pock_open(const char* checkpoint_path, pock_trainer** out) {
  return guarded([&]() -> pock_status {
    if (!out) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_open: out is NULL");
    *out = nullptr;
    const PockModel* m = pock_compiled_model();
    if (pock_status s = check_model(m)) return s;
    void* backend = nullptr;
    if (m->backend_open)
      if (pock_status s = m->backend_open(&backend)) return s;
    pock_trainer* t = new pock_trainer{m, nullptr, nullptr, m->default_lr, 0, pock_rt::default_num_threads()};
    t->backend = backend;
    try {
      t->pool = pock_rt::pool_create(t->num_threads);
    } catch (...) {  // no threads to be had: run single-threaded
      t->num_threads = 1;
    }
    t->arena = alloc_zeroed(m->arena_bytes);
    if (!t->arena || !pock_rt::state_alloc(t)) {
      pock_close(t);
      return fail(POCK_ERR_NO_MEMORY, "cannot allocate %lld bytes of arena and %lld bytes of state",
                  (long long)m->arena_bytes, (long long)m->state_bytes);
    }
    if (checkpoint_path) {
      if (pock_status s = pock_rt::load_checkpoint(t, checkpoint_path)) {
        pock_close(t);
        return s;
      }
    }
    *out = t;
    return POCK_OK;
  });
}

POCK_API void pock_close(pock_trainer* t) {
  if (!t) return;
  pock_rt::profile_free(t->profile);
  if (t->backend && t->model->backend_close) t->model->backend_close(t->backend);
  pock_rt::pool_destroy(t->pool);
  if (t->arena) munmap(t->arena, arena_size(t->model->arena_bytes));
  pock_rt::state_release(t);
  delete t;
}

POCK_API int32_t pock_io_count(int32_t group) {
  int32_t n;
  io_group(group, &n);
  if (n < 0) fail(POCK_ERR_INVALID_ARGUMENT, "pock_io_count: unknown group %d", group);
  return n;
}

POCK_API pock_status pock_io_info(int32_t group, int32_t index, pock_tensor_info* out) {
  if (!out) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_io_info: out is NULL");
  int32_t n;
  const PockIO* io = io_group(group, &n);
  if (n < 0) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_io_info: unknown group %d", group);
  if (index < 0 || index >= n)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_io_info: index %d is outside [0, %d) for group %d", index, n, group);
  const PockIO& e = io[index];
  fill_info(out, e.name, e.dtype, e.ndim, e.shape, e.nbytes, 0);
  return POCK_OK;
}

POCK_API int32_t pock_tensor_count(void) { return pock_compiled_model()->n_state; }

POCK_API pock_status pock_tensor_info_at(int32_t index, pock_tensor_info* out) {
  const PockModel* m = pock_compiled_model();
  if (!out) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_tensor_info_at: out is NULL");
  if (index < 0 || index >= m->n_state)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_tensor_info_at: index %d is outside [0, %d)", index, m->n_state);
  const PockStateTensor& s = m->state[index];
  fill_info(out, s.name, s.dtype, s.ndim, s.shape, s.nbytes, s.kind);
  return POCK_OK;
}

POCK_API pock_status pock_step(pock_trainer* t, const pock_tensor* inputs, int32_t n_inputs, const pock_tensor* targets,
                               int32_t n_targets, float* loss_out) {
  return guarded([&]() -> pock_status {
    CHECK_TRAINER(t, "pock_step");
    const PockModel* m = t->model;
    if (!m->step) return fail(POCK_ERR_INVALID_ARGUMENT, "model '%s' was compiled without a training step", m->name);
    if (pock_status s = check_group("input", m->inputs, m->n_inputs, inputs, n_inputs)) return s;
    if (pock_status s = check_group("target", m->targets, m->n_targets, targets, n_targets)) return s;
    if (pock_status s = check_finite_group("input", m->inputs, inputs, n_inputs)) {
      if (loss_out) *loss_out = NAN;
      return s;
    }
    if (pock_status s = check_finite_group("target", m->targets, targets, n_targets)) {
      if (loss_out) *loss_out = NAN;
      return s;
    }
    if (pock_status s = check_real_targets(m->targets, targets, n_targets)) {
      if (loss_out) *loss_out = 0.0f;  // nothing to average: the 0 such a batch always reported
      return s;
    }
    copy_group(t->arena, m->inputs, inputs, n_inputs);
    copy_group(t->arena, m->targets, targets, n_targets);
    PockCtx ctx = make_ctx(t);
    pock_rt::PoolScope scope(t->pool);
    const pock_status s = m->step(&ctx);
    float loss;
    std::memcpy(&loss, t->arena + m->loss_offset, sizeof loss);
    if (s == POCK_OK) t->steps += 1;  // a skipped or failed step does not count
    if (loss_out) *loss_out = s == POCK_OK || s == POCK_ERR_NONFINITE ? loss : NAN;
    return s;
  });
}

POCK_API pock_status pock_forward(pock_trainer* t, const pock_tensor* inputs, int32_t n_inputs, pock_buffer* outputs,
                                  int32_t n_outputs) {
  return guarded([&]() -> pock_status {
    CHECK_TRAINER(t, "pock_forward");
    const PockModel* m = t->model;
    if (!m->forward) return fail(POCK_ERR_INVALID_ARGUMENT, "model '%s' was compiled without a forward pass", m->name);
    if (pock_status s = check_group("input", m->fwd_inputs, m->n_fwd_inputs, inputs, n_inputs)) return s;
    if (n_outputs != m->n_outputs)
      return fail(POCK_ERR_INVALID_ARGUMENT, "expected %d outputs (%s), got %d", m->n_outputs,
                  io_names(m->outputs, m->n_outputs).c_str(), n_outputs);
    if (n_outputs > 0 && !outputs) return fail(POCK_ERR_INVALID_ARGUMENT, "outputs: the buffer array is NULL");
    for (int32_t i = 0; i < n_outputs; ++i) {
      const PockIO& e = m->outputs[i];
      if (outputs[i].nbytes != e.nbytes)
        return fail(POCK_ERR_INVALID_ARGUMENT, "output %d '%s': buffer holds %lld bytes, expected %lld for %s", i,
                    e.name, (long long)outputs[i].nbytes, (long long)e.nbytes,
                    describe(e.shape, e.ndim, e.dtype).c_str());
      if (!outputs[i].data && e.nbytes > 0)
        return fail(POCK_ERR_INVALID_ARGUMENT, "output %d '%s': data is NULL", i, e.name);
    }
    copy_group(t->arena, m->fwd_inputs, inputs, n_inputs);
    PockCtx ctx = make_ctx(t);
    {
      pock_rt::PoolScope scope(t->pool);
      if (pock_status s = m->forward(&ctx)) return s;
    }
    for (int32_t i = 0; i < n_outputs; ++i) {
      const PockIO& e = m->outputs[i];
      if (e.nbytes > 0) std::memcpy(outputs[i].data, t->arena + e.offset, static_cast<size_t>(e.nbytes));
    }
    return POCK_OK;
  });
}

static pock_status find_for_copy(pock_trainer* t, const char* fn, const char* name, const void* ptr, int64_t nbytes,
                                 const PockStateTensor** out) {
  CHECK_TRAINER(t, fn);
  if (!name) return fail(POCK_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
  const int32_t i = pock_rt::find_state(t->model, name);
  if (i < 0)
    return fail(POCK_ERR_INVALID_ARGUMENT, "%s: unknown state tensor '%s' (not in model '%s')", fn, name,
                t->model->name);
  const PockStateTensor& s = t->model->state[i];
  if (nbytes != s.nbytes)
    return fail(POCK_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is %s (%lld bytes), got %lld bytes", fn, name,
                describe(s.shape, s.ndim, s.dtype).c_str(), (long long)s.nbytes, (long long)nbytes);
  if (!ptr && nbytes > 0) return fail(POCK_ERR_INVALID_ARGUMENT, "%s: data pointer for '%s' is NULL", fn, name);
  *out = &s;
  return POCK_OK;
}

POCK_API pock_status pock_get_tensor(pock_trainer* t, const char* name, void* dst, int64_t nbytes) {
  const PockStateTensor* s = nullptr;
  if (pock_status st = find_for_copy(t, "pock_get_tensor", name, dst, nbytes, &s)) return st;
  if (nbytes > 0) std::memcpy(dst, t->state + s->offset, static_cast<size_t>(nbytes));
  return POCK_OK;
}

POCK_API pock_status pock_set_tensor(pock_trainer* t, const char* name, const void* src, int64_t nbytes) {
  const PockStateTensor* s = nullptr;
  if (pock_status st = find_for_copy(t, "pock_set_tensor", name, src, nbytes, &s)) return st;
  if (nbytes > 0) std::memcpy(t->state + s->offset, src, static_cast<size_t>(nbytes));
  return POCK_OK;
}

POCK_API pock_status pock_save(pock_trainer* t, const char* path) {
  return guarded([&]() -> pock_status {
    CHECK_TRAINER(t, "pock_save");
    if (!path) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_save: path is NULL");
    return pock_rt::save_checkpoint(t, path);
  });
}

POCK_API pock_status pock_load(pock_trainer* t, const char* path) {
  return guarded([&]() -> pock_status {
    CHECK_TRAINER(t, "pock_load");
    if (!path) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_load: path is NULL");
    return pock_rt::load_checkpoint(t, path);
  });
}

POCK_API pock_status pock_save_trained(pock_trainer* t, const char* path) {
  return guarded([&]() -> pock_status {
    CHECK_TRAINER(t, "pock_save_trained");
    if (!path) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_save_trained: path is NULL");
    return pock_rt::save_trained_checkpoint(t, path);
  });
}

POCK_API pock_status pock_set_learning_rate(pock_trainer* t, float lr) {
  CHECK_TRAINER(t, "pock_set_learning_rate");
  if (!std::isfinite(lr) || lr < 0.0f)
    return fail(POCK_ERR_VALUE, "learning rate must be finite and >= 0, got %g", (double)lr);
  t->lr = lr;
  return POCK_OK;
}

POCK_API pock_status pock_get_learning_rate(pock_trainer* t, float* lr) {
  CHECK_TRAINER(t, "pock_get_learning_rate");
  if (!lr) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_get_learning_rate: lr is NULL");
  *lr = t->lr;
  return POCK_OK;
}

POCK_API pock_status pock_step_count(pock_trainer* t, int64_t* steps) {
  CHECK_TRAINER(t, "pock_step_count");
  if (!steps) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_step_count: steps is NULL");
  *steps = t->steps;
  return POCK_OK;
}

POCK_API pock_status pock_set_num_threads(pock_trainer* t, int32_t n) {
  CHECK_TRAINER(t, "pock_set_num_threads");
  if (n < 1 || n > kMaxThreads)
    return fail(POCK_ERR_INVALID_ARGUMENT, "number of threads must be in [1, %d], got %d", kMaxThreads, n);
  if (n == pock_rt::pool_size(t->pool) && (t->pool != nullptr || n == 1)) {
    t->num_threads = n;
    return POCK_OK;
  }
  return guarded([&]() -> pock_status {
    pock_rt::pool_destroy(t->pool);  // joins the old workers first
    t->pool = nullptr;
    t->num_threads = 1;
    try {
      t->pool = pock_rt::pool_create(n);
    } catch (const std::exception& e) {
      return fail(POCK_ERR_INTERNAL, "cannot start %d threads: %s", n, e.what());
    }
    t->num_threads = n;
    return POCK_OK;
  });
}

}  // extern "C"

pock_status pock_index_error(const char* what, const char* ids_name, const int64_t* ids, int64_t pos, int64_t lo,
                             int64_t hi) {
  return fail(POCK_ERR_VALUE, "%s: index %lld at flat position %lld of %s is outside [%lld, %lld); step not run",
              what, (long long)ids[pos], (long long)pos, ids_name, (long long)lo, (long long)hi);
}

pock_status pock_nonfinite(const char* what, int32_t updates_done) {
  if (updates_done == 0)
    return fail(POCK_ERR_NONFINITE, "%s is NaN or inf: step skipped, no update applied", what);
  return fail(POCK_ERR_NONFINITE,
              "%s is NaN or inf: that update and every later one skipped, but %d earlier update(s) of this step had "
              "already run (their gradients were finite); step count not advanced",
              what, updates_done);
}
