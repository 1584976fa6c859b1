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

constexpr size_t kMaxFileBytes = size_t{1} << 31;  // tokenizer.json / GGUF read into memory
constexpr size_t kMaxText = size_t{1} << 30;
constexpr size_t kCacheMaxPiece = 64, kCacheMaxEntries = 1 << 16;

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
namespace pock_tok {
namespace {

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
      case Normalizer::Nfc: nfc(s); break;
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
