// export.cpp — adapters out from C (pock.h's pock_export_adapter): a trainer's LoRA adapters
// in the layouts toolchain/pockengine/runtime/adapters.py writes, byte for byte:
//  * "peft": a folder, adapter_model.safetensors + adapter_config.json
//    (peft.PeftModel.from_pretrained loads it onto the Hugging Face base model).  The adapters
//    are the state tensors "<module>.lora_A" [r, in] / "<module>.lora_B" [out, r]; the decoder
//    table gives the LM's path to strip and the scaling.  safetensors: u64 little-endian header
//    length, a JSON header {name: {dtype, shape, data_offsets}} padded to 8 bytes, then the raw
//    fp32 data.
//  * "gguf": one llama.cpp LoRA adapter file (`--lora`), what gguf-py's GGUFWriter writes for
//    adapters.py: GGUF v3, kv general.architecture / general.type = "adapter" / adapter.type =
//    "lora" / adapter.lora.alpha (f32), tensors blk.N.<attn_q|...|ffn_down>.weight.lora_a
//    (ggml ne [in, r]) and .lora_b (ne [r, out]) in fp32, data 32-byte aligned; for the
//    llama/mistral architectures lora_b's q/k rows in convert_hf_to_gguf's rotary order.
// Each file is written to a temporary name, fsynced and renamed into place.  Only adapters
// travel: a model that also trains base weights is refused (as in Python).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "runtime_internal.h"

using pock_rt::fail;

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Writes head then the tensors' bytes as pock_save writes a checkpoint (through links,
// regular files only, temporary file + fsync + rename).
pock_status write_atomic(const std::string& path, const std::string& head, const uint8_t* state,
                         const std::vector<const PockStateTensor*>& data) {
  return pock_rt::write_file_atomically(path.c_str(), "pock_export_adapter: cannot write", [&](FILE* f) {
    bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
    for (const PockStateTensor* t : data)
      ok = ok && std::fwrite(state + t->offset, 1, static_cast<size_t>(t->nbytes), f) == static_cast<size_t>(t->nbytes);
    return ok ? 0 : (errno ? errno : EIO);
  });
}

std::string shape_json(const PockStateTensor& t) {
  std::string s = "[";
  for (int32_t d = 0; d < t.ndim; ++d) s += (d ? "," : "") + std::to_string(t.shape[d]);
  return s + "]";
}

float lora_scaling(const PockDecoder& d) {
  auto pick = [](const PockDecWeight& w) { return w.lora_a_offset >= 0 ? w.lora_scaling : 0.0f; };
  float s = pick(d.lm_head);
  for (int32_t l = 0; l < d.n_layers && s == 0.0f; ++l) {
    const PockDecLayer& L = d.layers[l];
    for (const PockDecWeight* w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      if (s == 0.0f) s = pick(*w);
  }
  return s;
}

// Python's rule (adapters.py): an update scheme that also trains base weights has no adapter-only export.
pock_status check_adapters_only(const PockModel* m) {
  std::string base;
  int32_t n = 0;
  for (int32_t i = 0; i < m->n_trained; ++i) {
    const std::string name = m->trained[i];
    if (ends_with(name, ".lora_A") || ends_with(name, ".lora_B")) continue;
    if (n++ < 4) base += (base.empty() ? "" : ", ") + name;
  }
  if (n == 0) return POCK_OK;
  return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: the update scheme also trains base weights (%s%s), "
              "which an adapter cannot carry; save a checkpoint instead", base.c_str(), n > 4 ? " ..." : "");
}

pock_status export_peft(pock_trainer* t, const char* dir) {
  const PockModel* m = t->model;
  const PockDecoder* d = m->decoder;
  if (!d || !d->supported)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: model '%s' is not a Llama-family decoder with a "
                "decoder table (export its adapters from Python: trainer.export_adapter)", m->name);
  if (pock_status s = check_adapters_only(m)) return s;
  const std::string prefix = d->prefix ? d->prefix : "";
  std::vector<const PockStateTensor*> data;
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}", targets;
  int64_t pos = 0, rank = 0;
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& a = m->state[i];
    const std::string name = a.name;
    if (!ends_with(name, ".lora_A")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const int32_t bi = pock_rt::find_state(m, (module + ".lora_B").c_str());
    if (bi < 0 || a.dtype != POCK_F32 || a.ndim != 2) continue;
    const PockStateTensor& b = m->state[bi];
    const std::string rel = module.compare(0, prefix.size(), prefix) == 0 ? module.substr(prefix.size()) : module;
    if (rank && a.shape[0] != rank)
      return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: adapters of ranks %lld and %lld",
                  (long long)rank, (long long)a.shape[0]);
    rank = a.shape[0];
    for (const PockStateTensor* x : {&a, &b}) {
      header += ",\"base_model.model." + rel + (x == &a ? ".lora_A" : ".lora_B") + ".weight\":{\"dtype\":\"F32\","
                "\"shape\":" + shape_json(*x) + ",\"data_offsets\":[" + std::to_string(pos) + "," +
                std::to_string(pos + x->nbytes) + "]}";
      pos += x->nbytes;
      data.push_back(x);
    }
    targets += (targets.empty() ? "\"" : ", \"") + rel + "\"";
  }
  if (data.empty())
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: model '%s' has no LoRA adapters", m->name);
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int k = 0; k < 8; ++k) head[k] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * k)) & 0xFF);
  head += header;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return fail(POCK_ERR_IO, "pock_export_adapter: cannot create the folder '%s': %s", dir, std::strerror(errno));
  const std::string folder = dir;
  if (pock_status s = write_atomic(folder + "/adapter_model.safetensors", head, t->state, data)) return s;
  char alpha[64];
  std::snprintf(alpha, sizeof alpha, "%.9g", static_cast<double>(lora_scaling(*d)) * static_cast<double>(rank));
  const std::string config = "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " +
                             std::to_string(rank) + ",\n  \"lora_alpha\": " + alpha + ",\n  \"target_modules\": [" +
                             targets + "],\n  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": "
                             "false,\n  \"use_rslora\": false,\n  \"use_dora\": false,\n  \"init_lora_weights\": "
                             "true,\n  \"inference_mode\": true,\n  \"modules_to_save\": null,\n  "
                             "\"base_model_name_or_path\": null\n}\n";
  return write_atomic(folder + "/adapter_config.json", config, t->state, {});
}

void put_u32(std::string& s, uint32_t v) {
  for (int k = 0; k < 4; ++k) s += static_cast<char>((v >> (8 * k)) & 0xFF);
}
void put_u64(std::string& s, uint64_t v) {
  for (int k = 0; k < 8; ++k) s += static_cast<char>((v >> (8 * k)) & 0xFF);
}
void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}
void put_kv_str(std::string& s, const char* key, const std::string& v) {
  put_str(s, key);
  put_u32(s, 8);  // GGUF_TYPE_STRING
  put_str(s, v);
}
void pad32(std::string& s) { s.append((32 - s.size() % 32) % 32, '\0'); }

// One adapter's two tensors in llama.cpp's names; permute_heads > 0: lora_b's rows permuted
// as convert_hf_to_gguf's LlamaModel.permute (n_head, 2, rows / n_head / 2) -> swap the last two.
struct GgufAdapter {
  std::string base;
  const PockDecWeight* w;
  int32_t permute_heads;
};

pock_status export_gguf(pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  const PockDecoder* d = m->decoder;
  if (!d || !d->supported)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: format \"gguf\" needs a Llama-family decoder "
                "(llama.cpp's tensor names); model '%s' %s", m->name, d ? d->reason : "has no decoder table");
  if (pock_status s = check_adapters_only(m)) return s;
  const std::string arch = std::strcmp(d->arch, "mistral") == 0 ? "llama" : d->arch;
  const bool rotary_rows = arch == "llama";
  static const char* const kNames[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  std::vector<GgufAdapter> adapters;
  for (int32_t l = 0; l < d->n_layers; ++l) {
    const PockDecLayer& L = d->layers[l];
    const PockDecWeight* ws[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int j = 0; j < 7; ++j) {
      if (ws[j]->lora_a_offset < 0) continue;
      const int32_t heads = !rotary_rows ? 0 : j == 0 ? d->n_heads : j == 1 ? d->n_kv_heads : 0;
      adapters.push_back({"blk." + std::to_string(l) + "." + kNames[j], ws[j], heads});
    }
  }
  if (d->lm_head.lora_a_offset >= 0) adapters.push_back({"output", &d->lm_head, 0});
  int32_t n_lora = 0;
  for (int32_t i = 0; i < m->n_state; ++i) {  // every adapter needs a llama.cpp tensor
    const PockStateTensor& a = m->state[i];
    if (!ends_with(a.name, ".lora_A")) continue;
    ++n_lora;
    bool found = false;
    for (const GgufAdapter& g : adapters) found = found || g.w->lora_a_offset == a.offset;
    if (!found)
      return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: format \"gguf\": no llama.cpp tensor for the "
                  "adapter of '%.*s'", static_cast<int>(std::strlen(a.name) - 7), a.name);
  }
  if (n_lora == 0 || adapters.empty())
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: model '%s' has no LoRA adapters", m->name);
  const double alpha = static_cast<double>(adapters[0].w->lora_scaling) * adapters[0].w->lora_rank;
  for (const GgufAdapter& g : adapters) {
    const double a = static_cast<double>(g.w->lora_scaling) * g.w->lora_rank;
    if (static_cast<float>(a) != static_cast<float>(alpha))
      return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: format \"gguf\": llama.cpp takes one alpha per "
                  "adapter, got %g and %g", alpha, a);
  }
  // header: magic, version 3, tensor count, kv count; the kv pairs; the tensor infos
  std::string file = "GGUF";
  put_u32(file, 3);
  put_u64(file, 2 * adapters.size());
  put_u64(file, 4);
  put_kv_str(file, "general.architecture", arch);
  put_kv_str(file, "general.type", "adapter");
  put_kv_str(file, "adapter.type", "lora");
  put_str(file, "adapter.lora.alpha");
  put_u32(file, 6);  // GGUF_TYPE_FLOAT32
  const float alpha32 = static_cast<float>(alpha);
  uint32_t bits;
  std::memcpy(&bits, &alpha32, 4);
  put_u32(file, bits);
  uint64_t offset = 0;
  for (const GgufAdapter& g : adapters) {
    const int64_t r = g.w->lora_rank;
    for (int b = 0; b < 2; ++b) {
      put_str(file, g.base + (b ? ".weight.lora_b" : ".weight.lora_a"));
      put_u32(file, 2);
      put_u64(file, static_cast<uint64_t>(b ? r : g.w->cols));  // ne[0]: the row length
      put_u64(file, static_cast<uint64_t>(b ? g.w->rows : r));
      put_u32(file, 0);  // GGML_TYPE_F32
      put_u64(file, offset);
      const uint64_t nbytes = static_cast<uint64_t>(r) * (b ? g.w->rows : g.w->cols) * 4;
      offset += nbytes + (32 - nbytes % 32) % 32;
    }
  }
  pad32(file);
  for (const GgufAdapter& g : adapters) {
    const int64_t r = g.w->lora_rank, rows = g.w->rows, cols = g.w->cols;
    const char* a = reinterpret_cast<const char*>(t->state + g.w->lora_a_offset);
    file.append(a, static_cast<size_t>(r * cols * 4));
    pad32(file);
    const char* b = reinterpret_cast<const char*>(t->state + g.w->lora_b_offset);
    const int64_t per_head = g.permute_heads > 0 ? rows / g.permute_heads : 0;
    if (per_head == 0 || per_head % 2 != 0 || per_head * g.permute_heads != rows) {
      file.append(b, static_cast<size_t>(rows * r * 4));
    } else {  // row h*per_head + j*2 + i <- row h*per_head + i*half + j
      const int64_t half = per_head / 2;
      for (int64_t h = 0; h < g.permute_heads; ++h)
        for (int64_t j = 0; j < half; ++j)
          for (int64_t i = 0; i < 2; ++i)
            file.append(b + ((h * per_head + i * half + j) * r) * 4, static_cast<size_t>(r * 4));
    }
    pad32(file);
  }
  return write_atomic(path, file, t->state, {});
}

}  // namespace

extern "C" POCK_API pock_status pock_export_adapter(pock_trainer* t, const char* path, const char* format) {
  try {
    if (!t) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: trainer is NULL");
    if (!path || !*path) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: path is NULL or empty");
    const std::string fmt = format ? format : "peft";
    if (fmt == "peft") return export_peft(t, path);
    if (fmt == "gguf") return export_gguf(t, path);
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: format must be \"peft\" or \"gguf\", got \"%s\"",
                fmt.c_str());
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "pock_export_adapter: out of memory");
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "pock_export_adapter: internal error");
  }
}
