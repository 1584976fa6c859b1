// tok_internal.h — what the tokenizer's files share (not public: callers see the
// opaque pock_tokenizer of pock.h).
//
//   json.cpp        a small JSON reader (depth and size limits) for tokenizer.json
//   gguf.cpp        a GGUF metadata reader (bounds-checked) for tokenizer.ggml.*
//   unicode.cpp     UTF-8 decoding, code point classes, the split patterns
//   nfc.cpp         the NFC normalizer (tables: nfc_table.h, from gen_nfc_table.py)
//   bpe.cpp         the BPE model: merges by rank, scores, byte fallback
//   load.cpp        tokenizer.json / tokenizer_config.json / GGUF -> pock_tokenizer
//   tokenizer.cpp   the encode pipeline (added tokens, normalizers, pre-tokenizers), decoders, the C API
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pock_tok {

// Every reader throws this on bad input; the C API turns it into a status + message.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- json.cpp ----------------------------------------------------------------------
struct Json {
  enum Kind : uint8_t { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0;
  std::string str;                                     // String; the raw text for Number
  std::vector<Json> items;                             // Array
  std::vector<std::pair<std::string, Json>> members;   // Object, in file order

  const Json* get(const char* key) const;  // Object member or nullptr
  // Typed accessors: `what` names the field in the error thrown on a wrong type.
  const std::string& as_string(const char* what) const;
  int64_t as_int(const char* what) const;
  bool as_bool(const char* what) const;
};
Json parse_json(const char* data, size_t size);  // throws Error naming the byte offset

// ---- gguf.cpp ----------------------------------------------------------------------
struct GgufVocab {
  std::string model, pre, chat_template;  // tokenizer.ggml.model / .pre, tokenizer.chat_template
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> token_type;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
  std::vector<float> scores;
  int64_t bos = -1, eos = -1, unk = -1, pad = -1;
  int add_bos = -1, add_eos = -1, add_space_prefix = -1;  // -1: not given
};
bool is_gguf(const uint8_t* data, size_t size);
GgufVocab read_gguf_vocab(const uint8_t* data, size_t size);  // throws Error

// ---- unicode.cpp -------------------------------------------------------------------
// Decode UTF-8 the way Rust's String::from_utf8_lossy does: each maximal invalid
// subsequence becomes U+FFFD.  Returns the valid UTF-8 text.
std::string utf8_lossy(const char* s, size_t n);
// Code point at s[i] of valid UTF-8 (as utf8_lossy returns); sets len to its byte count.
uint32_t utf8_at(const std::string& s, size_t i, int* len);
void utf8_append(std::string& out, uint32_t cp);
// nfc.cpp: s (valid UTF-8) in Unicode Normalization Form C, in place.
void nfc(std::string& s);
enum CpClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2 };
CpClass cp_class(uint32_t cp);
bool cp_space(uint32_t cp);  // \s of the patterns: Unicode White_Space

enum class Pattern { Gpt2, Llama3, Qwen2 };
// The split pattern a tokenizer.json Split regex / GGUF pre names; throws Error for others.
Pattern pattern_from_regex(const std::string& regex);
// Append [start, end) byte offsets of the pattern's matches in text (valid UTF-8); the
// matches tile the text (every byte is in exactly one piece).
void split_pattern(Pattern p, const std::string& text, std::vector<std::pair<size_t, size_t>>& out);

// ---- bpe.cpp -----------------------------------------------------------------------
struct Bpe {
  std::vector<std::string> vocab;                  // id -> token text (the model's own vocab)
  std::unordered_map<std::string, int32_t> ids;    // token text -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left << 32 | right) -> (rank, merged id)
  std::vector<float> scores;                       // non-empty: SentencePiece merging by score (GGUF "llama")
  int32_t unk = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t byte_ids[256];                           // "<0xXX>" ids (-1 if absent), for byte fallback
  int32_t byte_level_ids[256];                     // ids of the byte-level alphabet's one-char tokens

  void finish();  // fills byte_ids / byte_level_ids once vocab and ids are set
  // Token ids of one pre-tokenized piece.  byte_level: piece is raw bytes to map through
  // the GPT-2 byte alphabet; else text whose characters are looked up as they are.
  void encode(const std::string& piece, bool byte_level, std::vector<int32_t>& out) const;
};
// GPT-2's bytes_to_unicode(): the code point standing for each byte.
uint32_t byte_to_cp(uint8_t b);
int cp_to_byte(uint32_t cp);  // -1 if cp is not in the byte alphabet

}  // namespace pock_tok

// ---- the tokenizer (load.cpp, tokenizer.cpp) --------------------------------------
namespace pock_tok {

constexpr int32_t kMaxVocab = 1 << 24;
constexpr const char* kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct Added {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word;
};

struct Normalizer {
  enum Kind { Prepend, Replace, Lowercase, Nfc } kind;
  std::string a, b;
};

struct PreTokenizer {
  enum Kind { ByteLevel, Split, Digits, Metaspace } kind;
  bool add_prefix_space = false, use_regex = true, individual = false, split = true;
  Pattern pattern = Pattern::Gpt2;
  std::string replacement;
  int prepend = 0;  // Metaspace: 0 never, 1 first, 2 always
};

struct Decoder {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  std::string a, b;
  int start = 0, stop = 0, prepend = 0;
};

}  // namespace pock_tok

struct pock_tokenizer {
  pock_tok::Bpe bpe;
  std::vector<pock_tok::Added> added;                 // split out of the text before everything else
  std::vector<std::vector<size_t>> added_by_byte;     // first byte -> indices into added, longest first
  std::vector<std::string> id_text;                   // id -> token text (vocab and added tokens)
  std::vector<uint8_t> id_kind;                       // 0 none (a hole), 1 token, 2 special added token
  std::vector<pock_tok::Normalizer> norm;
  std::vector<pock_tok::PreTokenizer> pre;
  std::vector<pock_tok::Decoder> dec;
  bool has_decoder = false, byte_level = false;
  std::vector<int32_t> prefix, suffix;  // added around the ids when special tokens are asked for
  int32_t bos = -1, eos = -1, pad = -1;
  std::string chat_template;
  // results of the last call (valid until the next call on this tokenizer)
  std::vector<int32_t> ids_out;
  std::string text_out;
  std::unordered_map<std::string, std::vector<int32_t>> cache;  // short pieces -> ids
};

namespace pock_tok {

int32_t lookup(const pock_tokenizer& t, const std::string& s);  // token text -> id (added tokens first), or -1
void set_vocab(pock_tokenizer& t, int32_t id, const std::string& text, uint8_t kind);
void load_json(pock_tokenizer& t, const Json& root);    // tokenizer.json
void load_config(pock_tokenizer& t, const Json& cfg);   // tokenizer_config.json: special tokens, chat template
void guess_specials(pock_tokenizer& t);                 // no config: the families' usual names
void load_gguf(pock_tokenizer& t, const uint8_t* data, size_t size);

}  // namespace pock_tok

