// bpe.cpp — the BPE model: a pre-tokenized piece -> token ids.
//
// Merges by rank (Hugging Face BPE, GGUF "gpt2"): start from one symbol per character
// (per byte for byte-level BPE), then repeatedly merge the adjacent pair of lowest merge
// rank, leftmost first, until no pair has a merge: a heap of candidate pairs over a
// linked list of symbols, O(n log n) for a piece of n symbols.
// Merges by score (SentencePiece BPE, GGUF "llama"): the same loop, merging the adjacent
// pair whose concatenation is a token of highest score.
// Byte fallback: a character with no token becomes its UTF-8 bytes' <0xXX> tokens.
#include <cstdio>
#include <queue>

#include "tok_internal.h"

namespace pock_tok {

uint32_t byte_to_cp(uint8_t b) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[c] = printable ? static_cast<uint32_t>(c) : next++;
    }
    return t;
  }();
  return table[b];
}

int cp_to_byte(uint32_t cp) {
  static const auto table = [] {
    std::vector<int16_t> t(512, -1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < 512 ? table[cp] : -1;
}

void Bpe::finish() {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = ids.find(name);
    byte_ids[b] = it == ids.end() ? -1 : it->second;
    std::string ch;
    utf8_append(ch, byte_to_cp(static_cast<uint8_t>(b)));
    it = ids.find(ch);
    byte_level_ids[b] = it == ids.end() ? -1 : it->second;
  }
}

namespace {

struct Symbol {
  int32_t id;         // -1: no token (a character merged by score, looked up at the end)
  int32_t prev, next; // -1 at the ends
  uint32_t start, end;  // bytes of the piece it covers (for merging by score)
  bool alive;
};

struct Candidate {
  double key;  // merge rank (lower first) or -score (higher score first)
  int32_t left;
  int32_t left_id, right_id;  // the pair when queued: stale if either symbol changed
  uint32_t left_end, right_end;
  int32_t merged;
  bool operator<(const Candidate& o) const {  // std::priority_queue pops the largest
    if (key != o.key) return key > o.key;
    return left > o.left;
  }
};

}  // namespace

void Bpe::encode(const std::string& piece, bool byte_level, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  auto push = [&](int32_t id, size_t s, size_t e) {
    const int32_t k = static_cast<int32_t>(sym.size());
    sym.push_back({id, k - 1, k + 1, static_cast<uint32_t>(s), static_cast<uint32_t>(e), true});
  };
  if (ignore_merges) {  // a piece that is a whole token is that token (Llama-3)
    std::string mapped;
    if (byte_level) {
      for (unsigned char c : piece) utf8_append(mapped, byte_to_cp(c));
    }
    auto it = ids.find(byte_level ? mapped : piece);
    if (it != ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool by_score = !scores.empty();
  if (byte_level) {
    for (size_t i = 0; i < piece.size(); ++i) {
      const int32_t id = byte_level_ids[static_cast<unsigned char>(piece[i])];
      if (id >= 0) push(id, i, i + 1);  // a byte the vocab lacks is dropped, as Hugging Face does
    }
  } else {
    std::string ch;
    for (size_t i = 0; i < piece.size();) {
      int len = 1;
      utf8_at(piece, i, &len);
      ch.assign(piece, i, static_cast<size_t>(len));
      auto it = ids.find(ch);
      if (it != ids.end()) {
        push(it->second, i, i + len);
      } else if (by_score) {
        push(-1, i, i + len);  // resolved after merging
      } else if (byte_fallback && [&] {
                   for (int k = 0; k < len; ++k)
                     if (byte_ids[static_cast<unsigned char>(piece[i + k])] < 0) return false;
                   return true;
                 }()) {
        for (int k = 0; k < len; ++k) push(byte_ids[static_cast<unsigned char>(piece[i + k])], i + k, i + k + 1);
      } else if (unk >= 0) {
        if (!(fuse_unk && !sym.empty() && sym.back().id == unk)) push(unk, i, i + len);
        else sym.back().end = static_cast<uint32_t>(i + len);
      }
      i += static_cast<size_t>(len);
    }
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  std::priority_queue<Candidate> heap;
  auto consider = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = sym[l].next;
    if (r < 0) return;
    if (by_score) {
      auto it = ids.find(piece.substr(sym[l].start, sym[r].end - sym[l].start));
      if (it == ids.end()) return;
      heap.push({-static_cast<double>(scores[it->second]), l, sym[l].id, sym[r].id, sym[l].end, sym[r].end,
                 it->second});
    } else {
      if (sym[l].id < 0 || sym[r].id < 0) return;
      auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(sym[l].id)) << 32) |
                            static_cast<uint32_t>(sym[r].id));
      if (it == merges.end()) return;
      heap.push({static_cast<double>(it->second.first), l, sym[l].id, sym[r].id, sym[l].end, sym[r].end,
                 it->second.second});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    if (!l.alive || l.id != c.left_id || l.end != c.left_end || l.next < 0) continue;
    Symbol& r = sym[l.next];
    if (r.id != c.right_id || r.end != c.right_end) continue;
    l.id = c.merged;
    l.end = r.end;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const Symbol& s = sym[i];
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {  // merging by score: a character with no token -> its bytes' tokens, or unk
      for (uint32_t k = s.start; k < s.end; ++k) {
        const int32_t b = byte_ids[static_cast<unsigned char>(piece[k])];
        if (b >= 0) out.push_back(b);
        else if (unk >= 0) out.push_back(unk);
      }
    }
  }
}

}  // namespace pock_tok
