// decoder.cpp — the forward pass of generation (native/runtime/generate.cpp's pock_generate):
// a Llama-family decoder (the PockDecoder table of pock_model.h, emitted by
// toolchain/pockengine/codegen/decoder.py) run from the trainer's state in place: the same bytes the
// training step reads and updates, LoRA adapters and frozen weights stored in low precision
// included.  A session holds the fp32 KV cache [layer][position][kv head * head_dim] for the
// positions of one pock_generate call and the activations of its rows (the one kernel file
// that allocates: a session is made per call, outside any training step).  Every product is a
// pk:: kernel with fp32 accumulation (linear_fwd / linear_fwd_lowp, rms_norm_fwd, rope_fwd,
// swiglu_fwd, embedding_fwd(_lowp)); attention over the cache is the loop below.
//
// Per layer, for the rows at positions p0 .. p0 + M - 1 (HF LlamaDecoderLayer):
//   h = rms_norm(x) ; q, k, v = h Wq^T, h Wk^T, h Wv^T (+ LoRA) ; rope(q), rope(k)
//   k, v -> cache ; a = softmax(q K^T * scale, causal) V ; x += a Wo^T
//   h = rms_norm(x) ; x += (silu(h Wg^T) * h Wu^T) Wd^T
// and logits = rms_norm(x_last) Whead^T.
#include <algorithm>
#include <cmath>
#include <vector>

#include "pock_kernels.h"
#include "pock_model.h"
#include "pock_parallel.h"

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
  else if (M == 1)  // a decode step: the one-row kernel (gemv.cpp)
    pk::gemv_lowp(x, wp, static_cast<pk::LowpDtype>(w.format - 1), s.f32(w.scale_offset), b, y, w.rows, w.cols);
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
  // a (query row, head) task reads p0 + t + 1 keys and values: one token's few heads stay on the caller
  pk::parallel_for(M * H, pk::grain_for_work(2 * (p0 + 1) * hd, pk::kMinChunkMacs), [&](i64 b, i64 e) {
    thread_local std::vector<float> scores;  // grown once per thread, not per token
    if (scores.size() < static_cast<size_t>(p0 + M)) scores.resize(static_cast<size_t>(p0 + M));
    float* p = scores.data();
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
}  // namespace

struct PockDecSession {
  const PockDecoder& d;
  State s;
  i64 ctx;                       // cache positions
  std::vector<float> kcache, vcache;  // [n_layers, ctx, KVH * hd]
  std::vector<float> x, h, q, qr, k, att, tmp, gate, up, cos, sin, rstd, logits;
  LoraScratch lora;

  PockDecSession(const PockDecoder& dec, const uint8_t* state, i64 positions) : d(dec), s{state}, ctx(positions) {
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

namespace pk {

PockDecSession* decoder_open(const PockDecoder* d, const uint8_t* state, int64_t positions) {
  return new PockDecSession(*d, state, positions);
}

const float* decoder_forward(PockDecSession* s, const int64_t* ids, int64_t M, int64_t p0) {
  s->forward(ids, M, p0);
  return s->logits.data();
}

void decoder_close(PockDecSession* s) { delete s; }

}  // namespace pk
