// unicode.cpp — UTF-8, code point classes and the pre-tokenizers' split patterns.
//
// The byte-level BPE families split text with a regular expression before BPE; the
// three in use are matched here by hand (no regex engine), alternative by alternative
// in the pattern's order, with the backtracking each alternative would do:
//   GPT-2 / SmolLM2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:    the same with \p{N} (one digit at a time)
#include <algorithm>

#include "tok_internal.h"
#include "unicode_table.h"

namespace pock_tok {

std::string utf8_lossy(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      size_t j = i + 1;  // copy an ASCII run at once
      while (j < n && p[j] < 0x80) ++j;
      out.append(s + i, j - i);
      i = j;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const unsigned char c = p[j];
      const bool ok = got == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++j;
      ++got;
    }
    if (need > 0 && got == need) out.append(s + i, j - i);
    else out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart [i, j)
    i = j;
  }
  return out;
}

uint32_t utf8_at(const std::string& s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b = p[i];
  if (b < 0x80) return *len = 1, b;
  if (b < 0xE0) return *len = 2, ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
  if (b < 0xF0) return *len = 3, ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
  *len = 4;
  return ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

CpClass cp_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return kLetter;
    return cp >= '0' && cp <= '9' ? kNumber : kOther;
  }
  const UnicodeRun* end = kUnicodeTable + kUnicodeRuns;
  const UnicodeRun* r = std::upper_bound(kUnicodeTable, end, cp,
                                         [](uint32_t c, const UnicodeRun& run) { return c < run.start; });
  return static_cast<CpClass>((r - 1)->cls);
}

bool cp_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

Pattern pattern_from_regex(const std::string& re) {
  static const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const char* kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (re == kGpt2) return Pattern::Gpt2;
  if (re == kLlama3) return Pattern::Llama3;
  if (re == kQwen2) return Pattern::Qwen2;
  throw Error("unsupported pre-tokenizer split pattern " + re.substr(0, 200) +
              " (supported: the GPT-2, Llama-3 and Qwen2 patterns)");
}

namespace {

struct Cps {  // the text as code points, with each one's byte offset (off[n] = the text's size)
  std::vector<uint32_t> cp;
  std::vector<size_t> off;
  CpClass cls(size_t i) const { return cp_class(cp[i]); }
  bool letter(size_t i) const { return i < cp.size() && cls(i) == kLetter; }
  bool number(size_t i) const { return i < cp.size() && cls(i) == kNumber; }
  bool space(size_t i) const { return i < cp.size() && cp_space(cp[i]); }
  bool other(size_t i) const { return i < cp.size() && !cp_space(cp[i]) && cls(i) == kOther; }  // [^\s\p{L}\p{N}]
  bool crlf(size_t i) const { return i < cp.size() && (cp[i] == '\r' || cp[i] == '\n'); }
};

uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d at i: the match's length or 0.
size_t contraction(const Cps& t, size_t i, bool any_case) {
  const size_t n = t.cp.size();
  if (t.cp[i] != '\'' || i + 1 >= n) return 0;
  auto at = [&](size_t k) { return any_case ? lower_ascii(t.cp[k]) : t.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const uint32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S) then \s+ at i (t.space(i) holds): the end of the match.
size_t spaces(const Cps& t, size_t i) {
  size_t j = i;
  while (t.space(j)) ++j;
  if (j == t.cp.size() || j - i < 2) return j;  // at the end, or one space: \s+ alone
  return j - 1;                                 // leave the last space to the next word
}

size_t match_gpt2(const Cps& t, size_t i) {
  if (size_t k = contraction(t, i, false)) return i + k;
  const size_t s = t.cp[i] == ' ' ? i + 1 : i;  // the optional leading space
  size_t j = s;
  if (t.letter(s)) {
    while (t.letter(j)) ++j;
    return j;
  }
  if (t.number(s)) {
    while (t.number(j)) ++j;
    return j;
  }
  if (t.other(s)) {
    while (t.other(j)) ++j;
    return j;
  }
  if (t.space(i)) return spaces(t, i);
  return i + 1;
}

size_t match_llama3(const Cps& t, size_t i, size_t max_digits) {
  if (size_t k = contraction(t, i, true)) return i + k;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t s = i;
  if (!t.crlf(i) && !t.letter(i) && !t.number(i) && t.letter(i + 1)) s = i + 1;
  if (t.letter(s)) {
    while (t.letter(s)) ++s;
    return s;
  }
  // \p{N}{1,max_digits}
  if (t.number(i)) {
    size_t j = i;
    while (j - i < max_digits && t.number(j)) ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  s = t.cp[i] == ' ' ? i + 1 : i;
  if (t.other(s)) {
    while (t.other(s)) ++s;
    while (t.crlf(s)) ++s;
    return s;
  }
  if (t.space(i)) {
    // \s*[\r\n]+: up to the last CR/LF of the whitespace run
    size_t j = i, last = 0;
    bool any = false;
    while (t.space(j)) {
      if (t.crlf(j)) last = j, any = true;
      ++j;
    }
    if (any) return last + 1;
    return spaces(t, i);
  }
  return i + 1;
}

}  // namespace

void split_pattern(Pattern p, const std::string& text, std::vector<std::pair<size_t, size_t>>& out) {
  Cps t;
  t.cp.reserve(text.size());
  t.off.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    t.off.push_back(i);
    t.cp.push_back(utf8_at(text, i, &len));
    i += static_cast<size_t>(len);
  }
  t.off.push_back(text.size());
  const size_t n = t.cp.size();
  for (size_t i = 0; i < n;) {
    size_t j = p == Pattern::Gpt2 ? match_gpt2(t, i) : match_llama3(t, i, p == Pattern::Llama3 ? 3 : 1);
    if (j <= i) j = i + 1;
    out.emplace_back(t.off[i], t.off[j]);
    i = j;
  }
}

}  // namespace pock_tok
