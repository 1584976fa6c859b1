// pock_model.h — what a generated model translation unit hands the runtime.
// Internal: the C API (pock_api.cpp) is written once against this struct and
// each generated model defines `const PockModel* pock_compiled_model()`.
#pragma once
#include <cstdint>

#include "pock.h"

struct PockCtx {
  uint8_t* arena;     // activations, gradients, temporaries (the memory plan)
  uint8_t* state;     // parameters, buffers, optimizer state, constants
  float lr;           // current learning rate (runtime-settable)
  int64_t step;       // completed optimizer steps before this one (0 on the first)
  uint64_t seed;      // dropout RNG seed for this step
  int32_t num_threads;
  int32_t updates_done;  // optimizer updates this step has run (the non-finite guard's report)
  // The trainer's own per-call state, set by pock_api.cpp from its pock_trainer
  // (no global registry: the generated step reads them from here).
  struct PockProfile* profile;  // this trainer's counters while profiling, else nullptr
  void* backend;                // what the model's backend_open returned (e.g. the Vulkan device), or nullptr
};

struct PockStateTensor {  // a tensor living in ctx->state
  const char* name;       // PyTorch name (optimizer state: "<param>:<slot>")
  int32_t kind;           // pock_tensor_kind
  int32_t dtype;          // pock_dtype (F32, I64)
  int32_t ndim;
  int64_t shape[POCK_MAX_DIMS];
  int64_t offset;         // bytes into ctx->state
  int64_t nbytes;
};

struct PockIO {           // an input, target or output living in ctx->arena
  const char* name;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[POCK_MAX_DIMS];
  int64_t offset;         // bytes into ctx->arena
  int64_t nbytes;
  int64_t int_lo, int_hi; // integer inputs: valid values are [int_lo, int_hi) or
                          // == int_ignore; unchecked when int_lo >= int_hi
  int64_t int_ignore;     // e.g. cross-entropy ignore_index; only used when has_ignore
  int32_t has_ignore;
};

struct PockNodeInfo {     // one node of the training step, for the profiler
  const char* phase;      // "forward" | "backward" | "update"
  const char* op;         // IR op, e.g. "linear"
  const char* kernel;     // the kernel(s) it calls, e.g. "linear_fwd"; "view" when it emits no code
  const char* module;     // module it came from, e.g. "blocks.0.qkv (Linear)"
  int64_t flops;          // per step
};

struct PockNodeTable {    // the training step's nodes, in schedule order
  int32_t n_nodes;
  const PockNodeInfo* nodes;
};

struct PockModel {
  const char* name;
  const char* hash;        // hex, structural hash of the compiled program
  int64_t arena_bytes;     // max over the step and forward plans
  int64_t state_bytes;
  int32_t n_state;
  const PockStateTensor* state;
  // training step
  int32_t n_inputs;
  const PockIO* inputs;    // offsets in the step plan
  int32_t n_targets;
  const PockIO* targets;
  int64_t loss_offset;     // float in the arena after a step
  // POCK_OK, POCK_ERR_VALUE (an index out of range: pock_index_error),
  // POCK_ERR_NONFINITE (the guard skipped the update: pock_nonfinite).
  pock_status (*step)(PockCtx*);
  // inference
  int32_t n_fwd_inputs;
  const PockIO* fwd_inputs;  // offsets in the forward plan
  int32_t n_outputs;
  const PockIO* outputs;
  pock_status (*forward)(PockCtx*);
  float default_lr;
  // Appended after the fields above, so models generated before the profiler
  // (which leave it zero-initialised) still build: nullptr means the step
  // carries no profiling hooks.
  const PockNodeTable* step_nodes;
  // Opens the accelerator backends the step uses (e.g. the Vulkan device) and
  // sets *state to the handle the step finds in ctx->backend; pock_open fails
  // with its status (POCK_ERR_BACKEND naming what is missing).  nullptr: CPU only.
  pock_status (*backend_open)(void** state);
  // Releases what backend_open gave this trainer (pock_close); nullptr: nothing to release.
  void (*backend_close)(void* state);
  // The trained parameters (pe.compile's update dict and LoRA adapters), by
  // state-tensor name: what a trained-only checkpoint (trained_ckpt.cpp) keeps
  // besides buffers and optimizer state; every other parameter is frozen base.
  // Models generated before this field leave it zero: no trained-only saves.
  int32_t n_trained;
  const char* const* trained;
  // A decoder-only causal LM's layout for pock_generate (generate.cpp); nullptr: the model is
  // not one (models generated before generation leave it zero-initialised too).
  const struct PockDecoder* decoder;
};

// ---- generation (generate.cpp): where a Llama-family decoder's weights live in ctx->state,
// emitted by toolchain/pockengine/codegen/decoder.py.  Offsets are bytes into the state; -1 = absent.
struct PockDecWeight {   // a linear weight [rows = out, cols = in] (or the embedding table)
  int64_t offset;
  int32_t format;        // 0 fp32, 1 bf16, 2 fp16, 3 int8 (per-row scale), 4 q4 (per-block (d, m))
  int64_t scale_offset;  // int8 / q4: its fp32 scale tensor ("<name>:scale")
  int64_t rows, cols;
  int64_t bias_offset;   // fp32 [rows]
  int64_t lora_a_offset, lora_b_offset;  // fp32 A [rank, cols], B [rows, rank]: y += scaling * (x A^T) B^T
  int32_t lora_rank;
  float lora_scaling;
};

struct PockDecLayer {
  int64_t attn_norm, mlp_norm;  // fp32 RMSNorm weights [hidden]
  PockDecWeight q, k, v, o, gate, up, down;
};

struct PockDecoder {
  int32_t supported;   // 0: the model looks like a causal LM that generation cannot run; `reason` says why
  const char* reason;
  const char* arch;    // the Hugging Face model_type, e.g. "llama"
  int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, intermediate, vocab, max_context;
  int32_t sliding_window;  // 0: none
  float eps, attn_scale, rope_scaling;  // RMSNorm eps, scores scale, cos/sin factor (attention_scaling)
  const float* inv_freq;   // [head_dim / 2] rotary inverse frequencies (rope scaling applied)
  PockDecWeight embed;     // rows = vocab, cols = hidden
  int64_t final_norm;
  PockDecWeight lm_head;
  const PockDecLayer* layers;  // [n_layers]
  // The forward pass (kernels/decoder.cpp), reached through the generated model so that the
  // C API links without the kernels: a session holds the KV cache for `positions` positions
  // (throws std::bad_alloc), forward runs M new rows at positions p0.. and returns the last
  // row's logits [vocab] (valid until the next call).
  struct PockDecSession* (*open)(const PockDecoder* d, const uint8_t* state, int64_t positions);
  const float* (*forward)(PockDecSession* s, const int64_t* ids, int64_t M, int64_t p0);
  void (*close)(PockDecSession* s);
  const char* prefix;  // the LM's module path inside the compiled model ("" or e.g. "m."): export.cpp strips it
};

namespace pk {  // kernels/decoder.cpp
PockDecSession* decoder_open(const PockDecoder* d, const uint8_t* state, int64_t positions);
const float* decoder_forward(PockDecSession* s, const int64_t* ids, int64_t M, int64_t p0);
void decoder_close(PockDecSession* s);
}  // namespace pk

extern "C" const PockModel* pock_compiled_model();

// Profiling hooks the generated training step calls (profile.cpp).  Hidden:
// not part of the C API.  A step does
//   PockProfile* const prof = pock_profile_begin(ctx);   // nullptr: profiling off
//   int64_t t = prof ? pock_profile_now() : 0;
//   ... node i ...  if (prof) t = pock_profile_node(prof, i, t);
//   if (prof) pock_profile_end(prof);
// so with profiling off a node costs one predictable branch, and nothing in a
// step allocates either way (the counters are allocated by pock_profile_enable).
struct PockProfile;
// The profile of the trainer `ctx` belongs to (ctx->profile), or nullptr when it
// is not being profiled.
PockProfile* pock_profile_begin(const PockCtx* ctx);
int64_t pock_profile_now();  // monotonic nanoseconds
// Add now - t0 to node `node`'s time and return now.
int64_t pock_profile_node(PockProfile* p, int32_t node, int64_t t0);
// Count one more profiled step.
void pock_profile_end(PockProfile* p);

// Errors the generated code reports (pock_api.cpp); each records the message
// for pock_last_error() and returns its status.
// An index `ids[pos]` outside [lo, hi) (and not `ignore` when has_ignore) met
// by a gather: what = "embedding 'emb' (Embedding)", ids_name names the index
// tensor and the inputs it comes from.  POCK_ERR_VALUE.
pock_status pock_index_error(const char* what, const char* ids_name, const int64_t* ids, int64_t pos, int64_t lo,
                             int64_t hi);
// The non-finite guard: `what` ("the loss", "the gradient of 'fc.weight'") is
// NaN/inf; `updates_done` updates of this step had already run.  POCK_ERR_NONFINITE.
pock_status pock_nonfinite(const char* what, int32_t updates_done);
