// trained_ckpt.cpp — pock_save_trained and the trained-only half of pock_load:
// checkpoints that hold only what training changes, the few MB an app keeps
// per user while the frozen base weights ship with it.
//
// The format is toolchain/pockengine/runtime/trained_ckpt.py's (files written by
// either side load on the other).  Integers little-endian:
//
//   0       8          magic "POCKTRND"
//   8       4          u32 version (1)
//   12      4          u32 H, then H bytes: the base hash (hex SHA-256, below)
//           ...        one ordinary checkpoint (checkpoint.cpp's format, its
//                      own model hash and CRC-32) holding the subset: the
//                      trained parameters (PockModel::trained), every buffer
//                      and every optimizer-state tensor, the step count and
//                      the learning rate; no frozen parameter, no constant.
//
// Base hash: SHA-256 over the frozen parameters (kind PARAM, not trained) in
// the model's state order, each as  name, "\0", numpy's str(shape), numpy's
// str(dtype) (bf16 bits are "uint16"), then the raw bytes: it ties the file
// to the base weights it was trained on.
//
// Loading reads and validates the whole file (magic, version, CRC, model
// hash, base hash against the trainer's current frozen weights, every
// tensor's name, kind, dtype and shape, step count, learning rate) before it
// changes any state; then it copies the subset in and leaves the rest as is.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "runtime_internal.h"

namespace pock_rt {

namespace {

constexpr char kTrainedMagic[8] = {'P', 'O', 'C', 'K', 'T', 'R', 'N', 'D'};
constexpr char kCkptMagic[8] = {'P', 'O', 'C', 'K', 'C', 'K', 'P', 'T'};
constexpr uint32_t kTrainedVersion = 1, kCkptVersion = 1;
constexpr int64_t kMaxSteps = int64_t{1} << 53;

// ---------------------------------------------------------------- SHA-256 (FIPS 180-4)
struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block[64];
  size_t used = 0;
  uint64_t total = 0;

  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress(const uint8_t* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }

  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total += n;
    while (n > 0) {
      const size_t take = n < 64 - used ? n : 64 - used;
      std::memcpy(block + used, p, take);
      used += take, p += take, n -= take;
      if (used == 64) compress(block), used = 0;
    }
  }
  void update(const std::string& s) { update(s.data(), s.size()); }

  std::string hex() {
    const uint64_t bits = total * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (used != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (uint32_t v : h)
      for (int i = 28; i >= 0; i -= 4) out += digits[(v >> i) & 0xF];
    return out;
  }
};

// numpy's str(dtype) of the arrays Python's Trainer.get_tensor returns.
const char* numpy_dtype(int32_t dtype) { return dtype == POCK_BF16 ? "uint16" : dtype_name(dtype); }

// numpy's str(shape): "(4, 3)", "(4,)", "()".
std::string numpy_shape(const int64_t* shape, int32_t ndim) {
  std::string s = "(";
  for (int32_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + (ndim == 1 ? ",)" : ")");
}

bool is_trained(const PockModel* m, const char* name) {
  for (int32_t i = 0; i < m->n_trained; ++i)
    if (std::strcmp(m->trained[i], name) == 0) return true;
  return false;
}

// Whether state tensor i goes into a trained-only checkpoint.
bool kept(const PockModel* m, int32_t i) {
  const PockStateTensor& s = m->state[i];
  if (s.kind == POCK_CONSTANT) return false;
  return s.kind != POCK_PARAM || is_trained(m, s.name);
}

std::string base_hash(const pock_trainer* t) {
  const PockModel* m = t->model;
  Sha256 h;
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    if (s.kind != POCK_PARAM || is_trained(m, s.name)) continue;
    h.update(std::string(s.name) + '\0' + numpy_shape(s.shape, s.ndim) + numpy_dtype(s.dtype));
    h.update(t->state + s.offset, static_cast<size_t>(s.nbytes));
  }
  return h.hex();
}

void put(std::vector<uint8_t>& out, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) { put(out, &v, sizeof v); }
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put(out, static_cast<uint32_t>(s.size()));
  put(out, s.data(), s.size());
}


pock_status no_table(const PockModel* m, const char* what) {
  return fail(POCK_ERR_INVALID_ARGUMENT,
              "%s: model '%s' was generated without its table of trained parameters, so a trained-only checkpoint "
              "cannot tell them from the frozen base; regenerate it with this version of PockEngine",
              what, m->name);
}

}  // namespace

bool is_trained_checkpoint(const uint8_t* data, size_t size) {
  return size >= sizeof kTrainedMagic && std::memcmp(data, kTrainedMagic, sizeof kTrainedMagic) == 0;
}

pock_status save_trained_checkpoint(const pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  if (m->n_trained == 0 || !m->trained) return no_table(m, "pock_save_trained");
  std::vector<uint8_t> ckpt;
  put(ckpt, kCkptMagic, sizeof kCkptMagic);
  put(ckpt, kCkptVersion);
  put_str(ckpt, m->hash);
  put(ckpt, t->steps);
  put(ckpt, t->lr);
  uint32_t count = 0;
  for (int32_t i = 0; i < m->n_state; ++i) count += kept(m, i);
  put(ckpt, count);
  for (int32_t i = 0; i < m->n_state; ++i) {
    if (!kept(m, i)) continue;
    const PockStateTensor& s = m->state[i];
    put_str(ckpt, s.name);
    put(ckpt, s.kind);
    put(ckpt, s.dtype);
    put(ckpt, s.ndim);
    for (int32_t d = 0; d < s.ndim; ++d) put(ckpt, s.shape[d]);
    put(ckpt, s.nbytes);
    put(ckpt, t->state + s.offset, static_cast<size_t>(s.nbytes));
  }
  put(ckpt, crc32_update(0, ckpt.data(), ckpt.size()));

  std::vector<uint8_t> file;
  put(file, kTrainedMagic, sizeof kTrainedMagic);
  put(file, kTrainedVersion);
  put_str(file, base_hash(t));
  put(file, ckpt.data(), ckpt.size());

  return write_file_atomically(path, "cannot save checkpoint", [&](FILE* f) {
    return std::fwrite(file.data(), 1, file.size(), f) == file.size() ? 0 : (errno ? errno : EIO);
  });
}

pock_status load_trained_checkpoint(pock_trainer* t, const char* path, const uint8_t* data, size_t n) {
  const PockModel* m = t->model;
  if (m->n_trained == 0 || !m->trained) return no_table(m, "pock_load");
  ByteReader outer{data, n, sizeof kTrainedMagic};
  const uint32_t version = outer.take<uint32_t>();
  if (!outer.ok) return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is truncated", path);
  if (version != kTrainedVersion)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' has format version %u; this runtime reads %u",
                path, version, kTrainedVersion);
  const std::string stored_base = outer.str();
  if (!outer.ok) return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is truncated", path);

  // The inner checkpoint: magic, CRC, version, model hash.
  const uint8_t* ck = data + outer.pos;
  const size_t ckn = n - outer.pos;
  if (ckn < sizeof kCkptMagic + 8 || std::memcmp(ck, kCkptMagic, sizeof kCkptMagic) != 0)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt (no checkpoint after its header)", path);
  uint32_t stored_crc, ck_version;
  std::memcpy(&stored_crc, ck + ckn - 4, 4);
  const uint32_t computed = crc32_update(0, ck, ckn - 4);
  if (stored_crc != computed)
    return fail(POCK_ERR_CHECKPOINT,
                "trained-only checkpoint '%s' is corrupt or truncated (CRC-32 mismatch: stored %08x, computed %08x)",
                path, stored_crc, computed);
  std::memcpy(&ck_version, ck + sizeof kCkptMagic, 4);
  if (ck_version != kCkptVersion)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' has checkpoint version %u; this runtime reads %u",
                path, ck_version, kCkptVersion);
  ByteReader r{ck, ckn - 4, sizeof kCkptMagic + 4};
  const std::string hash = r.str();
  const int64_t steps = r.take<int64_t>();
  const float lr = r.take<float>();
  const uint32_t count = r.take<uint32_t>();
  if (!r.ok) return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: truncated header", path);
  if (hash != m->hash)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is for model %s but this library is %s (model '%s')",
                path, hash.c_str(), m->hash, m->name);
  const std::string base = base_hash(t);
  if (stored_base != base)
    return fail(POCK_ERR_CHECKPOINT,
                "trained-only checkpoint '%s' was trained on other base weights (base hash %.12s != %.12s): load the "
                "base weights it was trained from first",
                path, stored_base.c_str(), base.c_str());
  if (steps < 0 || steps > kMaxSteps)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: step count %lld is outside [0, 2^53]",
                path, (long long)steps);
  if (!std::isfinite(lr) || lr < 0.0f)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: learning rate %g is not finite and >= 0",
                path, (double)lr);

  std::vector<const uint8_t*> found(static_cast<size_t>(m->n_state), nullptr);
  for (uint32_t k = 0; k < count; ++k) {
    const std::string name = r.str();
    const int32_t kind = r.take<int32_t>(), dtype = r.take<int32_t>(), ndim = r.take<int32_t>();
    if (!r.ok || ndim < 0 || ndim > POCK_MAX_DIMS)
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: bad header for tensor %u", path, k);
    int64_t shape[POCK_MAX_DIMS];
    for (int32_t d = 0; d < ndim; ++d) shape[d] = r.take<int64_t>();
    const int64_t nbytes = r.take<int64_t>();
    if (!r.ok || nbytes < 0 || static_cast<uint64_t>(nbytes) > r.size - r.pos)
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: tensor '%s' runs past its end", path,
                  name.c_str());
    const uint8_t* bytes = r.p + r.pos;
    r.pos += static_cast<size_t>(nbytes);
    const int32_t i = find_state(m, name.c_str());
    if (i < 0)
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' holds tensor '%s', which model '%s' does not have",
                  path, name.c_str(), m->name);
    const PockStateTensor& s = m->state[i];
    if (found[static_cast<size_t>(i)])
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: tensor '%s' appears twice", path,
                  name.c_str());
    bool same = kind == s.kind && dtype == s.dtype && ndim == s.ndim && nbytes == s.nbytes;
    for (int32_t d = 0; same && d < ndim; ++d) same = shape[d] == s.shape[d];
    if (!same)
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s': tensor '%s' is %s (kind %d); the model expects %s "
                  "(kind %d)", path, name.c_str(), describe(shape, ndim, dtype).c_str(), kind,
                  describe(s.shape, s.ndim, s.dtype).c_str(), s.kind);
    found[static_cast<size_t>(i)] = bytes;
  }
  if (r.pos != r.size)
    return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is corrupt: %zu unexpected bytes after the last "
                "tensor", path, r.size - r.pos);
  for (int32_t i = 0; i < m->n_state; ++i)
    if (kept(m, i) && !found[static_cast<size_t>(i)])
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' lacks tensor '%s' of model '%s'", path,
                  m->state[i].name, m->name);

  // Everything is valid: only now touch the trainer.
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    if (found[static_cast<size_t>(i)] && s.nbytes > 0)
      std::memcpy(t->state + s.offset, found[static_cast<size_t>(i)], static_cast<size_t>(s.nbytes));
  }
  t->steps = steps;
  t->lr = lr;
  return POCK_OK;
}

}  // namespace pock_rt
