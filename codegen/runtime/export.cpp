// export.cpp — adapters out from C (pock.h's pock_export_adapter): a trainer's LoRA adapters
// as a PEFT folder, adapter_model.safetensors + adapter_config.json, the same layout as
// toolchain/pockengine/adapters.py writes (peft.PeftModel.from_pretrained loads it onto the
// Hugging Face base model).  The adapters are the state tensors "<module>.lora_A" [r, in] /
// "<module>.lora_B" [out, r]; the decoder table gives the LM's path to strip and the scaling.
// safetensors: u64 little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}} padded to 8 bytes, then the raw fp32 data.  Each file is written to a
// temporary name, fsynced and renamed into place.
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

pock_status export_peft(pock_trainer* t, const char* dir) {
  const PockModel* m = t->model;
  const PockDecoder* d = m->decoder;
  if (!d || !d->supported)
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: model '%s' is not a Llama-family decoder with a "
                "decoder table (export its adapters from Python: trainer.export_adapter)", m->name);
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

}  // namespace

extern "C" POCK_API pock_status pock_export_adapter(pock_trainer* t, const char* path, const char* format) {
  try {
    if (!t) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: trainer is NULL");
    if (!path || !*path) return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: path is NULL or empty");
    const std::string fmt = format ? format : "peft";
    if (fmt == "peft") return export_peft(t, path);
    return fail(POCK_ERR_INVALID_ARGUMENT, "pock_export_adapter: format must be \"peft\" (\"gguf\" is written by "
                "the Python toolchain: trainer.export_adapter(path, format=\"gguf\")), got \"%s\"", fmt.c_str());
  } catch (const std::bad_alloc&) {
    return fail(POCK_ERR_NO_MEMORY, "pock_export_adapter: out of memory");
  } catch (...) {
    return fail(POCK_ERR_INTERNAL, "pock_export_adapter: internal error");
  }
}
