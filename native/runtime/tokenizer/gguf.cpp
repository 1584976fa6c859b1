// gguf.cpp — the tokenizer metadata of a GGUF file (tokenizer.ggml.*), read from
// untrusted bytes: every length and count is checked against the bytes left before
// anything is read or allocated; other keys are skipped.
#include <cstring>

#include "tok_internal.h"

namespace pock_tok {
namespace {

enum GgufType : uint32_t {
  kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64, kTypeCount
};

constexpr uint64_t kScalarSize[kTypeCount] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
constexpr int kMaxArrayDepth = 8;

struct Reader {
  const uint8_t* p;
  size_t n, i = 0;

  [[noreturn]] void bad(const std::string& what) const {
    throw Error("corrupt GGUF metadata at byte " + std::to_string(i) + ": " + what);
  }
  void need(uint64_t k, const char* what) const {
    if (k > n - i) bad(std::string("truncated ") + what);
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + i, sizeof v);
    i += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    const uint64_t len = get<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p + i), static_cast<size_t>(len));
    i += static_cast<size_t>(len);
    return s;
  }
  void skip(uint32_t type, int depth) {
    if (type >= kTypeCount) bad("unknown value type " + std::to_string(type));
    if (type == kString) {
      const uint64_t len = get<uint64_t>("string length");
      need(len, "string");
      i += static_cast<size_t>(len);
    } else if (type == kArray) {
      if (depth >= kMaxArrayDepth) bad("arrays nested too deeply");
      const uint32_t et = get<uint32_t>("array type");
      const uint64_t count = get<uint64_t>("array length");
      if (et >= kTypeCount) bad("unknown array element type " + std::to_string(et));
      if (et != kString && et != kArray) {
        if (count > (n - i) / kScalarSize[et]) bad("array longer than the file");
        i += static_cast<size_t>(count * kScalarSize[et]);
      } else {
        if (count > (n - i) / 8) bad("array longer than the file");  // each element holds at least 8 bytes
        for (uint64_t k = 0; k < count; ++k) skip(et, depth + 1);
      }
    } else {
      need(kScalarSize[type], "value");
      i += static_cast<size_t>(kScalarSize[type]);
    }
  }
  int64_t integer(uint32_t type, const std::string& key) {
    switch (type) {
      case kU8: return get<uint8_t>("value");
      case kI8: return get<int8_t>("value");
      case kU16: return get<uint16_t>("value");
      case kI16: return get<int16_t>("value");
      case kU32: return get<uint32_t>("value");
      case kI32: return get<int32_t>("value");
      case kU64: {
        const uint64_t v = get<uint64_t>("value");
        return v > INT32_MAX ? -1 : static_cast<int64_t>(v);
      }
      case kI64: return get<int64_t>("value");
      default: bad(key + " is not an integer");
    }
  }
  // An array header of element type `want`: the element count.
  uint64_t array(uint32_t type, uint32_t want, const std::string& key) {
    if (type != kArray) bad(key + " is not an array");
    const uint32_t et = get<uint32_t>("array type");
    const uint64_t count = get<uint64_t>("array length");
    if (et != want) bad(key + " has elements of type " + std::to_string(et) + ", expected " + std::to_string(want));
    const uint64_t min_size = want == kString ? 8 : kScalarSize[want];
    if (count > (n - i) / min_size) bad(key + ": array longer than the file");
    return count;
  }
};

}  // namespace

bool is_gguf(const uint8_t* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

GgufVocab read_gguf_vocab(const uint8_t* data, size_t size) {
  Reader r{data, size};
  if (!is_gguf(data, size)) r.bad("no GGUF magic");
  r.i = 4;
  const uint32_t version = r.get<uint32_t>("version");
  if (version < 2 || version > 3) r.bad("unsupported GGUF version " + std::to_string(version) + " (2 and 3 are read)");
  r.get<uint64_t>("tensor count");
  const uint64_t n_kv = r.get<uint64_t>("key count");
  if (n_kv > (size - r.i) / 12) r.bad("more keys than the file holds");
  GgufVocab v;
  bool have_tokens = false;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = r.str("key");
    const uint32_t type = r.get<uint32_t>("value type");
    if (key == "tokenizer.ggml.model" || key == "tokenizer.ggml.pre" || key == "tokenizer.chat_template") {
      if (type != kString) r.bad(key + " is not a string");
      std::string s = r.str("string");
      (key == "tokenizer.ggml.model" ? v.model : key == "tokenizer.ggml.pre" ? v.pre : v.chat_template) = std::move(s);
    } else if (key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.merges") {
      const uint64_t count = r.array(type, kString, key);
      auto& out = key == "tokenizer.ggml.tokens" ? v.tokens : v.merges;
      out.clear();
      out.reserve(static_cast<size_t>(count));
      for (uint64_t j = 0; j < count; ++j) out.push_back(r.str("string"));
      have_tokens |= key == "tokenizer.ggml.tokens";
    } else if (key == "tokenizer.ggml.token_type") {
      const uint64_t count = r.array(type, kI32, key);
      v.token_type.resize(static_cast<size_t>(count));
      if (count > 0) std::memcpy(v.token_type.data(), r.p + r.i, static_cast<size_t>(count) * 4);  // an empty vector's data() may be null
      r.i += static_cast<size_t>(count) * 4;
    } else if (key == "tokenizer.ggml.scores") {
      const uint64_t count = r.array(type, kF32, key);
      v.scores.resize(static_cast<size_t>(count));
      if (count > 0) std::memcpy(v.scores.data(), r.p + r.i, static_cast<size_t>(count) * 4);  // an empty vector's data() may be null
      r.i += static_cast<size_t>(count) * 4;
    } else if (key == "tokenizer.ggml.bos_token_id") {
      v.bos = r.integer(type, key);
    } else if (key == "tokenizer.ggml.eos_token_id") {
      v.eos = r.integer(type, key);
    } else if (key == "tokenizer.ggml.unknown_token_id") {
      v.unk = r.integer(type, key);
    } else if (key == "tokenizer.ggml.padding_token_id") {
      v.pad = r.integer(type, key);
    } else if (key == "tokenizer.ggml.add_bos_token" || key == "tokenizer.ggml.add_eos_token" ||
               key == "tokenizer.ggml.add_space_prefix") {
      if (type != kBool) r.bad(key + " is not a bool");
      const int b = r.get<uint8_t>("bool") != 0;
      (key == "tokenizer.ggml.add_bos_token" ? v.add_bos : key == "tokenizer.ggml.add_eos_token" ? v.add_eos
                                                                                                 : v.add_space_prefix) = b;
    } else {
      r.skip(type, 0);
    }
  }
  if (!have_tokens) throw Error("the GGUF file has no tokenizer (no tokenizer.ggml.tokens)");
  if (!v.token_type.empty() && v.token_type.size() != v.tokens.size())
    throw Error("GGUF tokenizer.ggml.token_type has " + std::to_string(v.token_type.size()) + " entries for " +
                std::to_string(v.tokens.size()) + " tokens");
  if (!v.scores.empty() && v.scores.size() != v.tokens.size())
    throw Error("GGUF tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
                std::to_string(v.tokens.size()) + " tokens");
  return v;
}

}  // namespace pock_tok
