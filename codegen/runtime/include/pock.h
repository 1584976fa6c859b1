/* pock.h — PockEngine's C API: one compiled training step behind an opaque handle.
 *
 * One library holds one compiled model.  Every call returns a pock_status; on
 * failure pock_last_error() gives a message naming the problem (thread-local,
 * valid until the next failing call on the same thread).
 *
 * Thread safety: a pock_trainer is not internally locked.  Calls on different
 * trainers may run concurrently; calls on one trainer must be serialised by
 * the caller (the Kotlin and Swift layers hold a lock per trainer).
 */
#ifndef POCK_H_
#define POCK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define POCK_API __declspec(dllexport)
#else
#define POCK_API __attribute__((visibility("default")))
#endif

typedef enum pock_status {
  POCK_OK = 0,
  POCK_ERR_INVALID_ARGUMENT = 1, /* null pointer, unknown name, bad count */
  POCK_ERR_SHAPE = 2,            /* a tensor's shape differs from the compiled one */
  POCK_ERR_DTYPE = 3,            /* a tensor's dtype differs from the compiled one */
  POCK_ERR_VALUE = 4,            /* e.g. an index out of range */
  POCK_ERR_IO = 5,               /* a file could not be read or written */
  POCK_ERR_CHECKPOINT = 6,       /* corrupt checkpoint, or one for another model */
  POCK_ERR_CLOSED = 7,           /* the trainer was closed */
  POCK_ERR_NO_MEMORY = 8,
  POCK_ERR_BACKEND = 9,          /* an accelerator backend is missing or failed */
  POCK_ERR_INTERNAL = 10,
  POCK_ERR_NONFINITE = 11        /* pock_step: an input, the loss or a gradient was NaN/inf;
                                    the step was skipped (see pock_step) */
} pock_status;

typedef enum pock_dtype {
  POCK_F32 = 0,
  POCK_I64 = 1,
  POCK_I32 = 2, /* accepted where the model wants int64 (widened on copy) */
  POCK_U8 = 3,
  /* frozen weights stored in low precision (state tensors only) */
  POCK_BF16 = 4,
  POCK_F16 = 5,
  POCK_I8 = 6
} pock_dtype;

#define POCK_MAX_DIMS 8

/* A caller-owned tensor handed to step/forward. */
typedef struct pock_tensor {
  const void* data;
  int32_t dtype; /* pock_dtype */
  int32_t ndim;
  const int64_t* shape;
} pock_tensor;

/* A caller-owned output buffer for pock_forward. */
typedef struct pock_buffer {
  void* data;
  int64_t nbytes;
} pock_buffer;

typedef struct pock_tensor_info {
  const char* name;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[POCK_MAX_DIMS];
  int64_t nbytes;
  int32_t kind; /* pock_tensor_kind for state tensors; 0 for inputs/outputs */
} pock_tensor_info;

typedef enum pock_tensor_kind {
  POCK_PARAM = 0,
  POCK_BUFFER = 1,
  POCK_OPTIMIZER_STATE = 2,
  POCK_CONSTANT = 3
} pock_tensor_kind;

typedef enum pock_io_group { POCK_INPUTS = 0, POCK_TARGETS = 1, POCK_OUTPUTS = 2 } pock_io_group;

typedef struct pock_trainer pock_trainer;

POCK_API const char* pock_last_error(void);
POCK_API const char* pock_version(void);
/* The compiled model's name and structural hash (hex). */
POCK_API const char* pock_model_name(void);
POCK_API const char* pock_model_hash(void);

/* Create a trainer.  checkpoint_path: a checkpoint written by pock_save (the
 * model bundle's weights), or NULL for all-zero state. */
POCK_API pock_status pock_open(const char* checkpoint_path, pock_trainer** out);
/* Free everything; NULL is a no-op.  The handle is invalid afterwards. */
POCK_API void pock_close(pock_trainer* t);

/* Describe the compiled inputs, targets and forward outputs. */
POCK_API int32_t pock_io_count(int32_t group);
POCK_API pock_status pock_io_info(int32_t group, int32_t index, pock_tensor_info* out);
/* Describe the state tensors (parameters, buffers, optimizer state). */
POCK_API int32_t pock_tensor_count(void);
POCK_API pock_status pock_tensor_info_at(int32_t index, pock_tensor_info* out);

/* One training step: forward, loss, backward and optimizer update.
 * Inputs and targets are checked against the compiled shapes/dtypes/ranges;
 * every gather (embedding rows, class targets) checks its indices inside the
 * step and fails with POCK_ERR_VALUE naming the input, position and value.
 * Non-finite guard: a float input or target holding NaN/inf or a non-finite
 * loss fails with POCK_ERR_NONFINITE before any update (weights, optimizer
 * state and step count unchanged; loss_out still gets the loss).  Every
 * gradient is checked too.  Compiled with exact_skip (the default), all
 * updates run after every gradient is computed and checked, so a NaN/inf
 * gradient also leaves weights and optimizer state unchanged.  Compiled with
 * exact_skip=False, updates run as soon as their gradient is complete, each
 * checking its own gradient: a non-finite one skips that update and all
 * later ones (the message says how many updates of the step had already run:
 * a gradient that overflows late in the backward pass finds earlier ones done).
 * Running statistics (BatchNorm) updated by the forward pass are kept, as
 * PyTorch AMP keeps them on a skipped step. */
POCK_API pock_status pock_step(pock_trainer* t, const pock_tensor* inputs, int32_t n_inputs,
                               const pock_tensor* targets, int32_t n_targets, float* loss_out);
/* Inference (eval mode) with the current weights into caller buffers. */
POCK_API pock_status pock_forward(pock_trainer* t, const pock_tensor* inputs, int32_t n_inputs,
                                  pock_buffer* outputs, int32_t n_outputs);

/* Copy a state tensor (by PyTorch name) out of / into the trainer. */
POCK_API pock_status pock_get_tensor(pock_trainer* t, const char* name, void* dst, int64_t nbytes);
POCK_API pock_status pock_set_tensor(pock_trainer* t, const char* name, const void* src, int64_t nbytes);

/* Checkpoints: all state + step count + learning rate.  pock_save writes a
 * temporary file, fsyncs it and renames it over path, so an existing
 * checkpoint is never destroyed by a failed write.  pock_load validates the
 * whole file (magic, version, model hash, CRC) before touching any state. */
POCK_API pock_status pock_save(pock_trainer* t, const char* path);
POCK_API pock_status pock_load(pock_trainer* t, const char* path);

POCK_API pock_status pock_set_learning_rate(pock_trainer* t, float lr);
POCK_API pock_status pock_get_learning_rate(pock_trainer* t, float* lr);
POCK_API pock_status pock_step_count(pock_trainer* t, int64_t* steps);
POCK_API pock_status pock_set_num_threads(pock_trainer* t, int32_t n);

/* Per-op profiling of pock_step.  While a trainer's profiling is on, each
 * node of its training step is timed (a monotonic clock read per node) and
 * the times add up per node; the steps themselves are unchanged, so the losses
 * and weights are exactly those of unprofiled steps.  Off (the default), a
 * node costs one branch.
 *
 * pock_profile_enable(t, 1) starts with zeroed counters (or keeps the current
 * ones if already on); pock_profile_enable(t, 0) stops and frees them, so read
 * the entries first; pock_close frees them too.  Models generated
 * before the profiler have no node table: enabling fails with
 * POCK_ERR_INVALID_ARGUMENT and pock_profile_count returns 0. */
typedef struct pock_node_profile {
  int32_t index;      /* position in the training step's schedule */
  const char* phase;  /* "forward", "backward" or "update" */
  const char* op;     /* IR op, e.g. "linear" */
  const char* kernel; /* the kernel(s) it calls, e.g. "linear_fwd"; "view" for none */
  const char* module; /* the module it came from, e.g. "blocks.0.qkv (Linear)" */
  int64_t flops;      /* per step */
  int64_t steps;      /* profiled steps since enable/reset */
  int64_t total_ns;   /* time in this node summed over those steps */
} pock_node_profile;

POCK_API pock_status pock_profile_enable(pock_trainer* t, int32_t on);
/* Zero the counters (profiling stays on). */
POCK_API pock_status pock_profile_reset(pock_trainer* t);
/* The number of nodes in the training step (0 if the model has no node table). */
POCK_API int32_t pock_profile_count(pock_trainer* t);
/* Node `index`'s description and counters (zero counters while profiling is off). */
POCK_API pock_status pock_profile_entry(pock_trainer* t, int32_t index, pock_node_profile* out);

/* Trained-only checkpoints: the trained parameters (pe.compile's update dict
 * and LoRA adapters), buffers and optimizer state, the step count and the
 * learning rate; no frozen base weight.  The file is tied to the base weights
 * by a SHA-256 of the frozen parameters and has Python's
 * Trainer.save(path, trained_only=True) format (either side reads the
 * other's).  Written atomically like pock_save.  pock_load reads such a file
 * too (by its magic): it validates the whole file, the model hash and the
 * base hash against the trainer's current frozen weights before changing
 * any state, then replaces only the tensors the file holds.  Models generated
 * before this call fail with POCK_ERR_INVALID_ARGUMENT. */
POCK_API pock_status pock_save_trained(pock_trainer* t, const char* path);

#ifdef __cplusplus
}
#endif
#endif /* POCK_H_ */
