// fuzz_tokenizer.cpp — libFuzzer target for the runtime's tokenizer (issue 37): the
// first byte of an input picks what the rest is fed to:
//   0: pock_tokenizer_open_memory (a hostile tokenizer.json or GGUF file), then an
//      encode and a decode with whatever opened;
//   1: encode (arbitrary bytes: invalid UTF-8, special-token fragments) with a
//      byte-level BPE tokenizer (GPT-2 pattern, added tokens), then decode its ids;
//   2: the same with a SentencePiece-style BPE (byte fallback, NFC/Prepend/Replace, Llama-3
//      pattern variant off) tokenizer;
//   3: decode of the bytes read as int32 ids (out-of-range ids included).
// A crash, sanitizer report, leak-free failure to return a status or an encode/decode
// round trip that breaks on valid UTF-8 (byte-level) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pock.h"

namespace {

std::string byte_level_json() {
  std::string vocab, sep;
  int id = 0;
  auto add = [&](const std::string& tok) {
    std::string esc;
    for (unsigned char c : tok) {
      if (c == '"' || c == '\\') esc += '\\';
      esc += static_cast<char>(c);
    }
    vocab += sep + "\"" + esc + "\": " + std::to_string(id++);
    sep = ", ";
  };
  for (int b = 0; b < 256; ++b) {  // GPT-2's byte alphabet
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    static int next = 256;
    const uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
    add(s);
  }
  for (const char* t : {"\xC4\xA0t", "he", "\xC4\xA0the", "in", "\xC4\xA0" "a", "er"}) add(t);
  return "{\"added_tokens\": [{\"id\": 262, \"content\": \"<|im_end|>\", \"special\": true},"
         " {\"id\": 263, \"content\": \"<s>\", \"special\": true, \"lstrip\": true, \"rstrip\": true}],"
         " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
         " \"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\","
         " \"vocab\": {" + vocab + ", \"<|im_end|>\": 262, \"<s>\": 263}, \"merges\": [\"\xC4\xA0 t\", \"h e\","
         " \"\xC4\xA0t he\", \"i n\", \"\xC4\xA0 a\", \"e r\"]}}";
}

std::string sentencepiece_json() {
  std::string vocab = "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2";
  int id = 3;
  for (int b = 0; b < 256; ++b) {
    char name[16];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab += std::string(", \"") + name + "\": " + std::to_string(id++);
  }
  for (const char* t : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xC3\xA9"})
    vocab += std::string(", \"") + t + "\": " + std::to_string(id++);
  return "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true},"
         " {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
         " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"},"
         " {\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
         " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
         " \"pre_tokenizer\": null, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
         "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
         " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
         " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"},"
         " \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \","
         " \"start\": 1, \"stop\": 0}]}, \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,"
         " \"fuse_unk\": true, \"vocab\": {" + vocab + "}, \"merges\": [[\"\xE2\x96\x81\", \"a\"], [\"a\", \"b\"]]}}";
}

pock_tokenizer* open_json(const std::string& s) {
  pock_tokenizer* t = nullptr;
  if (pock_tokenizer_open_memory(s.data(), static_cast<int64_t>(s.size()), &t) != POCK_OK) {
    std::fprintf(stderr, "fixture tokenizer failed to open: %s\n", pock_last_error());
    std::abort();
  }
  return t;
}

pock_tokenizer* g_byte = nullptr;
pock_tokenizer* g_sp = nullptr;

bool valid_utf8(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n;) {
    const uint8_t b = p[i];
    int len = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (!len || i + len > n) return false;
    for (int k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    if (len == 3 && ((b == 0xE0 && p[i + 1] < 0xA0) || (b == 0xED && p[i + 1] > 0x9F))) return false;
    if (len == 4 && ((b == 0xF0 && p[i + 1] < 0x90) || (b == 0xF4 && p[i + 1] > 0x8F))) return false;
    i += len;
  }
  return true;
}

void encode_decode(pock_tokenizer* t, const uint8_t* data, size_t size, bool check_round_trip) {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  if (pock_tokenizer_encode(t, reinterpret_cast<const char*>(data), static_cast<int64_t>(size), 0, &ids, &n) != POCK_OK)
    return;
  std::vector<int32_t> copy(ids, ids + n);
  const char* text = nullptr;
  int64_t nbytes = 0;
  if (pock_tokenizer_decode(t, copy.data(), n, 0, &text, &nbytes) != POCK_OK) {
    std::fprintf(stderr, "decode of encode's ids failed: %s\n", pock_last_error());
    std::abort();
  }
  // (lstrip/rstrip added tokens swallow the whitespace beside them, as in Hugging Face)
  if (check_round_trip && valid_utf8(data, size) && !std::memchr(data, '<', size) &&
      (static_cast<size_t>(nbytes) != size || std::memcmp(text, data, size) != 0)) {
    std::fprintf(stderr, "byte-level round trip differs\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_byte = open_json(byte_level_json());
  g_sp = open_json(sentencepiece_json());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  ++data;
  --size;
  if (mode == 0) {
    pock_tokenizer* t = nullptr;
    if (pock_tokenizer_open_memory(data, static_cast<int64_t>(size), &t) == POCK_OK) {
      static const char kText[] = "Hello w\xC3\xB6rld <s> 123 \xF0\x9F\xA4\x96 \xFF";
      encode_decode(t, reinterpret_cast<const uint8_t*>(kText), sizeof kText - 1, false);
      int32_t vs = 0;
      pock_tokenizer_vocab_size(t, &vs);
      const int32_t probe[] = {0, 1, vs - 1, vs, -1};
      const char* text;
      int64_t nbytes;
      pock_tokenizer_decode(t, probe, 5, 1, &text, &nbytes);
      pock_tokenizer_close(t);
    } else if (pock_last_error()[0] == '\0') {
      std::fprintf(stderr, "open failed without a message\n");
      std::abort();
    }
  } else if (mode == 1) {
    encode_decode(g_byte, data, size, true);
  } else if (mode == 2) {
    encode_decode(g_sp, data, size, false);
  } else {
    std::vector<int32_t> ids(size / 4);
    if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
    for (int32_t& id : ids) id = static_cast<int32_t>(static_cast<uint32_t>(id) % 600u) - 20;  // near the vocab
    const char* text;
    int64_t nbytes;
    pock_tokenizer_decode(g_byte, ids.data(), static_cast<int64_t>(ids.size()), 0, &text, &nbytes);
    pock_tokenizer_decode(g_sp, ids.data(), static_cast<int64_t>(ids.size()), 1, &text, &nbytes);
  }
  return 0;
}
