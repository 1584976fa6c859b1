// nfc.cpp — the NFC normalizer (a tokenizer.json "NFC" normalizer, e.g. Qwen2's): canonical
// decomposition, canonical ordering and canonical composition (Unicode UAX #15), over the
// tables gen_nfc_table.py writes (nfc_table.h: combining classes, decompositions, the
// composition exclusions) and Hangul's arithmetic.  Text whose code points are all below
// U+0300 is NFC already (no combining mark, nothing that decomposes differently) and is
// returned as it is: the common case costs one pass over the bytes.
#include <algorithm>
#include <string>
#include <vector>

#include "nfc_table.h"
#include "tok_internal.h"

namespace pock_tok {

namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CccRun* it = std::upper_bound(kCccTable, kCccTable + kCccRuns, cp,
                                      [](uint32_t v, const CccRun& r) { return v < r.start; });
  return it == kCccTable ? 0 : (it - 1)->ccc;
}

const Decomp* find_decomposition(uint32_t cp) {
  const Decomp* it = std::lower_bound(kDecompTable, kDecompTable + kDecomps, cp,
                                      [](const Decomp& d, uint32_t v) { return d.cp < v; });
  return it != kDecompTable + kDecomps && it->cp == cp ? it : nullptr;
}

// cp's full canonical decomposition appended to out (recursive: at most a few levels deep)
void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomp* d = find_decomposition(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose(d->a, out);
  if (d->b) decompose(d->b, out);
}

struct Pair {
  uint32_t a, b, cp;
  bool operator<(const Pair& o) const { return a != o.a ? a < o.a : b < o.b; }
};

// The primary composites: every two-part decomposition but the exclusions, by (a, b).
const std::vector<Pair>& composites() {
  static const std::vector<Pair> table = [] {
    std::vector<Pair> v;
    for (const Decomp& d : kDecompTable)
      if (d.b && !std::binary_search(kNoComposeTable, kNoComposeTable + kNoComposes, d.cp)) v.push_back({d.a, d.b, d.cp});
    std::sort(v.begin(), v.end());
    return v;
  }();
  return table;
}

// The composite of a + b, or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const std::vector<Pair>& t = composites();
  const auto it = std::lower_bound(t.begin(), t.end(), Pair{a, b, 0});
  return it != t.end() && it->a == a && it->b == b ? it->cp : 0;
}

}  // namespace

void nfc(std::string& s) {
  bool plain = true;  // every code point below U+0300 (lead bytes below 0xCC)
  for (unsigned char c : s)
    if (c >= 0xCC) {
      plain = false;
      break;
    }
  if (plain) return;
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len = 1;
    decompose(utf8_at(s, i, &len), cps);
    i += static_cast<size_t>(len);
  }
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = combining_class(cps[i]);
  // canonical ordering: each run of non-starters stably sorted by class
  for (size_t i = 1; i < cps.size(); ++i)
    for (size_t j = i; j > 0 && cls[j] != 0 && cls[j - 1] > cls[j]; --j) {
      std::swap(cps[j], cps[j - 1]);
      std::swap(cls[j], cls[j - 1]);
    }
  // canonical composition (UAX #15's reference algorithm): a mark composes with the last
  // starter unless a mark of the same or a higher class stands between them
  size_t starter = 0, out = 1;
  int last = cls.empty() ? 0 : (cls[0] != 0 ? 256 : 0);
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const int k = cls[i];
    const uint32_t comp = compose(cps[starter], c);
    if (comp && (last < k || last == 0)) {
      cps[starter] = comp;
      continue;
    }
    if (k == 0) starter = out;
    last = k;
    cps[out++] = c;
  }
  cps.resize(std::min(out, cps.size()));
  std::string r;
  r.reserve(s.size());
  for (uint32_t c : cps) utf8_append(r, c);
  s.swap(r);
}

}  // namespace pock_tok
