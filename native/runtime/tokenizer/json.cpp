// json.cpp — a small JSON reader for tokenizer.json / tokenizer_config.json.
// Untrusted input: nesting is limited to kMaxDepth, every read is bounds-checked,
// and any error throws pock_tok::Error naming the byte offset.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "tok_internal.h"

namespace pock_tok {
namespace {

constexpr int kMaxDepth = 64;

struct Parser {
  const char* p;
  size_t n, i = 0;

  [[noreturn]] void bad(const char* what) const {
    throw Error(std::string("invalid JSON at byte ") + std::to_string(i) + ": " + what);
  }
  void ws() {
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) ++i;
  }
  bool lit(const char* s) {
    const size_t k = std::strlen(s);
    if (n - i >= k && std::memcmp(p + i, s, k) == 0) {
      i += k;
      return true;
    }
    return false;
  }
  uint32_t hex4() {
    if (n - i < 4) bad("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = p[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else bad("bad hex digit in \\u escape");
    }
    return v;
  }
  std::string string() {
    ++i;  // the opening quote
    std::string out;
    size_t run = i;
    for (;;) {
      if (i >= n) bad("unterminated string");
      const unsigned char c = static_cast<unsigned char>(p[i]);
      if (c == '"') {
        out.append(p + run, i - run);
        ++i;
        break;
      }
      if (c < 0x20) bad("control character in string");
      if (c != '\\') {
        ++i;
        continue;
      }
      out.append(p + run, i - run);
      if (++i >= n) bad("unterminated escape");
      const char e = p[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && n - i >= 6 && p[i] == '\\' && p[i + 1] == 'u') {
            const size_t save = i;
            i += 2;
            const uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else i = save;
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate
          utf8_append(out, cp);
          break;
        }
        default: bad("unknown escape");
      }
      run = i;
    }
    return utf8_lossy(out.data(), out.size());
  }
  void number(Json& v) {
    const size_t s = i;
    if (i < n && p[i] == '-') ++i;
    while (i < n && ((p[i] >= '0' && p[i] <= '9') || p[i] == '.' || p[i] == 'e' || p[i] == 'E' || p[i] == '+' ||
                     p[i] == '-'))
      ++i;
    if (i == s || i - s > 64) bad("bad number");
    v.kind = Json::Number;
    v.str.assign(p + s, i - s);
    char* end = nullptr;
    v.num = std::strtod(v.str.c_str(), &end);
    if (end != v.str.c_str() + v.str.size()) bad("bad number");
  }
  void value(Json& v, int depth) {
    if (depth > kMaxDepth) bad("nested too deeply");
    ws();
    if (i >= n) bad("unexpected end");
    const char c = p[i];
    if (c == '{') {
      v.kind = Json::Object;
      ++i;
      ws();
      if (i < n && p[i] == '}') {
        ++i;
        return;
      }
      for (;;) {
        ws();
        if (i >= n || p[i] != '"') bad("expected a member name");
        v.members.emplace_back(string(), Json());
        ws();
        if (i >= n || p[i] != ':') bad("expected ':'");
        ++i;
        value(v.members.back().second, depth + 1);
        ws();
        if (i < n && p[i] == ',') {
          ++i;
          continue;
        }
        if (i < n && p[i] == '}') {
          ++i;
          return;
        }
        bad("expected ',' or '}'");
      }
    } else if (c == '[') {
      v.kind = Json::Array;
      ++i;
      ws();
      if (i < n && p[i] == ']') {
        ++i;
        return;
      }
      for (;;) {
        v.items.emplace_back();
        value(v.items.back(), depth + 1);
        ws();
        if (i < n && p[i] == ',') {
          ++i;
          continue;
        }
        if (i < n && p[i] == ']') {
          ++i;
          return;
        }
        bad("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind = Json::String;
      v.str = string();
    } else if (lit("true")) {
      v.kind = Json::Bool;
      v.b = true;
    } else if (lit("false")) {
      v.kind = Json::Bool;
    } else if (lit("null")) {
      v.kind = Json::Null;
    } else {
      number(v);
    }
  }
};

}  // namespace

const Json* Json::get(const char* key) const {
  if (kind != Object) return nullptr;
  for (const auto& m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

const std::string& Json::as_string(const char* what) const {
  if (kind != String) throw Error(std::string(what) + " is not a string");
  return str;
}

int64_t Json::as_int(const char* what) const {
  if (kind != Number || !(num >= -2147483648.0 && num <= 2147483647.0) || num != std::floor(num))
    throw Error(std::string(what) + " is not an integer in int32 range");
  return static_cast<int64_t>(num);
}

bool Json::as_bool(const char* what) const {
  if (kind != Bool) throw Error(std::string(what) + " is not true/false");
  return b;
}

Json parse_json(const char* data, size_t size) {
  Parser ps{data, size};
  Json v;
  ps.value(v, 0);
  ps.ws();
  if (ps.i != size) ps.bad("trailing characters");
  return v;
}

}  // namespace pock_tok
