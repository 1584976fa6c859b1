// checkpoint.cpp — pock_save / pock_load: every state tensor, the step count
// and the learning rate in one self-checking file.
//
// Checkpoint format, version 1.  Integers are little-endian, nothing is padded.
//
//   offset  size       field
//   0       8          magic "POCKCKPT"
//   8       4          u32 format version (1)
//   12      4 + H      u32 H, then H bytes: the model hash (hex text, no NUL)
//           8          i64 optimizer steps completed
//           4          f32 learning rate (IEEE-754 single)
//           4          u32 N, the number of tensors
//           N times:
//             4 + L    u32 L, then L bytes: the tensor's PyTorch name (no NUL)
//             4        i32 kind  (pock_tensor_kind)
//             4        i32 dtype (pock_dtype)
//             4        i32 ndim  (0..POCK_MAX_DIMS)
//             8*ndim   i64 shape[ndim]
//             8        i64 nbytes, then nbytes bytes of raw data (row-major,
//                      little-endian elements)
//   end-4   4          u32 CRC-32 (IEEE 802.3 polynomial, as zlib.crc32) of
//                      every byte before it
//
// A checkpoint holds exactly the model's state tensors (parameters, buffers,
// optimizer state and constants), in any order.  toolchain/pockengine/
// checkpoint.py reads and writes the same format in Python.
//
// Saving writes "<path>.tmp-<pid>-<counter>-<random>" (unique per save, so two
// trainers saving to one path at once never share a temporary file), flushes
// and fsyncs it, renames it over path and fsyncs the directory; on any failure
// the temporary file is removed and whatever was at path stays as it was.  The
// last rename wins and every rename puts one whole checkpoint in place.  A save
// first removes "<path>.tmp-<pid>-..." files whose process is gone (left by a
// crash or kill -9 during an earlier save).
//
// The path is respected: a symbolic link is saved through (its final target is
// replaced atomically, the link stays a link); a path that is not a regular
// file (a device such as /dev/null, a FIFO, a directory, a socket) is refused
// and left alone.  A final name too long for its temporary name's suffix
// (NAME_MAX) is cut in the temporary name only, so every legal name saves.
// Loading opens without blocking and refuses anything but a regular file (a
// FIFO would wait forever for a writer).
//
// Loading first checks the file's size against the size this model's checkpoint
// has (a file over twice that is rejected unread: no read of a multi-GB file
// that cannot be one), then reads it
// and validates magic, version, CRC, model hash, every header field (the step
// count and learning rate as the setters would) and every tensor's name, kind,
// dtype and shape before it changes any state.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sys/stat.h>
#include <cstring>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "runtime_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.cpp assumes a little-endian host"
#endif

namespace pock_rt {

namespace {

constexpr char kMagic[8] = {'P', 'O', 'C', 'K', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
// Step counts beyond 2^53 are not exact in the double AdamW's bias correction
// uses (and 2^63 - 1 + 1 would wrap): no real run gets near it.
constexpr int64_t kMaxSteps = int64_t{1} << 53;

struct CrcTable {
  uint32_t v[256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      v[i] = c;
    }
  }
};

// Streams bytes into a FILE*, keeping a running CRC and the first errno.
struct Writer {
  FILE* f;
  uint32_t crc = 0;
  int err = 0;
  void raw(const void* p, size_t n) {
    if (err == 0 && n > 0 && std::fwrite(p, 1, n, f) != n) err = errno ? errno : EIO;
  }
  void put(const void* p, size_t n) {
    crc = crc32_update(crc, p, n);
    raw(p, n);
  }
  void u32(uint32_t v) { put(&v, 4); }
  void i32(int32_t v) { put(&v, 4); }
  void i64(int64_t v) { put(&v, 8); }
  void str(const char* s) {
    const uint32_t n = static_cast<uint32_t>(std::strlen(s));
    u32(n);
    put(s, n);
  }
};

// Bounds-checked reads from the loaded file.
struct Reader {
  const uint8_t* p;
  size_t size, pos = 0;
  bool ok = true;
  bool get(void* dst, size_t n) {
    if (!ok || n > size - pos) return ok = false;
    std::memcpy(dst, p + pos, n);
    pos += n;
    return true;
  }
  template <class T>
  T take() {
    T v{};
    get(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint32_t n = take<uint32_t>();
    if (!ok || n > size - pos) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

pock_status io_failure(const char* path, const std::string& tmp, const char* what, int err) {
  std::remove(tmp.c_str());
  return fail(POCK_ERR_IO, "cannot save checkpoint '%s': %s: %s", path, what, std::strerror(err));
}

// Opens path for reading when it is a regular file: O_NONBLOCK so a FIFO is
// refused instead of waiting for a writer (a directory would "seek" to LLONG_MAX).
FILE* open_regular(const char* path, int* err) {
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return nullptr;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *err = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : S_ISFIFO(st.st_mode) ? ESPIPE : ENODEV;
    close(fd);
    return nullptr;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  FILE* f = fdopen(fd, "rb");
  if (!f) {
    *err = errno;
    close(fd);
  }
  return f;
}

// Reads at most `limit` bytes of path into *out; *size gets the file's size.
bool read_file(const char* path, size_t limit, std::vector<uint8_t>* out, int64_t* size, int* err) {
  FILE* f = open_regular(path, err);
  if (!f) return false;
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    *err = errno;
    std::fclose(f);
    return false;
  }
  *size = static_cast<int64_t>(st.st_size);
  out->resize(static_cast<size_t>(st.st_size) < limit ? static_cast<size_t>(st.st_size) : limit);
  const bool ok = std::fread(out->data(), 1, out->size(), f) == out->size();
  *err = ok ? 0 : (errno ? errno : EIO);
  std::fclose(f);
  return ok;
}

// The exact size of this model's checkpoint (every tensor once, see the format).
int64_t expected_size(const PockModel* m) {
  int64_t n = 8 + 4 + 4 + static_cast<int64_t>(std::strlen(m->hash)) + 8 + 4 + 4 + 4;
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    n += 4 + static_cast<int64_t>(std::strlen(s.name)) + 12 + 8 * s.ndim + 8 + s.nbytes;
  }
  return n;
}

// The most bytes load reads: twice the model's checkpoint plus 64 KiB.
int64_t read_limit(int64_t want) { return 2 * want + (int64_t{1} << 16); }

// The longest temporary-name suffix ".tmp-<pid>-<counter>-<16 hex>" and the
// longest final name kept whole in a temporary name (NAME_MAX 255).
constexpr size_t kTempSuffixMax = 5 + 20 + 1 + 20 + 1 + 16;
constexpr size_t kTempBaseMax = 255 - kTempSuffixMax;

// "<dir>/<name, cut to kTempBaseMax bytes>.tmp-": what every temporary name of path starts with.
std::string temp_prefix(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + base.substr(0, kTempBaseMax) + ".tmp-";
}

// "<path>.tmp-<pid>-<counter>-<random>": unique across processes, trainers and threads.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, "%ld-%llu-%016llx", static_cast<long>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)), static_cast<unsigned long long>(rng()));
  return temp_prefix(path) + suffix;
}

// The file a save to path replaces: path itself, or the final target of the
// symbolic links it names (followed, at most 40, relative ones from the link's
// directory).  Anything there but a regular file (or nothing) is refused.
pock_status save_target(const char* path, std::string* target) {
  std::string p(path);
  for (int hops = 0;; ++hops) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) break;  // a new file (the directory is checked when the file is created)
      return fail(POCK_ERR_IO, "cannot save checkpoint '%s': %s: %s", path, p.c_str(), std::strerror(errno));
    }
    if (S_ISREG(st.st_mode)) break;
    if (!S_ISLNK(st.st_mode)) {
      const char* what = S_ISDIR(st.st_mode)   ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "not a regular file";
      return fail(POCK_ERR_IO, "cannot save checkpoint '%s': '%s' is %s, not a regular file; nothing was written",
                  path, p.c_str(), what);
    }
    if (hops == 40) return fail(POCK_ERR_IO, "cannot save checkpoint '%s': too many symbolic links", path);
    std::vector<char> link(static_cast<size_t>(st.st_size > 0 ? st.st_size : 255) + 2);
    const ssize_t n = readlink(p.c_str(), link.data(), link.size() - 1);
    if (n < 0) return fail(POCK_ERR_IO, "cannot save checkpoint '%s': %s: %s", path, p.c_str(), std::strerror(errno));
    const std::string to(link.data(), static_cast<size_t>(n));
    p = (to[0] == '/' || p.find('/') == std::string::npos) ? to : dir_of(p) + "/" + to;
  }
  *target = p;
  return POCK_OK;
}

// Remove "<path>.tmp-<pid>[-...]" files whose process no longer exists: what a
// crash during an earlier save left.  Live saves (this process's or another
// running one's) are left alone.  Best effort: errors are ignored.
void remove_orphans(const std::string& p) {
  const std::string dir = dir_of(p), full = temp_prefix(p);
  const std::string prefix = full.substr(full.find_last_of('/') == std::string::npos ? 0 : full.find_last_of('/') + 1);
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    const char* name = e->d_name;
    if (std::strncmp(name, prefix.c_str(), prefix.size()) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name + prefix.size(), &end, 10);
    if (end == name + prefix.size() || (*end != '\0' && *end != '-') || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    unlinkat(dirfd(d), name, 0);
  }
  closedir(d);
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const CrcTable table;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table.v[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

pock_status save_checkpoint(const pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  if (std::strlen(path) == 0) return fail(POCK_ERR_IO, "cannot save checkpoint: the path is empty");
  std::string target;
  if (pock_status s = save_target(path, &target)) return s;
  remove_orphans(target);
  const std::string tmp = temp_name(target);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    return fail(POCK_ERR_IO, "cannot save checkpoint '%s': cannot create '%s': %s", path, tmp.c_str(),
                std::strerror(errno));

  Writer w{f};
  w.put(kMagic, sizeof kMagic);
  w.u32(kVersion);
  w.str(m->hash);
  w.i64(t->steps);
  w.put(&t->lr, 4);
  w.u32(static_cast<uint32_t>(m->n_state));
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    w.str(s.name);
    w.i32(s.kind);
    w.i32(s.dtype);
    w.i32(s.ndim);
    for (int32_t d = 0; d < s.ndim; ++d) w.i64(s.shape[d]);
    w.i64(s.nbytes);
    w.put(t->state + s.offset, static_cast<size_t>(s.nbytes));
  }
  const uint32_t crc = w.crc;
  w.raw(&crc, 4);
  if (w.err == 0 && std::fflush(f) != 0) w.err = errno;
  if (w.err == 0 && fsync(fileno(f)) != 0) w.err = errno;
  if (std::fclose(f) != 0 && w.err == 0) w.err = errno;
  if (w.err != 0) return io_failure(path, tmp, "writing failed", w.err);
  if (std::rename(tmp.c_str(), target.c_str()) != 0)
    return io_failure(path, tmp, "renaming the temporary file failed", errno);

  // Make the rename itself durable; best effort (not every filesystem allows it).
  const int dfd = open(dir_of(target).c_str(), O_RDONLY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return POCK_OK;
}

static pock_status check_wrong_size(const PockModel* m, const char* path, const std::vector<uint8_t>& file,
                                    int64_t file_size, int64_t want);
static pock_status load_bytes(pock_trainer* t, const char* path, const std::vector<uint8_t>& file);

pock_status load_checkpoint_bytes(pock_trainer* t, const char* name, const uint8_t* data, size_t size) {
  const int64_t want = expected_size(t->model), limit = read_limit(want);
  const size_t keep = size < static_cast<size_t>(limit) ? size : static_cast<size_t>(limit);
  const std::vector<uint8_t> file(data, data + keep);
  if (static_cast<int64_t>(size) > limit)
    return check_wrong_size(t->model, name, file, static_cast<int64_t>(size), want);
  return load_bytes(t, name, file);
}

pock_status load_checkpoint(pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  std::vector<uint8_t> file;
  int err = 0;
  int64_t file_size = 0;
  const int64_t want = expected_size(m), limit = read_limit(want);
  // Read only what a checkpoint of this model can be near: a much larger file is
  // judged on its first bytes (magic, version, model hash) and never read whole.
  // Sizes up to the limit are read and validated in full, for precise messages
  // (a missing tensor, a wrong shape); only exactly `want` bytes can pass.
  if (!read_file(path, static_cast<size_t>(limit), &file, &file_size, &err))
    return fail(POCK_ERR_IO, "cannot read checkpoint '%s': %s", path,
                err == ESPIPE   ? "it is a FIFO, not a regular file"
                : err == ENODEV ? "it is a device or socket, not a regular file"
                                : std::strerror(err));
  if (is_trained_checkpoint(file.data(), file.size())) {  // pock_save_trained's (trained_ckpt.cpp)
    if (file_size > limit)
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is %lld bytes, more than model '%s' can hold",
                  path, (long long)file_size, m->name);
    return load_trained_checkpoint(t, path, file.data(), file.size());
  }
  if (file_size > limit) return check_wrong_size(m, path, file, file_size, want);
  return load_bytes(t, path, file);
}

static pock_status check_wrong_size(const PockModel* m, const char* path, const std::vector<uint8_t>& file,
                                    int64_t file_size, int64_t want) {
  const size_t n = file.size();
  if (n < sizeof kMagic || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    return fail(POCK_ERR_CHECKPOINT, "'%s' is not a PockEngine checkpoint (%s)", path,
                n < sizeof kMagic ? "too short" : "bad magic");
  Reader r{file.data(), n, sizeof kMagic};
  const uint32_t version = r.take<uint32_t>();
  const std::string hash = r.str();
  if (r.ok && version != kVersion)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' has format version %u; this runtime reads version %u", path,
                version, kVersion);
  if (r.ok && hash != m->hash)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint is for model %s but this library is %s ('%s', model '%s')",
                hash.c_str(), m->hash, path, m->name);
  return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt or truncated: %lld bytes, model '%s' needs %lld", path,
              (long long)file_size, m->name, (long long)want);
}

static pock_status load_bytes(pock_trainer* t, const char* path, const std::vector<uint8_t>& file) {
  const PockModel* m = t->model;
  const size_t n = file.size();
  if (n < sizeof kMagic || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    return fail(POCK_ERR_CHECKPOINT, "'%s' is not a PockEngine checkpoint (%s)", path,
                n < sizeof kMagic ? "too short" : "bad magic");
  if (n < sizeof kMagic + 8) return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is truncated (%zu bytes)", path, n);
  uint32_t stored, version;
  std::memcpy(&stored, file.data() + n - 4, 4);
  const uint32_t computed = crc32_update(0, file.data(), n - 4);
  if (stored != computed)
    return fail(POCK_ERR_CHECKPOINT,
                "checkpoint '%s' is corrupt or truncated (CRC-32 mismatch: stored %08x, computed %08x)", path, stored,
                computed);
  std::memcpy(&version, file.data() + sizeof kMagic, 4);
  if (version != kVersion)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' has format version %u; this runtime reads version %u", path,
                version, kVersion);

  Reader r{file.data(), n - 4, sizeof kMagic + 4};
  const std::string hash = r.str();
  const int64_t steps = r.take<int64_t>();
  const float lr = r.take<float>();
  const uint32_t count = r.take<uint32_t>();
  if (!r.ok) return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: truncated header", path);
  if (hash != m->hash)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint is for model %s but this library is %s ('%s', model '%s')",
                hash.c_str(), m->hash, path, m->name);
  if (steps < 0 || steps > kMaxSteps)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: step count %lld is outside [0, 2^53]", path,
                (long long)steps);
  if (!std::isfinite(lr) || lr < 0.0f)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: learning rate %g is not finite and >= 0", path,
                (double)lr);


  std::vector<const uint8_t*> data(static_cast<size_t>(m->n_state), nullptr);
  for (uint32_t k = 0; k < count; ++k) {
    const std::string name = r.str();
    const int32_t kind = r.take<int32_t>(), dtype = r.take<int32_t>(), ndim = r.take<int32_t>();
    if (!r.ok || ndim < 0 || ndim > POCK_MAX_DIMS)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: bad header for tensor %u", path, k);
    int64_t shape[POCK_MAX_DIMS];
    for (int32_t d = 0; d < ndim; ++d) shape[d] = r.take<int64_t>();
    const int64_t nbytes = r.take<int64_t>();
    if (!r.ok || nbytes < 0 || static_cast<uint64_t>(nbytes) > r.size - r.pos)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: tensor '%s' runs past the end of the file", path,
                  name.c_str());
    const uint8_t* bytes = r.p + r.pos;
    r.pos += static_cast<size_t>(nbytes);

    const int32_t i = find_state(m, name.c_str());
    if (i < 0)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' holds tensor '%s', which model '%s' does not have", path,
                  name.c_str(), m->name);
    const PockStateTensor& s = m->state[i];
    if (data[static_cast<size_t>(i)])
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: tensor '%s' appears twice", path, name.c_str());
    bool same = kind == s.kind && dtype == s.dtype && ndim == s.ndim && nbytes == s.nbytes;
    for (int32_t d = 0; same && d < ndim; ++d) same = shape[d] == s.shape[d];
    if (!same)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s': tensor '%s' is %s (kind %d); the model expects %s (kind %d)",
                  path, name.c_str(), describe(shape, ndim, dtype).c_str(), kind,
                  describe(s.shape, s.ndim, s.dtype).c_str(), s.kind);
    data[static_cast<size_t>(i)] = bytes;
  }
  if (r.pos != r.size)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: %zu unexpected bytes after the last tensor", path,
                r.size - r.pos);
  for (int32_t i = 0; i < m->n_state; ++i)
    if (!data[static_cast<size_t>(i)])
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' lacks tensor '%s' of model '%s'", path, m->state[i].name,
                  m->name);

  // Everything is valid: only now touch the trainer.
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    if (s.nbytes > 0) std::memcpy(t->state + s.offset, data[static_cast<size_t>(i)], static_cast<size_t>(s.nbytes));
  }
  t->steps = steps;
  t->lr = lr;
  return POCK_OK;
}

}  // namespace pock_rt
