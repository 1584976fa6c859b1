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
  POCK_ERR_NONFINITE = 11,       /* pock_step: an input, the loss or a gradient was NaN/inf;
                                    the step was skipped (see pock_step) */
  POCK_ERR_NO_TARGETS = 12       /* pock_step: every class target is the ignore index (no real
                                    token): the step was skipped (see pock_step) */
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

/* A caller-owned tensor handed to step/forward.
 * Precondition: data points to at least the compiled size of that input or
 * target (pock_io_info's nbytes; int32 data given for an int64 input: half of
 * it) and stays valid for the call.  The C API checks dtype, ndim and shape
 * against the compiled ones but cannot see how much memory data points to:
 * the SDKs (PockTensor in Kotlin and Swift) check their buffers' sizes. */
typedef struct pock_tensor {
  const void* data;
  int32_t dtype; /* pock_dtype */
  int32_t ndim;
  const int64_t* shape;
} pock_tensor;

/* A caller-owned output buffer for pock_forward: nbytes must be the output's
 * compiled size (checked); data must point to at least nbytes bytes. */
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
/* Free everything; NULL is a no-op.  The handle is invalid afterwards:
 * precondition of every call taking a pock_trainer*, it is one pock_open
 * returned and not yet closed (a closed handle is not detected: use after
 * close is undefined).  The SDKs enforce it (PockException / PockError CLOSED
 * in Kotlin; Swift closes only in deinit).  One handle is used by one thread
 * at a time (the SDKs hold a lock per trainer). */
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
 * PyTorch AMP keeps them on a skipped step.
 * A batch with no real target (every class target of a cross-entropy with an
 * ignore index holds that index: PyTorch's mean is 0/0) fails with
 * POCK_ERR_NO_TARGETS before anything runs: weights, optimizer state, step
 * count and running statistics unchanged, loss_out 0 (nothing to average). */
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

/* ---- Tokenizer ------------------------------------------------------------------
 * Text <-> token ids, the same ids as Hugging Face `tokenizers`: byte-level BPE
 * (GPT-2, Llama-3, Qwen2, SmolLM2) and SentencePiece-style BPE with byte fallback
 * (Llama-2, Mistral, Gemma), read from a tokenizer.json (a folder holding one, and its
 * tokenizer_config.json for the special tokens and chat template) or from a GGUF
 * file's tokenizer.ggml.* metadata.  Needs no model: it is in every model library
 * and in the standalone libpock_tokenizer.  Text is UTF-8; invalid UTF-8 is read as
 * U+FFFD per maximal invalid subsequence (Rust's from_utf8_lossy).  Results (ids,
 * text) belong to the tokenizer and stay valid until its next call; a tokenizer is
 * not locked (serialise calls on one tokenizer, as for a trainer). */
typedef struct pock_tokenizer pock_tokenizer;

/* path: a tokenizer.json, a folder holding one, or a .gguf file (told by its magic). */
POCK_API pock_status pock_tokenizer_open(const char* path, pock_tokenizer** out);
/* The bytes of a tokenizer.json or a GGUF file (copied; data may be freed after). */
POCK_API pock_status pock_tokenizer_open_memory(const void* data, int64_t nbytes, pock_tokenizer** out);
POCK_API void pock_tokenizer_close(pock_tokenizer* t); /* NULL is a no-op */
/* add_special_tokens: the post-processor's tokens (e.g. Llama's BOS) around the ids. */
POCK_API pock_status pock_tokenizer_encode(pock_tokenizer* t, const char* text, int64_t nbytes,
                                           int32_t add_special_tokens, const int32_t** ids, int64_t* n_ids);
/* An id outside the vocabulary fails with POCK_ERR_VALUE naming it and its position. */
POCK_API pock_status pock_tokenizer_decode(pock_tokenizer* t, const int32_t* ids, int64_t n_ids,
                                           int32_t skip_special_tokens, const char** text, int64_t* nbytes);
POCK_API pock_status pock_tokenizer_vocab_size(pock_tokenizer* t, int32_t* size);
/* -1 where the tokenizer has none. */
POCK_API pock_status pock_tokenizer_special_ids(pock_tokenizer* t, int32_t* bos, int32_t* eos, int32_t* pad);
/* *id = -1 when token is not in the vocabulary. */
POCK_API pock_status pock_tokenizer_token_to_id(pock_tokenizer* t, const char* token, int64_t nbytes, int32_t* id);
POCK_API pock_status pock_tokenizer_id_to_token(pock_tokenizer* t, int32_t id, const char** token, int64_t* nbytes);
POCK_API pock_status pock_tokenizer_is_special(pock_tokenizer* t, int32_t id, int32_t* special);
/* The Jinja chat template from tokenizer_config.json / tokenizer.chat_template ("" if none). */
POCK_API pock_status pock_tokenizer_chat_template(pock_tokenizer* t, const char** text, int64_t* nbytes);

/* ---- Generation next to training (issue 37) ------------------------------
 * A decoder-only Llama-family model (LlamaForCausalLM, Qwen2, Mistral, SmolLM2)
 * generates from the trainer's current weights in place: LoRA adapters and
 * low-precision frozen weights included, nothing copied.  One prefill over the
 * prompt, then one decode step per token with an fp32 KV cache of
 * n_prompt + max_new_tokens positions, allocated for the call.
 * Sampling (Hugging Face's order): logits / temperature, top-k, top-p, then a
 * draw from our own RNG seeded by `seed` (the same seed gives the same tokens);
 * temperature 0 is greedy (the first maximum).  Generation stops after
 * max_new_tokens, after a stop id (which is written out, as Hugging Face
 * keeps its eos), or when the callback returns nonzero (after that token).
 * Errors: POCK_ERR_VALUE for a prompt longer than the model's context, a
 * prompt + max_new_tokens past it (the KV cache), an id outside the
 * vocabulary or a bad option, each named; POCK_ERR_INVALID_ARGUMENT for a
 * model that is not a supported decoder (the message says why).  Like every
 * call on one trainer, do not run it concurrently with another call on the
 * same trainer (the SDKs serialize them). */
typedef int32_t (*pock_token_callback)(int64_t token, void* user_data);

typedef struct pock_generate_options {
  int32_t max_new_tokens;        /* >= 0 */
  float temperature;             /* 0: greedy; > 0: sampling */
  int32_t top_k;                 /* 0: off */
  float top_p;                   /* in (0, 1]; 1: off */
  uint64_t seed;
  const int64_t* stop_ids;       /* nullable when n_stop == 0 */
  int32_t n_stop;
  pock_token_callback callback;  /* nullable: called with each new token; nonzero stops */
  void* user_data;
} pock_generate_options;

/* max_new_tokens 32, greedy, top_k 0, top_p 1, seed 0, no stop ids, no callback. */
POCK_API void pock_generate_default_options(pock_generate_options* opts);
/* 1 when the compiled model can generate (pock_generate's checks aside), else 0. */
POCK_API int32_t pock_generate_supported(void);
/* The new tokens go to out_ids (capacity >= max_new_tokens), their count to n_out. */
POCK_API pock_status pock_generate(pock_trainer* t, const int64_t* prompt, int32_t n_prompt,
                                   const pock_generate_options* opts, int64_t* out_ids, int32_t capacity,
                                   int32_t* n_out);

/* Adapters out: the trainer's LoRA adapters written to `path` in `format`, the bytes Python's
 * trainer.export_adapter(path, format) writes.  "peft": a folder (created if missing) with
 * adapter_model.safetensors + adapter_config.json that peft.PeftModel.from_pretrained loads
 * onto the Hugging Face base model.  "gguf": one llama.cpp LoRA adapter file (`--lora`):
 * general.type = adapter, adapter.type = lora, adapter.lora.alpha, blk.N.attn_q.weight.lora_a
 * / .lora_b, ...  Each file is written to a temporary name, fsynced and renamed into place.
 * POCK_ERR_INVALID_ARGUMENT for a model without adapters or decoder table, one that also
 * trains base weights, an adapter llama.cpp has no tensor for (gguf), or another format;
 * POCK_ERR_IO naming the file that could not be written. */
POCK_API pock_status pock_export_adapter(pock_trainer* t, const char* path, const char* format);

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
