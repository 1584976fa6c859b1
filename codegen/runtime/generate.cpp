// generate.cpp — text generation next to training (pock.h's pock_generate).
//
// A decoder-only Llama-family model (the PockDecoder table the generated model
// emits: toolchain/pockengine/decoder.py) runs from the trainer's state in place:
// the same bytes the training step reads and updates, LoRA adapters and frozen
// weights stored in low precision included.  One prefill over the prompt's rows,
// then one decode step per new token; keys and values of every position so far
// stay in an fp32 KV cache [layer][position][kv head * head_dim] sized for the
// call (prompt + max_new_tokens).  Every product is a pk:: kernel with fp32
// accumulation (linear_fwd / linear_fwd_lowp, rms_norm_fwd, rope_fwd, swiglu_fwd,
// embedding_fwd(_lowp)); attention over the cache is the loop below.
//
// Per layer, for the rows at positions p0 .. p0 + M - 1 (HF LlamaDecoderLayer):
//   h = rms_norm(x) ; q, k, v = h Wq^T, h Wk^T, h Wv^T (+ LoRA) ; rope(q), rope(k)
//   k, v -> cache ; a = softmax(q K^T * scale, causal) V ; x += a Wo^T
//   h = rms_norm(x) ; x += (silu(h Wg^T) * h Wu^T) Wd^T
// and logits = rms_norm(x_last) Whead^T.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "pock_kernels.h"
#include "pock_parallel.h"
#include "runtime_internal.h"

using pock_rt::fail;
using pk::i64;

namespace {

// The trainer's state as typed views.
struct State {
  const uint8_t* base;
  const float* f32(int64_t offset) const {
    return offset < 0 ? nullptr : reinterpret_cast<const float*>(base + offset);
  }
};

// Scratch for one linear with an adapter: x A^T [M, rank] and its product with B [M, rows].
struct LoraScratch {
  std::vector<float> t, u;
};

// y[M, rows] = x[M, cols] W^T + b (+ scaling * (x A^T) B^T), W dequantized in the kernel.
void linear(const State& s, const PockDecWeight& w, const float* x, float* y, i64 M, LoraScratch& tmp) {
  const void* wp = s.base + w.offset;
  const float* b = s.f32(w.bias_offset);
  if (w.format == 0)
    pk::linear_fwd(x, static_cast<const float*>(wp), b, y, M, w.rows, w.cols);
  else
    pk::linear_fwd_lowp(x, wp, static_cast<pk::LowpDtype>(w.format - 1), s.f32(w.scale_offset), b, y, M, w.rows,
                        w.cols, pk::Act::None);
  if (w.lora_a_offset < 0) return;
  const i64 r = w.lora_rank;
  tmp.t.resize(static_cast<size_t>(M * r));
  tmp.u.resize(static_cast<size_t>(M * w.rows));
  pk::linear_fwd(x, s.f32(w.lora_a_offset), nullptr, tmp.t.data(), M, r, w.cols);
  pk::linear_fwd(tmp.t.data(), s.f32(w.lora_b_offset), nullptr, tmp.u.data(), M, w.rows, r);
  const float sc = w.lora_scaling;
  for (i64 i = 0; i < M * w.rows; ++i) y[i] += tmp.u[i] * sc;  // base + (x A^T B^T) * scaling, as LoRALinear
}

void embed(const State& s, const PockDecWeight& w, const int64_t* ids, float* y, i64 n) {
  if (w.format == 0)
    pk::embedding_fwd(s.f32(w.offset), ids, y, n, w.rows, w.cols);
  else
    pk::embedding_fwd_lowp(s.base + w.offset, static_cast<pk::LowpDtype>(w.format - 1), s.f32(w.scale_offset), ids,
                           y, n, w.rows, w.cols);
}

// The rotary tables of positions p0 .. p0 + M - 1: cos/sin [M, head_dim], each row
// cat(f, f) of f = position * inv_freq (fp32, as HF's rotary embedding), times rope_scaling.
void rope_tables(const PockDecoder& d, i64 p0, i64 M, float* cos, float* sin) {
  const i64 hd = d.head_dim, half = hd / 2;
  for (i64 t = 0; t < M; ++t)
    for (i64 i = 0; i < half; ++i) {
      const float f = static_cast<float>(p0 + t) * d.inv_freq[i];
      const float c = std::cos(f) * d.rope_scaling, sn = std::sin(f) * d.rope_scaling;
      cos[t * hd + i] = cos[t * hd + half + i] = c;
      sin[t * hd + i] = sin[t * hd + half + i] = sn;
    }
}

// out[M, H * hd] = causal attention of q[M, H * hd] (positions p0 ..) over the cache's
// keys/values [0, p0 + t] ([ctx, KVH * hd] each; query head h reads kv head h / (H / KVH)).
void attention(const PockDecoder& d, const float* q, const float* kc, const float* vc, float* out, i64 p0, i64 M) {
  const i64 H = d.n_heads, KVH = d.n_kv_heads, hd = d.head_dim, group = H / KVH, kvw = KVH * hd;
  const float scale = d.attn_scale;
  pk::parallel_for(M * H, 1, [&](i64 b, i64 e) {
    std::vector<float> p(static_cast<size_t>(p0 + M));
    for (i64 task = b; task < e; ++task) {
      const i64 t = task / H, h = task % H, g = h / group;
      const i64 n = p0 + t + 1;  // keys 0 .. p0 + t
      const i64 start = d.sliding_window > 0 && n > d.sliding_window ? n - d.sliding_window : 0;
      const float* qv = q + t * H * hd + h * hd;
      float mx = -INFINITY;
      for (i64 s = start; s < n; ++s) {
        const float* kv = kc + s * kvw + g * hd;
        float acc = 0.0f;
        for (i64 i = 0; i < hd; ++i) acc += qv[i] * kv[i];
        p[s] = acc * scale;
        mx = std::max(mx, p[s]);
      }
      float sum = 0.0f;
      for (i64 s = start; s < n; ++s) sum += (p[s] = std::exp(p[s] - mx));
      const float inv = 1.0f / sum;
      float* o = out + t * H * hd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (i64 s = start; s < n; ++s) {
        const float w = p[s] * inv;
        const float* vv = vc + s * kvw + g * hd;
        for (i64 i = 0; i < hd; ++i) o[i] += w * vv[i];
      }
    }
  });
}

// The forward pass of M new rows at positions p0 ..: their keys/values join the cache
// and `logits` gets the last row's next-token logits [vocab].
struct Runner {
  const PockDecoder& d;
  State s;
  i64 ctx;                       // cache positions
  std::vector<float> kcache, vcache;  // [n_layers, ctx, KVH * hd]
  std::vector<float> x, h, q, qr, k, att, tmp, gate, up, cos, sin, rstd, logits;
  LoraScratch lora;

  Runner(const PockDecoder& dec, const uint8_t* state, i64 positions) : d(dec), s{state}, ctx(positions) {
    const size_t kv = static_cast<size_t>(d.n_layers) * ctx * d.n_kv_heads * d.head_dim;
    kcache.assign(kv, 0.0f);
    vcache.assign(kv, 0.0f);
    logits.resize(static_cast<size_t>(d.vocab));
  }

  void rows(i64 M) {
    const size_t m = static_cast<size_t>(M);
    const size_t qw = static_cast<size_t>(d.n_heads) * d.head_dim, kvw = static_cast<size_t>(d.n_kv_heads) * d.head_dim;
    x.resize(m * d.hidden);
    h.resize(m * d.hidden);
    tmp.resize(m * std::max<size_t>(d.hidden, kvw));
    q.resize(m * qw);
    qr.resize(m * qw);
    k.resize(m * kvw);
    att.resize(m * qw);
    gate.resize(m * d.intermediate);
    up.resize(m * d.intermediate);
    cos.resize(m * d.head_dim);
    sin.resize(m * d.head_dim);
    rstd.resize(m);
  }

  void forward(const int64_t* ids, i64 M, i64 p0) {
    rows(M);
    const i64 hd = d.head_dim, H = d.n_heads, KVH = d.n_kv_heads, D = d.hidden, kvw = KVH * hd;
    embed(s, d.embed, ids, x.data(), M);
    rope_tables(d, p0, M, cos.data(), sin.data());
    for (i64 l = 0; l < d.n_layers; ++l) {
      const PockDecLayer& L = d.layers[l];
      float* kc = kcache.data() + l * ctx * kvw;
      float* vc = vcache.data() + l * ctx * kvw;
      pk::rms_norm_fwd(x.data(), s.f32(L.attn_norm), h.data(), rstd.data(), M, D, d.eps);
      linear(s, L.q, h.data(), q.data(), M, lora);
      linear(s, L.k, h.data(), k.data(), M, lora);
      linear(s, L.v, h.data(), vc + p0 * kvw, M, lora);  // values straight into the cache
      pk::rope_fwd(q.data(), cos.data(), sin.data(), qr.data(), 1, H, M * hd, hd, 0, 1);
      pk::rope_fwd(k.data(), cos.data(), sin.data(), kc + p0 * kvw, 1, KVH, M * hd, hd, 0, 1);
      attention(d, qr.data(), kc, vc, att.data(), p0, M);
      linear(s, L.o, att.data(), tmp.data(), M, lora);
      for (i64 i = 0; i < M * D; ++i) x[i] += tmp[i];
      pk::rms_norm_fwd(x.data(), s.f32(L.mlp_norm), h.data(), rstd.data(), M, D, d.eps);
      linear(s, L.gate, h.data(), gate.data(), M, lora);
      linear(s, L.up, h.data(), up.data(), M, lora);
      pk::swiglu_fwd(gate.data(), up.data(), gate.data(), M * d.intermediate);
      linear(s, L.down, gate.data(), tmp.data(), M, lora);
      for (i64 i = 0; i < M * D; ++i) x[i] += tmp[i];
    }
    const float* last = x.data() + (M - 1) * D;
    pk::rms_norm_fwd(last, s.f32(d.final_norm), h.data(), rstd.data(), 1, D, d.eps);
    linear(s, d.lm_head, h.data(), logits.data(), 1, lora);
  }
};

// Deterministic RNG (splitmix64): the same seed draws the same numbers everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};

int64_t argmax(const float* v, i64 n) {
  i64 best = 0;
  for (i64 i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;  // the first maximum, as torch.argmax
  return best;
}

// Hugging Face's warpers in their order (temperature, top-k, top-p), then one draw.
int64_t sample(std::vector<float>& logits, const pock_generate_options& o, Rng& rng, std::vector<int32_t>& order) {
  const i64 V = static_cast<i64>(logits.size());
  if (o.temperature == 0.0f) return argmax(logits.data(), V);
  for (float& l : logits) l /= o.temperature;
  order.resize(static_cast<size_t>(V));
  for (i64 i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
  // descending by logit, ties by index: a total order, so the draw is reproducible
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  i64 keep = V;
  if (o.top_k > 0 && o.top_k < V) {  // HF: remove logits below the k-th largest (ties kept)
    const float kth = logits[order[o.top_k - 1]];
    keep = o.top_k;
    while (keep < V && logits[order[keep]] == kth) ++keep;
  }
  const float mx = logits[order[0]];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0.0;
  for (i64 i = 0; i < keep; ++i) sum += (p[i] = std::exp(static_cast<double>(logits[order[i]] - mx)));
  if (o.top_p < 1.0f) {  // HF: keep the smallest head whose mass reaches top_p (at least one token)
    double mass = 0.0;
    i64 head = 0;
    while (head < keep) {
      mass += p[head] / sum;
      ++head;
      if (mass >= static_cast<double>(o.top_p)) break;
    }
    keep = head;
    sum = 0.0;
    for (i64 i = 0; i < keep; ++i) sum += p[i];
  }
  const double u = rng.uniform() * sum;
  double acc = 0.0;
  for (i64 i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

pock_status check_options(const PockDecoder& d, const int64_t* prompt, int32_t n_prompt,
                          const pock_generate_options& o, const int64_t* out_ids, int32_t capacity) {
  if (n_prompt < 1) return fail(POCK_ERR_VALUE, "pock_generate: the prompt is empty (n_prompt %d)", n_prompt);
  if (!prompt) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: prompt is NULL");
  if (n_prompt > d.max_context)
    return fail(POCK_ERR_VALUE, "pock_generate: the prompt's %d tokens are longer than the model's context of %d",
                n_prompt, d.max_context);
  if (o.max_new_tokens < 0)
    return fail(POCK_ERR_VALUE, "pock_generate: max_new_tokens must be >= 0, got %d", o.max_new_tokens);
  if (static_cast<int64_t>(n_prompt) + o.max_new_tokens > d.max_context)
    return fail(POCK_ERR_VALUE,
                "pock_generate: max_new_tokens %d runs past the KV cache: the prompt's %d tokens + %d > the "
                "model's context of %d",
                o.max_new_tokens, n_prompt, o.max_new_tokens, d.max_context);
  for (int32_t i = 0; i < n_prompt; ++i)
    if (prompt[i] < 0 || prompt[i] >= d.vocab)
      return fail(POCK_ERR_VALUE, "pock_generate: prompt id %lld at position %d is outside the vocabulary [0, %d)",
                  (long long)prompt[i], i, d.vocab);
  if (!(o.temperature >= 0.0f) || std::isinf(o.temperature))
    return fail(POCK_ERR_VALUE, "pock_generate: temperature must be a finite number >= 0, got %g",
                (double)o.temperature);
  if (o.top_k < 0) return fail(POCK_ERR_VALUE, "pock_generate: top_k must be >= 0 (0: off), got %d", o.top_k);
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    return fail(POCK_ERR_VALUE, "pock_generate: top_p must be in (0, 1], got %g", (double)o.top_p);
  if (o.n_stop < 0 || (o.n_stop > 0 && !o.stop_ids))
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: %d stop ids but stop_ids is %s", o.n_stop,
                o.stop_ids ? "set" : "NULL");
  if (o.max_new_tokens > 0 && !out_ids) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: out_ids is NULL");
  if (capacity < o.max_new_tokens)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: out_ids holds %d ids, fewer than max_new_tokens %d",
                capacity, o.max_new_tokens);
  return POCK_OK;
}

pock_status run(pock_trainer* t, const int64_t* prompt, int32_t n_prompt, const pock_generate_options& o,
                int64_t* out_ids, int32_t* n_out) {
  const PockDecoder& d = *t->model->decoder;
  Runner r(d, t->state, static_cast<i64>(n_prompt) + std::max(o.max_new_tokens, 0));
  Rng rng{o.seed};
  std::vector<int32_t> order;
  pock_rt::PoolScope scope(t->pool);
  if (o.max_new_tokens == 0) return POCK_OK;
  r.forward(prompt, n_prompt, 0);
  for (int32_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t id = sample(r.logits, o, rng, order);
    out_ids[i] = id;
    *n_out = i + 1;
    bool stop = false;
    for (int32_t j = 0; j < o.n_stop; ++j) stop = stop || o.stop_ids[j] == id;
    if (o.callback && o.callback(id, o.user_data) != 0) stop = true;
    if (stop || i + 1 == o.max_new_tokens) break;
    r.forward(&id, 1, n_prompt + i);
  }
  return POCK_OK;
}

}  // namespace

extern "C" {

POCK_API void pock_generate_default_options(pock_generate_options* opts) {
  if (!opts) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->max_new_tokens = 32;
  opts->top_p = 1.0f;
}

POCK_API int32_t pock_generate_supported(void) {
  const PockDecoder* d = pock_compiled_model()->decoder;
  return d && d->supported ? 1 : 0;
}

POCK_API pock_status pock_generate(pock_trainer* t, const int64_t* prompt, int32_t n_prompt,
                                   const pock_generate_options* opts, int64_t* out_ids, int32_t capacity,
                                   int32_t* n_out) {
  try {
    if (!t) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: trainer is NULL");
    if (!n_out) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_generate: n_out is NULL");
    *n_out = 0;
    if (!t->state) return fail(POCK_ERR_CLOSED, "pock_generate: the trainer was closed");
    const PockModel* m = t->model;
    const PockDecoder* d = m->decoder;
    if (!d)
      return fail(POCK_ERR_INVALID_ARGUMENT,
                  "model '%s' is not a decoder-only causal LM that generation supports (a Hugging Face "
                  "LlamaForCausalLM-like model: Llama, Qwen2, Mistral, SmolLM2)", m->name);
    if (!d->supported)
      return fail(POCK_ERR_INVALID_ARGUMENT, "model '%s' cannot generate: %s", m->name, d->reason);
    pock_generate_options o;
    if (opts)
      o = *opts;
    else
      pock_generate_default_options(&o);
    if (pock_status s = check_options(*d, prompt, n_prompt, o, out_ids, capacity)) return s;
    return run(t, prompt, n_prompt, o, out_ids, n_out);
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "pock_generate: out of memory (KV cache and activations)");
  } catch (const std::exception& e) {
    return fail(POCK_ERR_INTERNAL, "pock_generate: internal error: %s", e.what());
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "pock_generate: internal error: unknown exception");
  }
}

}  // extern "C"
