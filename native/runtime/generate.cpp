// generate.cpp — text generation next to training (pock.h's pock_generate): the checks,
// the prefill + decode loop, sampling, stop ids and the streaming callback.  The forward
// pass itself is kernels/decoder.cpp, reached through the model's PockDecoder table (so
// this file links without the kernels).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "runtime_internal.h"

using pock_rt::fail;
using i64 = int64_t;

namespace {

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
  if (o.max_new_tokens == 0) return POCK_OK;
  std::unique_ptr<PockDecSession, void (*)(PockDecSession*)> r(
      d.open(&d, t->state, static_cast<i64>(n_prompt) + o.max_new_tokens), d.close);
  Rng rng{o.seed};
  std::vector<float> logits(static_cast<size_t>(d.vocab));
  std::vector<int32_t> order;
  pock_rt::PoolScope scope(t->pool);
  const float* out = d.forward(r.get(), prompt, n_prompt, 0);
  for (int32_t i = 0; i < o.max_new_tokens; ++i) {
    std::copy(out, out + d.vocab, logits.begin());  // sampling scales them in place
    const int64_t id = sample(logits, o, rng, order);
    out_ids[i] = id;
    *n_out = i + 1;
    bool stop = false;
    for (int32_t j = 0; j < o.n_stop; ++j) stop = stop || o.stop_ids[j] == id;
    if (o.callback && o.callback(id, o.user_data) != 0) stop = true;
    if (stop || i + 1 == o.max_new_tokens) break;
    out = d.forward(r.get(), &id, 1, n_prompt + i);
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
    if (!d->open || !d->forward || !d->close)
      return fail(POCK_ERR_INTERNAL, "model '%s': its decoder table has no forward pass", m->name);
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
