// tokenizer.cpp — pock_tokenizer: loading (tokenizer.json, GGUF), the encode pipeline
// (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor), decoders, and
// the C API of pock.h.  Follows Hugging Face `tokenizers` step by step, so the ids are
// the same; what is not supported is refused with a message naming it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "../runtime_internal.h"
#include "tok_internal.h"

using pock_tok::Error;
using pock_tok::Json;

namespace pock_tok {
namespace {

constexpr int32_t kMaxVocab = 1 << 24;
constexpr size_t kMaxFileBytes = size_t{1} << 31;  // tokenizer.json / GGUF read into memory
constexpr size_t kMaxText = size_t{1} << 30;
constexpr size_t kCacheMaxPiece = 64, kCacheMaxEntries = 1 << 16;
const char* const kMeta = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's space

struct Added {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word;
};

struct Normalizer {
  enum Kind { Prepend, Replace, Lowercase, Identity } kind;
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

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) out.append(s, i, j - i) += to;
  out.append(s, i, std::string::npos);
  s.swap(out);
}

std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open " + path);
  std::string data;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (data.size() + got > kMaxFileBytes) {
      std::fclose(f);
      throw Error(path + " is larger than 2 GiB");
    }
    data.append(buf, got);
  }
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) throw Error("cannot read " + path);
  return data;
}

bool exists(const std::string& path, bool* is_dir = nullptr) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  if (is_dir) *is_dir = S_ISDIR(st.st_mode);
  return true;
}

}  // namespace
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
namespace {

int32_t lookup(const pock_tokenizer& t, const std::string& s) {
  for (const Added& a : t.added)
    if (a.content == s) return a.id;
  auto it = t.bpe.ids.find(s);
  return it == t.bpe.ids.end() ? -1 : it->second;
}

void set_vocab(pock_tokenizer& t, int32_t id, const std::string& text, uint8_t kind) {
  if (id < 0 || id >= kMaxVocab) throw Error("token id " + std::to_string(id) + " is out of range");
  if (static_cast<size_t>(id) >= t.id_text.size()) {
    t.id_text.resize(static_cast<size_t>(id) + 1);
    t.id_kind.resize(static_cast<size_t>(id) + 1, 0);
  }
  t.id_text[id] = text;
  t.id_kind[id] = std::max(t.id_kind[id], kind);
}

void add_merge(Bpe& bpe, const std::string& a, const std::string& b, int32_t rank) {
  auto ia = bpe.ids.find(a), ib = bpe.ids.find(b), im = bpe.ids.find(a + b);
  if (ia == bpe.ids.end() || ib == bpe.ids.end() || im == bpe.ids.end())
    throw Error("merge " + std::to_string(rank) + " (\"" + a.substr(0, 50) + "\" \"" + b.substr(0, 50) +
                "\") names a token that is not in the vocabulary");
  bpe.merges.emplace((static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second),
                     std::make_pair(rank, im->second));
}

void finish(pock_tokenizer& t) {
  t.bpe.finish();
  t.added_by_byte.assign(256, {});
  for (size_t k = 0; k < t.added.size(); ++k) {
    const Added& a = t.added[k];
    if (a.content.empty()) continue;
    set_vocab(t, a.id, a.content, a.special ? 2 : 1);
    t.added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(k);
  }
  for (auto& bucket : t.added_by_byte)
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t x, size_t y) { return t.added[x].content.size() > t.added[y].content.size(); });
  for (size_t id = 0; id < t.id_text.size(); ++id)
    if (t.id_kind[id] == 0 && id < t.bpe.vocab.size() && !t.bpe.vocab[id].empty()) set_vocab(t, id, t.bpe.vocab[id], 1);
  for (int32_t id : {t.bos, t.eos, t.pad})
    if (id >= static_cast<int32_t>(t.id_text.size())) throw Error("special token id " + std::to_string(id) + " is not in the vocabulary");
}

// ---- tokenizer.json ---------------------------------------------------------------

std::string str_field(const Json& j, const char* key, const char* what) {
  const Json* v = j.get(key);
  if (!v) throw Error(std::string(what) + " has no \"" + key + "\"");
  return v->as_string(what);
}

bool bool_field(const Json& j, const char* key, bool dflt) {
  const Json* v = j.get(key);
  return v && v->kind == Json::Bool ? v->b : dflt;
}

std::string pattern_string(const Json& j, const char* what, bool* is_regex) {
  const Json* p = j.get("pattern");
  if (!p || p->kind != Json::Object) throw Error(std::string(what) + " has no pattern");
  if (const Json* s = p->get("String")) return *is_regex = false, s->as_string(what);
  if (const Json* r = p->get("Regex")) return *is_regex = true, r->as_string(what);
  throw Error(std::string(what) + " has an unknown pattern kind");
}

template <class F>
void each(const Json* j, F&& f) {  // a component or a Sequence of them
  if (!j || j->kind == Json::Null) return;
  if (j->kind != Json::Object) throw Error("a tokenizer component is not an object");
  const std::string type = str_field(*j, "type", "a tokenizer component");
  if (type == "Sequence") {
    const Json* items = j->get("normalizers");
    if (!items) items = j->get("pretokenizers");
    if (!items) items = j->get("decoders");
    if (!items) items = j->get("processors");
    if (!items || items->kind != Json::Array) throw Error("a Sequence has no list");
    for (const Json& it : items->items) each(&it, f);
    return;
  }
  f(*j, type);
}

int prepend_scheme(const Json& j) {
  if (const Json* s = j.get("prepend_scheme")) {
    const std::string& v = s->as_string("Metaspace prepend_scheme");
    return v == "always" ? 2 : v == "first" ? 1 : 0;
  }
  return bool_field(j, "add_prefix_space", true) ? 2 : 0;
}

void load_json(pock_tokenizer& t, const Json& root) {
  if (root.kind != Json::Object) throw Error("tokenizer.json is not a JSON object");
  const Json* model = root.get("model");
  if (!model || model->kind != Json::Object) throw Error("tokenizer.json has no \"model\"");
  const Json* type = model->get("type");
  if (type && type->as_string("model.type") != "BPE")
    throw Error("unsupported tokenizer model \"" + type->str + "\" (BPE is supported)");
  const Json* vocab = model->get("vocab");
  if (!vocab || vocab->kind != Json::Object) throw Error("tokenizer.json model has no vocab");
  Bpe& bpe = t.bpe;
  for (const auto& m : vocab->members) {
    const int64_t id = m.second.as_int("a vocab id");
    if (id < 0 || id >= kMaxVocab) throw Error("vocab id " + std::to_string(id) + " of \"" + m.first.substr(0, 50) + "\" is out of range");
    if (static_cast<size_t>(id) >= bpe.vocab.size()) bpe.vocab.resize(static_cast<size_t>(id) + 1);
    bpe.vocab[id] = m.first;
    bpe.ids[m.first] = static_cast<int32_t>(id);
    set_vocab(t, static_cast<int32_t>(id), m.first, 1);
  }
  if (const Json* merges = model->get("merges")) {
    if (merges->kind != Json::Array) throw Error("model.merges is not a list");
    int32_t rank = 0;
    for (const Json& m : merges->items) {
      if (m.kind == Json::String) {
        const size_t sp = m.str.find(' ', 1);
        if (sp == std::string::npos) throw Error("merge " + std::to_string(rank) + " is not \"a b\"");
        add_merge(bpe, m.str.substr(0, sp), m.str.substr(sp + 1), rank);
      } else if (m.kind == Json::Array && m.items.size() == 2) {
        add_merge(bpe, m.items[0].as_string("a merge"), m.items[1].as_string("a merge"), rank);
      } else {
        throw Error("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
      }
      ++rank;
    }
  }
  if (const Json* unk = model->get("unk_token"); unk && unk->kind == Json::String) {
    auto it = bpe.ids.find(unk->str);
    if (it != bpe.ids.end()) bpe.unk = it->second;
  }
  bpe.byte_fallback = bool_field(*model, "byte_fallback", false);
  bpe.fuse_unk = bool_field(*model, "fuse_unk", false);
  bpe.ignore_merges = bool_field(*model, "ignore_merges", false);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = model->get(key);
    if (v && v->kind == Json::String && !v->str.empty()) throw Error(std::string("BPE ") + key + " is not supported");
  }
  if (const Json* added = root.get("added_tokens")) {
    if (added->kind != Json::Array) throw Error("added_tokens is not a list");
    for (const Json& a : added->items) {
      const int64_t id = a.get("id") ? a.get("id")->as_int("added token id") : -1;
      if (id < 0 || id >= kMaxVocab) throw Error("an added token's id is out of range");
      t.added.push_back({str_field(a, "content", "an added token"), static_cast<int32_t>(id),
                         bool_field(a, "special", false), bool_field(a, "lstrip", false),
                         bool_field(a, "rstrip", false), bool_field(a, "single_word", false)});
    }
  }
  each(root.get("normalizer"), [&](const Json& j, const std::string& ty) {
    if (ty == "Prepend") {
      t.norm.push_back({Normalizer::Prepend, str_field(j, "prepend", "Prepend"), ""});
    } else if (ty == "Replace") {
      bool re = false;
      std::string from = pattern_string(j, "Replace", &re);
      if (re) throw Error("Replace normalizer with a regex pattern is not supported");
      t.norm.push_back({Normalizer::Replace, from, str_field(j, "content", "Replace")});
    } else if (ty == "Lowercase") {
      t.norm.push_back({Normalizer::Lowercase, "", ""});
    } else if (ty == "NFC") {
      t.norm.push_back({Normalizer::Identity, "", ""});  // text already in NFC is unchanged (see README)
    } else {
      throw Error("unsupported normalizer " + ty);
    }
  });
  each(root.get("pre_tokenizer"), [&](const Json& j, const std::string& ty) {
    PreTokenizer p{};
    if (ty == "ByteLevel") {
      p.kind = PreTokenizer::ByteLevel;
      p.add_prefix_space = bool_field(j, "add_prefix_space", false);
      p.use_regex = bool_field(j, "use_regex", true);
      t.byte_level = true;
    } else if (ty == "Split") {
      p.kind = PreTokenizer::Split;
      bool re = false;
      const std::string pat = pattern_string(j, "Split", &re);
      if (!re) throw Error("Split pre-tokenizer with a string pattern is not supported");
      p.pattern = pattern_from_regex(pat);
      const Json* beh = j.get("behavior");
      if ((beh && beh->as_string("Split behavior") != "Isolated") || bool_field(j, "invert", false))
        throw Error("Split pre-tokenizer: only behavior Isolated without invert is supported");
    } else if (ty == "Digits") {
      p.kind = PreTokenizer::Digits;
      p.individual = bool_field(j, "individual_digits", false);
    } else if (ty == "Metaspace") {
      p.kind = PreTokenizer::Metaspace;
      p.replacement = str_field(j, "replacement", "Metaspace");
      p.prepend = prepend_scheme(j);
      p.split = bool_field(j, "split", true);
    } else {
      throw Error("unsupported pre-tokenizer " + ty);
    }
    t.pre.push_back(p);
  });
  each(root.get("decoder"), [&](const Json& j, const std::string& ty) {
    Decoder d{};
    t.has_decoder = true;
    if (ty == "ByteLevel") {
      d.kind = Decoder::ByteLevel;
    } else if (ty == "Replace") {
      bool re = false;
      d.kind = Decoder::Replace;
      d.a = pattern_string(j, "Replace decoder", &re);
      if (re) throw Error("Replace decoder with a regex pattern is not supported");
      d.b = str_field(j, "content", "Replace decoder");
    } else if (ty == "ByteFallback") {
      d.kind = Decoder::ByteFallback;
    } else if (ty == "Fuse") {
      d.kind = Decoder::Fuse;
    } else if (ty == "Strip") {
      d.kind = Decoder::Strip;
      d.a = str_field(j, "content", "Strip decoder");
      d.start = static_cast<int>(j.get("start") ? j.get("start")->as_int("Strip start") : 0);
      d.stop = static_cast<int>(j.get("stop") ? j.get("stop")->as_int("Strip stop") : 0);
    } else if (ty == "Metaspace") {
      d.kind = Decoder::Metaspace;
      d.a = str_field(j, "replacement", "Metaspace decoder");
      d.prepend = prepend_scheme(j);
    } else {
      throw Error("unsupported decoder " + ty);
    }
    t.dec.push_back(d);
  });
  if (root.get("decoder") && root.get("decoder")->kind != Json::Null) t.has_decoder = true;
  each(root.get("post_processor"), [&](const Json& j, const std::string& ty) {
    if (ty == "ByteLevel") return;
    if (ty == "TemplateProcessing") {
      const Json* single = j.get("single");
      const Json* specials = j.get("special_tokens");
      if (!single || single->kind != Json::Array) throw Error("TemplateProcessing has no single template");
      bool after = false;
      for (const Json& piece : single->items) {
        if (piece.get("Sequence")) {
          after = true;
        } else if (const Json* sp = piece.get("SpecialToken")) {
          const std::string name = str_field(*sp, "id", "TemplateProcessing");
          const Json* tok = specials ? specials->get(name.c_str()) : nullptr;
          const Json* ids = tok ? tok->get("ids") : nullptr;
          if (!ids || ids->kind != Json::Array) throw Error("TemplateProcessing: no ids for " + name);
          for (const Json& id : ids->items)
            (after ? t.suffix : t.prefix).push_back(static_cast<int32_t>(id.as_int("a template id")));
        }
      }
    } else if (ty == "BertProcessing" || ty == "RobertaProcessing") {
      const Json* cls = j.get("cls");
      const Json* sep = j.get("sep");
      if (!cls || !sep || cls->kind != Json::Array || sep->kind != Json::Array || cls->items.size() != 2 ||
          sep->items.size() != 2)
        throw Error(ty + ": no cls/sep");
      t.prefix.push_back(static_cast<int32_t>(cls->items[1].as_int("cls id")));
      t.suffix.push_back(static_cast<int32_t>(sep->items[1].as_int("sep id")));
    } else {
      throw Error("unsupported post-processor " + ty);
    }
  });
}

// tokenizer_config.json beside tokenizer.json: the special tokens and the chat template.
void load_config(pock_tokenizer& t, const Json& cfg) {
  auto token = [&](const char* key) -> int32_t {
    const Json* v = cfg.get(key);
    if (v && v->kind == Json::Object) v = v->get("content");
    if (!v || v->kind != Json::String) return -1;
    return lookup(t, v->str);
  };
  t.bos = token("bos_token");
  t.eos = token("eos_token");
  t.pad = token("pad_token");
  if (const Json* ct = cfg.get("chat_template")) {
    if (ct->kind == Json::String) {
      t.chat_template = ct->str;
    } else if (ct->kind == Json::Array) {
      for (const Json& named : ct->items)
        if (const Json* n = named.get("name"); n && n->kind == Json::String && n->str == "default")
          if (const Json* tpl = named.get("template"); tpl && tpl->kind == Json::String) t.chat_template = tpl->str;
    }
  }
}

void guess_specials(pock_tokenizer& t) {  // no tokenizer_config.json: the families' usual names
  auto first = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (int32_t id = lookup(t, n); id >= 0) return id;
    return -1;
  };
  t.bos = first({"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>"});
  t.eos = first({"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "<|im_end|>"});
  t.pad = first({"<pad>", "<|pad|>", "<|finetune_right_pad_id|>"});
}

// ---- GGUF -------------------------------------------------------------------------

void load_gguf(pock_tokenizer& t, const uint8_t* data, size_t size) {
  GgufVocab v = read_gguf_vocab(data, size);
  if (v.tokens.size() > static_cast<size_t>(kMaxVocab)) throw Error("GGUF vocabulary too large");
  Bpe& bpe = t.bpe;
  bpe.vocab = v.tokens;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    bpe.ids.emplace(v.tokens[id], static_cast<int32_t>(id));
    set_vocab(t, static_cast<int32_t>(id), v.tokens[id], 1);
    const int32_t type = v.token_type.empty() ? 1 : v.token_type[id];
    if (type == 3 || type == 4)  // control and user-defined tokens are split out of the text first
      t.added.push_back({v.tokens[id], static_cast<int32_t>(id), type == 3, false, false, false});
  }
  auto id_or_none = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(v.tokens.size()) ? static_cast<int32_t>(id) : -1; };
  t.bos = id_or_none(v.bos);
  t.eos = id_or_none(v.eos);
  t.pad = id_or_none(v.pad);
  bpe.unk = id_or_none(v.unk);
  t.chat_template = v.chat_template;
  t.has_decoder = true;
  if (v.model == "gpt2") {
    int32_t rank = 0;
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) throw Error("GGUF merge " + std::to_string(rank) + " is not \"a b\"");
      add_merge(bpe, m.substr(0, sp), m.substr(sp + 1), rank++);
    }
    PreTokenizer p{};
    p.kind = PreTokenizer::Split;
    p.pattern = v.pre == "llama-bpe" || v.pre == "llama3" ? Pattern::Llama3
                : v.pre == "qwen2"                        ? Pattern::Qwen2
                                                          : Pattern::Gpt2;
    bpe.ignore_merges = p.pattern == Pattern::Llama3;
    t.pre.push_back(p);
    PreTokenizer bl{};
    bl.kind = PreTokenizer::ByteLevel;
    bl.use_regex = false;
    t.pre.push_back(bl);
    t.byte_level = true;
    t.dec.push_back({Decoder::ByteLevel, "", "", 0, 0, 0});
    if (v.add_bos == 1 && t.bos >= 0) t.prefix.push_back(t.bos);
  } else if (v.model == "llama") {
    if (v.scores.empty()) throw Error("GGUF llama tokenizer has no tokenizer.ggml.scores");
    bpe.scores = v.scores;
    bpe.byte_fallback = true;
    if (v.add_space_prefix != 0) t.norm.push_back({Normalizer::Prepend, kMeta, ""});
    t.norm.push_back({Normalizer::Replace, " ", kMeta});
    t.dec.push_back({Decoder::Replace, kMeta, " ", 0, 0, 0});
    t.dec.push_back({Decoder::ByteFallback, "", "", 0, 0, 0});
    t.dec.push_back({Decoder::Fuse, "", "", 0, 0, 0});
    if (v.add_space_prefix != 0) t.dec.push_back({Decoder::Strip, " ", "", 1, 0, 0});
    if (v.add_bos != 0 && t.bos >= 0) t.prefix.push_back(t.bos);
  } else {
    throw Error("unsupported GGUF tokenizer model \"" + v.model.substr(0, 50) + "\" (gpt2 and llama are supported)");
  }
  if (v.add_eos == 1 && t.eos >= 0) t.suffix.push_back(t.eos);
}

// ---- encode -----------------------------------------------------------------------

struct Segment {
  size_t start, end;
  int32_t added;  // -1: text to tokenize
};

bool word_char(const std::string& s, size_t i, bool before) {
  // the code point ending at i (before) or starting at i is a letter, number or '_'
  if (before) {
    if (i == 0) return false;
    size_t k = i - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    int len;
    const uint32_t cp = utf8_at(s, k, &len);
    return cp == '_' || cp_class(cp) != kOther;
  }
  if (i >= s.size()) return false;
  int len;
  const uint32_t cp = utf8_at(s, i, &len);
  return cp == '_' || cp_class(cp) != kOther;
}

void split_added(const pock_tokenizer& t, const std::string& s, std::vector<Segment>& out) {
  size_t text_start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& bucket = t.added_by_byte[static_cast<unsigned char>(s[i])];
    for (size_t k : bucket) {
      const Added& a = t.added[k];
      if (s.compare(i, a.content.size(), a.content) != 0) continue;
      size_t b = i, e = i + a.content.size();
      if (a.single_word && (word_char(s, b, true) || word_char(s, e, false))) continue;
      if (a.lstrip)
        while (b > text_start && cp_space(static_cast<unsigned char>(s[b - 1]))) --b;
      if (a.rstrip)
        while (e < s.size() && cp_space(static_cast<unsigned char>(s[e]))) ++e;
      if (b > text_start) out.push_back({text_start, b, -1});
      out.push_back({b, e, a.id});
      text_start = e;
      i = e - 1;
      break;
    }
  }
  if (text_start < s.size()) out.push_back({text_start, s.size(), -1});
}

void normalize(const pock_tokenizer& t, std::string& s) {
  for (const Normalizer& n : t.norm) {
    switch (n.kind) {
      case Normalizer::Prepend:
        if (!s.empty()) s.insert(0, n.a);
        break;
      case Normalizer::Replace: replace_all(s, n.a, n.b); break;
      case Normalizer::Lowercase:
        for (char& c : s)
          if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
        break;
      case Normalizer::Identity: break;
    }
  }
}

void pre_tokenize(const pock_tokenizer& t, std::string text, bool at_start, std::vector<std::string>& pieces) {
  pieces.clear();
  pieces.push_back(std::move(text));
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> spans;
  for (const PreTokenizer& p : t.pre) {
    next.clear();
    for (size_t pi = 0; pi < pieces.size(); ++pi) {
      std::string& s = pieces[pi];
      spans.clear();
      switch (p.kind) {
        case PreTokenizer::ByteLevel:
          if (p.add_prefix_space && !s.empty() && s[0] != ' ') s.insert(0, " ");
          if (p.use_regex) split_pattern(Pattern::Gpt2, s, spans);
          else spans.emplace_back(0, s.size());
          break;
        case PreTokenizer::Split: split_pattern(p.pattern, s, spans); break;
        case PreTokenizer::Digits: {
          size_t i = 0, run = 0;
          bool in_digits = false;
          while (i < s.size()) {
            int len;
            const bool digit = cp_class(utf8_at(s, i, &len)) == kNumber;
            if (digit && p.individual) {
              if (i > run) spans.emplace_back(run, i);
              spans.emplace_back(i, i + len);
              run = i + len;
            } else if (digit != in_digits && i > run) {
              spans.emplace_back(run, i);
              run = i;
            }
            in_digits = digit;
            i += static_cast<size_t>(len);
          }
          if (s.size() > run) spans.emplace_back(run, s.size());
          break;
        }
        case PreTokenizer::Metaspace: {
          replace_all(s, " ", p.replacement);
          if ((p.prepend == 2 || (p.prepend == 1 && at_start && pi == 0)) && !starts_with(s, p.replacement))
            s.insert(0, p.replacement);
          if (!p.split) {
            spans.emplace_back(0, s.size());
            break;
          }
          size_t run = 0;
          for (size_t j; (j = s.find(p.replacement, run == 0 ? 1 : run + 1)) != std::string::npos && !p.replacement.empty();) {
            if (j > run) spans.emplace_back(run, j);
            run = j;
          }
          if (s.size() > run) spans.emplace_back(run, s.size());
          break;
        }
      }
      for (const auto& sp : spans)
        if (sp.second > sp.first) next.emplace_back(s, sp.first, sp.second - sp.first);
    }
    pieces.swap(next);
  }
}

void encode(pock_tokenizer& t, const char* bytes, size_t n, bool add_special, std::vector<int32_t>& out) {
  if (n > kMaxText) throw Error("text of " + std::to_string(n) + " bytes is over the 1 GiB limit");
  const std::string s = utf8_lossy(bytes, n);
  out.clear();
  if (add_special) out.insert(out.end(), t.prefix.begin(), t.prefix.end());
  std::vector<Segment> segs;
  split_added(t, s, segs);
  std::vector<std::string> pieces;
  for (const Segment& seg : segs) {
    if (seg.added >= 0) {
      out.push_back(seg.added);
      continue;
    }
    std::string text = s.substr(seg.start, seg.end - seg.start);
    normalize(t, text);
    pre_tokenize(t, std::move(text), seg.start == 0, pieces);
    for (const std::string& piece : pieces) {
      if (piece.size() <= kCacheMaxPiece) {
        auto it = t.cache.find(piece);
        if (it != t.cache.end()) {
          out.insert(out.end(), it->second.begin(), it->second.end());
          continue;
        }
      }
      const size_t first = out.size();
      t.bpe.encode(piece, t.byte_level, out);
      if (piece.size() <= kCacheMaxPiece) {
        if (t.cache.size() >= kCacheMaxEntries) t.cache.clear();
        t.cache.emplace(piece, std::vector<int32_t>(out.begin() + first, out.end()));
      }
    }
  }
  if (add_special) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
}

// ---- decode -----------------------------------------------------------------------

bool byte_token(const std::string& s, unsigned* b) {  // "<0xXX>"
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return false;
  unsigned v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = s[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return false;
  }
  *b = v;
  return true;
}

bool valid_utf8(const std::string& s) { return utf8_lossy(s.data(), s.size()) == s; }

void decode(pock_tokenizer& t, const int32_t* ids, size_t n, bool skip_special, std::string& out) {
  std::vector<std::string> toks;
  toks.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= t.id_text.size() || t.id_kind[id] == 0)
      throw Error("token id " + std::to_string(id) + " at position " + std::to_string(i) +
                  " is outside the vocabulary (size " + std::to_string(t.id_text.size()) + ")");
    if (skip_special && t.id_kind[id] == 2) continue;
    toks.push_back(t.id_text[id]);
  }
  for (const Decoder& d : t.dec) {
    switch (d.kind) {
      case Decoder::ByteLevel: {
        std::string bytes;
        for (const std::string& tok : toks) {
          std::string mapped;
          bool all = true;
          for (size_t i = 0; i < tok.size() && all;) {
            int len;
            const int b = cp_to_byte(utf8_at(tok, i, &len));
            if (b < 0) all = false;
            else mapped += static_cast<char>(b);
            i += static_cast<size_t>(len);
          }
          bytes += all ? mapped : tok;
        }
        toks.assign(1, utf8_lossy(bytes.data(), bytes.size()));
        break;
      }
      case Decoder::Replace:
        for (std::string& tok : toks) replace_all(tok, d.a, d.b);
        break;
      case Decoder::ByteFallback: {
        std::vector<std::string> res;
        std::string pending;
        size_t n_pending = 0;
        auto flush = [&] {
          if (n_pending == 0) return;
          if (valid_utf8(pending)) res.push_back(pending);
          else
            for (size_t k = 0; k < n_pending; ++k) res.emplace_back("\xEF\xBF\xBD");
          pending.clear();
          n_pending = 0;
        };
        for (std::string& tok : toks) {
          unsigned b;
          if (byte_token(tok, &b)) {
            pending += static_cast<char>(b);
            ++n_pending;
          } else {
            flush();
            res.push_back(std::move(tok));
          }
        }
        flush();
        toks.swap(res);
        break;
      }
      case Decoder::Fuse: {
        std::string all;
        for (const std::string& tok : toks) all += tok;
        toks.assign(1, all);
        break;
      }
      case Decoder::Strip:
        for (std::string& tok : toks) {
          int k = 0;
          while (k < d.start && starts_with(tok, d.a) && !d.a.empty()) tok.erase(0, d.a.size()), ++k;
          k = 0;
          while (k < d.stop && !d.a.empty() && tok.size() >= d.a.size() &&
                 tok.compare(tok.size() - d.a.size(), d.a.size(), d.a) == 0)
            tok.resize(tok.size() - d.a.size()), ++k;
        }
        break;
      case Decoder::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          replace_all(toks[i], d.a, " ");
          if (i == 0 && d.prepend != 0 && starts_with(toks[i], " ")) toks[i].erase(0, 1);
        }
        break;
    }
  }
  out.clear();
  for (size_t i = 0; i < toks.size(); ++i) {
    if (!t.has_decoder && i > 0) out += ' ';
    out += toks[i];
  }
  out = utf8_lossy(out.data(), out.size());
}

// ---- opening ----------------------------------------------------------------------

void open_bytes(pock_tokenizer& t, const uint8_t* data, size_t size, const std::string& name) {
  if (is_gguf(data, size)) {
    load_gguf(t, data, size);
  } else {
    try {
      load_json(t, parse_json(reinterpret_cast<const char*>(data), size));
    } catch (const Error& e) {
      throw Error(name + ": " + e.what());
    }
    guess_specials(t);
  }
}

void open_path(pock_tokenizer& t, const std::string& path) {
  bool dir = false;
  if (!exists(path, &dir)) throw Error(path + " does not exist");
  std::string file = path;
  if (dir) {
    file = path + "/tokenizer.json";
    if (!exists(file)) throw Error(path + " holds no tokenizer.json");
  }
  std::string data;
  {  // map the file (a GGUF model is mostly tensors the tokenizer never reads)
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) throw Error("cannot open " + file);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0) {
      ::close(fd);
      throw Error("cannot read " + file);
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* map = size ? mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    if (size && map == MAP_FAILED) throw Error("cannot read " + file);
    const auto* bytes = static_cast<const uint8_t*>(map);
    try {
      open_bytes(t, bytes ? bytes : reinterpret_cast<const uint8_t*>(""), size, file);
    } catch (...) {
      if (map) munmap(map, size);
      throw;
    }
    if (size >= 4) data.assign(reinterpret_cast<const char*>(bytes), 4);  // the magic, for below
    if (map) munmap(map, size);
  }
  const size_t slash = file.find_last_of('/');
  const std::string cfg = (dir ? path : slash == std::string::npos ? std::string(".") : file.substr(0, slash)) +
                          "/tokenizer_config.json";
  if (!is_gguf(reinterpret_cast<const uint8_t*>(data.data()), data.size()) && exists(cfg)) {
    const std::string text = read_file(cfg);
    try {
      load_config(t, parse_json(text.data(), text.size()));
    } catch (const Error& e) {
      throw Error(cfg + ": " + e.what());
    }
  }
  const std::string jinja = cfg.substr(0, cfg.size() - std::strlen("tokenizer_config.json")) + "chat_template.jinja";
  if (!is_gguf(reinterpret_cast<const uint8_t*>(data.data()), data.size()) && t.chat_template.empty() &&
      exists(jinja))
    t.chat_template = read_file(jinja);  // transformers >= 4.47 saves the template beside the config
}

template <class F>
pock_status guarded(F&& body) {
  try {
    return body();
  } catch (const Error& e) {
    return pock_rt::fail(POCK_ERR_VALUE, "%s", e.what());
  } catch (const std::bad_alloc&) {
    return pock_rt::fail(POCK_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return pock_rt::fail(POCK_ERR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return pock_rt::fail(POCK_ERR_INTERNAL, "internal error: unknown exception");
  }
}

pock_status opened(pock_tokenizer* t, pock_tokenizer** out) {
  finish(*t);
  *out = t;
  return POCK_OK;
}

}  // namespace
}  // namespace pock_tok

extern "C" {

POCK_API pock_status pock_tokenizer_open(const char* path, pock_tokenizer** out) {
  if (!out) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_open: out is NULL");
  *out = nullptr;
  if (!path) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_open: path is NULL");
  return pock_tok::guarded([&] {
    std::unique_ptr<pock_tokenizer> t(new pock_tokenizer());
    try {
      pock_tok::open_path(*t, path);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.rfind("cannot", 0) == 0 || msg.find("does not exist") != std::string::npos ||
          msg.find("holds no") != std::string::npos)
        return pock_rt::fail(POCK_ERR_IO, "%s", e.what());
      throw;
    }
    return pock_tok::opened(t.release(), out);
  });
}

POCK_API pock_status pock_tokenizer_open_memory(const void* data, int64_t nbytes, pock_tokenizer** out) {
  if (!out) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_open_memory: out is NULL");
  *out = nullptr;
  if ((!data && nbytes != 0) || nbytes < 0)
    return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_open_memory: no data");
  return pock_tok::guarded([&] {
    std::unique_ptr<pock_tokenizer> t(new pock_tokenizer());
    pock_tok::open_bytes(*t, static_cast<const uint8_t*>(data), static_cast<size_t>(nbytes), "tokenizer bytes");
    return pock_tok::opened(t.release(), out);
  });
}

POCK_API void pock_tokenizer_close(pock_tokenizer* t) { delete t; }

POCK_API pock_status pock_tokenizer_encode(pock_tokenizer* t, const char* text, int64_t nbytes,
                                           int32_t add_special_tokens, const int32_t** ids, int64_t* n_ids) {
  if (!t || !ids || !n_ids || (!text && nbytes != 0) || nbytes < 0)
    return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_encode: a NULL argument or a negative length");
  *ids = nullptr;
  *n_ids = 0;
  return pock_tok::guarded([&] {
    pock_tok::encode(*t, text ? text : "", static_cast<size_t>(nbytes), add_special_tokens != 0, t->ids_out);
    *ids = t->ids_out.data();
    *n_ids = static_cast<int64_t>(t->ids_out.size());
    return POCK_OK;
  });
}

POCK_API pock_status pock_tokenizer_decode(pock_tokenizer* t, const int32_t* ids, int64_t n_ids,
                                           int32_t skip_special_tokens, const char** text, int64_t* nbytes) {
  if (!t || !text || !nbytes || (!ids && n_ids != 0) || n_ids < 0)
    return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_decode: a NULL argument or a negative count");
  *text = nullptr;
  *nbytes = 0;
  return pock_tok::guarded([&] {
    pock_tok::decode(*t, ids, static_cast<size_t>(n_ids), skip_special_tokens != 0, t->text_out);
    *text = t->text_out.c_str();
    *nbytes = static_cast<int64_t>(t->text_out.size());
    return POCK_OK;
  });
}

POCK_API pock_status pock_tokenizer_vocab_size(pock_tokenizer* t, int32_t* size) {
  if (!t || !size) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_vocab_size: a NULL argument");
  *size = static_cast<int32_t>(t->id_text.size());
  return POCK_OK;
}

POCK_API pock_status pock_tokenizer_special_ids(pock_tokenizer* t, int32_t* bos, int32_t* eos, int32_t* pad) {
  if (!t) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_special_ids: tokenizer is NULL");
  if (bos) *bos = t->bos;
  if (eos) *eos = t->eos;
  if (pad) *pad = t->pad;
  return POCK_OK;
}

POCK_API pock_status pock_tokenizer_token_to_id(pock_tokenizer* t, const char* token, int64_t nbytes, int32_t* id) {
  if (!t || !id || (!token && nbytes != 0) || nbytes < 0)
    return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_token_to_id: a NULL argument");
  return pock_tok::guarded([&] {
    *id = pock_tok::lookup(*t, std::string(token ? token : "", static_cast<size_t>(nbytes)));
    return POCK_OK;
  });
}

POCK_API pock_status pock_tokenizer_id_to_token(pock_tokenizer* t, int32_t id, const char** token, int64_t* nbytes) {
  if (!t || !token || !nbytes) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_id_to_token: a NULL argument");
  if (id < 0 || static_cast<size_t>(id) >= t->id_text.size() || t->id_kind[id] == 0)
    return pock_rt::fail(POCK_ERR_VALUE, "token id %d is outside the vocabulary (size %zu)", id, t->id_text.size());
  *token = t->id_text[id].c_str();
  *nbytes = static_cast<int64_t>(t->id_text[id].size());
  return POCK_OK;
}

POCK_API pock_status pock_tokenizer_is_special(pock_tokenizer* t, int32_t id, int32_t* special) {
  if (!t || !special) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_is_special: a NULL argument");
  if (id < 0 || static_cast<size_t>(id) >= t->id_text.size() || t->id_kind[id] == 0)
    return pock_rt::fail(POCK_ERR_VALUE, "token id %d is outside the vocabulary (size %zu)", id, t->id_text.size());
  *special = t->id_kind[id] == 2;
  return POCK_OK;
}

POCK_API pock_status pock_tokenizer_chat_template(pock_tokenizer* t, const char** text, int64_t* nbytes) {
  if (!t || !text || !nbytes) return pock_rt::fail(POCK_ERR_INVALID_ARGUMENT, "pock_tokenizer_chat_template: a NULL argument");
  *text = t->chat_template.c_str();
  *nbytes = static_cast<int64_t>(t->chat_template.size());
  return POCK_OK;
}

}  // extern "C"
