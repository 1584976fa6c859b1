// load.cpp — a pock_tokenizer from tokenizer.json (+ tokenizer_config.json) or from a
// GGUF file's tokenizer.ggml.* metadata: the vocabulary, merges, added tokens and the
// normalizer / pre-tokenizer / decoder / post-processor pipeline Hugging Face builds.
// What is not supported is refused with an Error naming it.
#include "tok_internal.h"

namespace pock_tok {

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

namespace {

void add_merge(Bpe& bpe, const std::string& a, const std::string& b, int32_t rank) {
  auto ia = bpe.ids.find(a), ib = bpe.ids.find(b), im = bpe.ids.find(a + b);
  if (ia == bpe.ids.end() || ib == bpe.ids.end() || im == bpe.ids.end())
    throw Error("merge " + std::to_string(rank) + " (\"" + a.substr(0, 50) + "\" \"" + b.substr(0, 50) +
                "\") names a token that is not in the vocabulary");
  bpe.merges.emplace((static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second),
                     std::make_pair(rank, im->second));
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

}  // namespace

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
      t.norm.push_back({Normalizer::Nfc, "", ""});
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

}  // namespace pock_tok
