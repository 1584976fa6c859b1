// checkpoint.cpp — pock_save / pock_load: every state tensor, the step count
// and the learning rate in one self-checking file, whose frozen weights a
// trainer reads in place (mapped, not copied).
//
// Checkpoint format, version 2 (written).  Integers are little-endian.
//
//   offset  size       field
//   0       8          magic "POCKCKPT"
//   8       4          u32 format version (2)
//   12      4 + H      u32 H, then H bytes: the model hash (hex text, no NUL)
//           8          i64 optimizer steps completed
//           4          f32 learning rate (IEEE-754 single)
//           4          u32 N, the number of tensors
//           8          i64 D, where the data region starts (a multiple of 4096)
//           8          i64 B, the data region's size
//           N times:
//             4 + L    u32 L, then L bytes: the tensor's PyTorch name (no NUL)
//             4        i32 kind  (pock_tensor_kind)
//             4        i32 dtype (pock_dtype)
//             4        i32 ndim  (0..POCK_MAX_DIMS)
//             8*ndim   i64 shape[ndim]
//             8        i64 nbytes
//             8        i64 offset of its data in the data region (offset + nbytes <= B)
//           ...        zero bytes up to D
//   D       B          the data region: each tensor's raw bytes (row-major,
//                      little-endian elements) at D + offset; gaps are zero
//   D+B     4          u32 CRC-32 (IEEE 802.3 polynomial, as zlib.crc32) of
//                      every byte before it
//
// pock_save writes the data region as an image of the trainer's state: every
// tensor at its state offset (PockStateTensor.offset), B = the model's
// state_bytes.  pock_open / pock_load of such a file map the data region
// (mmap, MAP_PRIVATE) as the trainer's state instead of copying it: the
// frozen tensors (the compiler lays them out after the trained ones, on a
// 16 KiB boundary: memory/plan.py state_layout) stay clean file-backed pages
// the OS may drop and re-read; the first write to a page (a trained tensor,
// optimizer state, pock_set_tensor on anything) copies that page only.  A file
// whose data region is not the model's image (another writer's order) is
// copied into private memory instead, as are version-1 files:
//
// Version 1 (read): the same header without D and B, and each tensor's data
// right after its nbytes field (no offset field, nothing padded).
//
// A checkpoint holds exactly the model's state tensors (parameters, buffers,
// optimizer state and constants), in any order.  toolchain/pockengine/
// checkpoint.py reads and writes the same format in Python.
//
// A mapped checkpoint must not be rewritten in place while a trainer maps it
// (the bytes it has not copied would change under it); replacing it by a
// rename, as pock_save and checkpoint.py do, is safe: the trainer keeps the
// old file's pages.
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
// has (a file over twice that is rejected on its first bytes: no read of a
// multi-GB file that cannot be one), then maps it read-only (no copy: reading
// pages to check the CRC leaves them clean)
// and validates magic, version, CRC, model hash, every header field (the step
// count and learning rate as the setters would) and every tensor's name, kind,
// dtype and shape before it changes any state.
#include <atomic>
#include <cerrno>
#include <functional>
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
#include <sys/mman.h>
#include <unistd.h>

#include "runtime_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.cpp assumes a little-endian host"
#endif

namespace pock_rt {

namespace {

constexpr char kMagic[8] = {'P', 'O', 'C', 'K', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 2;   // written; version 1 is read too
constexpr int64_t kDataAlign = 4096;  // D, the data region's start
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


std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

pock_status io_failure(const char* what, const char* path, const std::string& tmp, const char* step, int err) {
  std::remove(tmp.c_str());
  return fail(POCK_ERR_IO, "%s '%s': %s: %s", what, path, step, std::strerror(err));
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
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// The version-2 header's size up to the end of the tensor table.
int64_t header_size(const PockModel* m) {
  int64_t n = 8 + 4 + 4 + static_cast<int64_t>(std::strlen(m->hash)) + 8 + 4 + 4 + 8 + 8;
  for (int32_t i = 0; i < m->n_state; ++i)
    n += 4 + static_cast<int64_t>(std::strlen(m->state[i].name)) + 12 + 8 * m->state[i].ndim + 8 + 8;
  return n;
}

// The exact size of this model's checkpoint as pock_save writes it (see the format).
int64_t expected_size(const PockModel* m) { return align_up(header_size(m), kDataAlign) + m->state_bytes + 4; }

// The most bytes load looks at: twice the model's checkpoint plus 64 KiB.
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

size_t page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}

// A validated checkpoint: pointers into its bytes, one per state tensor of the model.
struct Parsed {
  int64_t steps = 0;
  float lr = 0.0f;
  std::vector<const uint8_t*> data;
  int64_t image_at = -1;  // D of a version-2 file whose data region is the model's state image, else -1
};

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
pock_status save_target(const char* path, const char* what, std::string* target) {
  std::string p(path);
  for (int hops = 0;; ++hops) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) break;  // a new file (the directory is checked when the file is created)
      return fail(POCK_ERR_IO, "%s '%s': %s: %s", what, path, p.c_str(), std::strerror(errno));
    }
    if (S_ISREG(st.st_mode)) break;
    if (!S_ISLNK(st.st_mode)) {
      const char* kind = S_ISDIR(st.st_mode)   ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "not a regular file";
      return fail(POCK_ERR_IO, "%s '%s': '%s' is %s, not a regular file; nothing was written",
                  what, path, p.c_str(), kind);
    }
    if (hops == 40) return fail(POCK_ERR_IO, "%s '%s': too many symbolic links", what, path);
    std::vector<char> link(static_cast<size_t>(st.st_size > 0 ? st.st_size : 255) + 2);
    const ssize_t n = readlink(p.c_str(), link.data(), link.size() - 1);
    if (n < 0) return fail(POCK_ERR_IO, "%s '%s': %s: %s", what, path, p.c_str(), std::strerror(errno));
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

pock_status write_file_atomically(const char* path, const char* what, const std::function<int(FILE*)>& write) {
  if (std::strlen(path) == 0) return fail(POCK_ERR_IO, "%s: the path is empty", what);
  std::string target;
  if (pock_status s = save_target(path, what, &target)) return s;
  remove_orphans(target);
  const std::string tmp = temp_name(target);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return fail(POCK_ERR_IO, "%s '%s': cannot create '%s': %s", what, path, tmp.c_str(), std::strerror(errno));
  int err = write(f);
  if (err == 0 && std::fflush(f) != 0) err = errno;
  if (err == 0 && fsync(fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err != 0) return io_failure(what, path, tmp, "writing failed", err);
  if (std::rename(tmp.c_str(), target.c_str()) != 0)
    return io_failure(what, path, tmp, "renaming the temporary file failed", errno);

  // Make the rename itself durable; best effort (not every filesystem allows it).
  const int dfd = open(dir_of(target).c_str(), O_RDONLY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return POCK_OK;
}

pock_status save_checkpoint(const pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  return write_file_atomically(path, "cannot save checkpoint", [&](FILE* f) {
    const int64_t head = header_size(m), data_at = align_up(head, kDataAlign);
    Writer w{f};
    w.put(kMagic, sizeof kMagic);
    w.u32(kVersion);
    w.str(m->hash);
    w.i64(t->steps);
    w.put(&t->lr, 4);
    w.u32(static_cast<uint32_t>(m->n_state));
    w.i64(data_at);
    w.i64(m->state_bytes);
    for (int32_t i = 0; i < m->n_state; ++i) {
      const PockStateTensor& s = m->state[i];
      w.str(s.name);
      w.i32(s.kind);
      w.i32(s.dtype);
      w.i32(s.ndim);
      for (int32_t d = 0; d < s.ndim; ++d) w.i64(s.shape[d]);
      w.i64(s.nbytes);
      w.i64(s.offset);
    }
    static const uint8_t zeros[kDataAlign] = {};
    w.put(zeros, static_cast<size_t>(data_at - head));
    w.put(t->state, static_cast<size_t>(m->state_bytes));  // the state image: every tensor at its offset
    const uint32_t crc = w.crc;
    w.raw(&crc, 4);
    return w.err;
  });
}

// The trainer's state memory: an anonymous mapping (zero pages until written),
// or a checkpoint's data region mapped MAP_PRIVATE (load_checkpoint).
bool state_alloc(pock_trainer* t) {
  const size_t len = static_cast<size_t>(t->model->state_bytes > 0 ? t->model->state_bytes : 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  state_release(t);
  t->state_map = static_cast<uint8_t*>(p);
  t->state_map_bytes = len;
  t->state = t->state_map;
  t->state_mapped_file = false;
  return true;
}

void state_release(pock_trainer* t) {
  if (t->state_map) munmap(t->state_map, t->state_map_bytes);
  t->state_map = t->state = nullptr;
  t->state_map_bytes = 0;
  t->state_mapped_file = false;
}

// Map the data region at file offset `at` of fd as t's state (false: keep the old one).
static bool map_state(pock_trainer* t, int fd, int64_t at) {
  const size_t page = page_size(), skew = static_cast<size_t>(at) % page;
  const size_t len = skew + static_cast<size_t>(t->model->state_bytes);
  if (len == 0) return false;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(at - skew));
  if (p == MAP_FAILED) return false;
  state_release(t);
  t->state_map = static_cast<uint8_t*>(p);
  t->state_map_bytes = len;
  t->state = t->state_map + skew;
  t->state_mapped_file = true;
  return true;
}

static pock_status check_wrong_size(const PockModel* m, const char* path, const uint8_t* p, size_t n,
                                    int64_t file_size, int64_t want);
static pock_status parse(const PockModel* m, const char* path, const uint8_t* p, size_t n, Parsed* out);

// Everything is valid: only now touch the trainer (copying every tensor into its state).
static void copy_state(pock_trainer* t, const Parsed& c) {
  const PockModel* m = t->model;
  for (int32_t i = 0; i < m->n_state; ++i) {
    const PockStateTensor& s = m->state[i];
    if (s.nbytes > 0) std::memcpy(t->state + s.offset, c.data[static_cast<size_t>(i)], static_cast<size_t>(s.nbytes));
  }
  t->steps = c.steps;
  t->lr = c.lr;
}

pock_status load_checkpoint_bytes(pock_trainer* t, const char* name, const uint8_t* data, size_t size) {
  const int64_t want = expected_size(t->model), limit = read_limit(want);
  if (static_cast<int64_t>(size) > limit)
    return check_wrong_size(t->model, name, data, static_cast<size_t>(limit), static_cast<int64_t>(size), want);
  Parsed c;
  if (pock_status s = parse(t->model, name, data, size, &c)) return s;
  copy_state(t, c);
  return POCK_OK;
}

pock_status load_checkpoint(pock_trainer* t, const char* path) {
  const PockModel* m = t->model;
  int err = 0;
  FILE* f = open_regular(path, &err);  // a FIFO or device is refused at once, never waited on
  if (!f)
    return fail(POCK_ERR_IO, "cannot read checkpoint '%s': %s", path,
                err == ESPIPE   ? "it is a FIFO, not a regular file"
                : err == ENODEV ? "it is a device or socket, not a regular file"
                                : std::strerror(err));
  const int fd = fileno(f);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    err = errno;
    std::fclose(f);
    return fail(POCK_ERR_IO, "cannot read checkpoint '%s': %s", path, std::strerror(err));
  }
  const int64_t size = static_cast<int64_t>(st.st_size), want = expected_size(m), limit = read_limit(want);
  // A much larger file than this model's checkpoint is judged on its first bytes
  // (magic, version, model hash) and never read whole.
  if (size > limit) {
    std::vector<uint8_t> head(1 << 16);
    const ssize_t got = pread(fd, head.data(), head.size(), 0);
    std::fclose(f);
    const size_t n = got > 0 ? static_cast<size_t>(got) : 0;
    if (is_trained_checkpoint(head.data(), n))
      return fail(POCK_ERR_CHECKPOINT, "trained-only checkpoint '%s' is %lld bytes, more than model '%s' can hold",
                  path, (long long)size, m->name);
    return check_wrong_size(m, path, head.data(), n, size, want);
  }
  // Validate the file through a read-only mapping: nothing is copied, and the pages
  // read for the CRC stay clean (the OS may drop them).
  void* view = MAP_FAILED;
  if (size > 0) {
    view = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (view == MAP_FAILED) {
      err = errno;
      std::fclose(f);
      return fail(POCK_ERR_IO, "cannot read checkpoint '%s': %s", path, std::strerror(err));
    }
  }
  static const uint8_t empty[1] = {};
  const uint8_t* bytes = view == MAP_FAILED ? empty : static_cast<const uint8_t*>(view);
  pock_status s;
  if (is_trained_checkpoint(bytes, static_cast<size_t>(size))) {  // pock_save_trained's (trained_ckpt.cpp)
    s = load_trained_checkpoint(t, path, bytes, static_cast<size_t>(size));
  } else {
    Parsed c;
    s = parse(m, path, bytes, static_cast<size_t>(size), &c);
    if (s == POCK_OK) {
      if (c.image_at >= 0 && map_state(t, fd, c.image_at)) {  // the data region becomes the state
        t->steps = c.steps;
        t->lr = c.lr;
      } else {
        copy_state(t, c);
      }
    }
  }
  if (view != MAP_FAILED) munmap(view, static_cast<size_t>(size));
  std::fclose(f);
  return s;
}

static pock_status check_wrong_size(const PockModel* m, const char* path, const uint8_t* p, size_t n,
                                    int64_t file_size, int64_t want) {
  if (n < sizeof kMagic || std::memcmp(p, kMagic, sizeof kMagic) != 0)
    return fail(POCK_ERR_CHECKPOINT, "'%s' is not a PockEngine checkpoint (%s)", path,
                n < sizeof kMagic ? "too short" : "bad magic");
  ByteReader r{p, n, sizeof kMagic};
  const uint32_t version = r.take<uint32_t>();
  const std::string hash = r.str();
  if (r.ok && version != 1 && version != kVersion)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' has format version %u; this runtime reads versions 1 and %u",
                path, version, kVersion);
  if (r.ok && hash != m->hash)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint is for model %s but this library is %s ('%s', model '%s')",
                hash.c_str(), m->hash, path, m->name);
  return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt or truncated: %lld bytes, model '%s' needs %lld", path,
              (long long)file_size, m->name, (long long)want);
}

// Validate a whole checkpoint (either version) against model m; *out points into p.
static pock_status parse(const PockModel* m, const char* path, const uint8_t* p, size_t n, Parsed* out) {
  if (n < sizeof kMagic || std::memcmp(p, kMagic, sizeof kMagic) != 0)
    return fail(POCK_ERR_CHECKPOINT, "'%s' is not a PockEngine checkpoint (%s)", path,
                n < sizeof kMagic ? "too short" : "bad magic");
  if (n < sizeof kMagic + 8) return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is truncated (%zu bytes)", path, n);
  uint32_t stored, version;
  std::memcpy(&stored, p + n - 4, 4);
  const uint32_t computed = crc32_update(0, p, n - 4);
  if (stored != computed)
    return fail(POCK_ERR_CHECKPOINT,
                "checkpoint '%s' is corrupt or truncated (CRC-32 mismatch: stored %08x, computed %08x)", path, stored,
                computed);
  std::memcpy(&version, p + sizeof kMagic, 4);
  if (version != 1 && version != kVersion)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' has format version %u; this runtime reads versions 1 and %u",
                path, version, kVersion);

  ByteReader r{p, n - 4, sizeof kMagic + 4};
  const std::string hash = r.str();
  const int64_t steps = r.take<int64_t>();
  const float lr = r.take<float>();
  const uint32_t count = r.take<uint32_t>();
  int64_t data_at = 0, data_bytes = 0;  // version 2: the data region
  if (version == 2) {
    data_at = r.take<int64_t>();
    data_bytes = r.take<int64_t>();
  }
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
  if (version == 2) {
    if (data_at < static_cast<int64_t>(r.pos) || data_bytes < 0 || data_at > static_cast<int64_t>(n - 4) ||
        data_bytes != static_cast<int64_t>(n - 4) - data_at)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: data region of %lld bytes at %lld does not end "
                  "at the CRC (%zu bytes)", path, (long long)data_bytes, (long long)data_at, n);
    r.size = static_cast<size_t>(data_at);  // the tensor table ends before the data region
  }

  bool image = version == 2 && data_at % kDataAlign == 0 && data_bytes == m->state_bytes;
  std::vector<const uint8_t*> data(static_cast<size_t>(m->n_state), nullptr);
  for (uint32_t k = 0; k < count; ++k) {
    const std::string name = r.str();
    const int32_t kind = r.take<int32_t>(), dtype = r.take<int32_t>(), ndim = r.take<int32_t>();
    if (!r.ok || ndim < 0 || ndim > POCK_MAX_DIMS)
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: bad header for tensor %u", path, k);
    int64_t shape[POCK_MAX_DIMS];
    for (int32_t d = 0; d < ndim; ++d) shape[d] = r.take<int64_t>();
    const int64_t nbytes = r.take<int64_t>();
    const uint8_t* bytes = nullptr;
    int64_t at = -1;
    if (version == 1) {
      if (!r.ok || nbytes < 0 || static_cast<uint64_t>(nbytes) > r.size - r.pos)
        return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: tensor '%s' runs past the end of the file",
                    path, name.c_str());
      bytes = r.p + r.pos;
      r.pos += static_cast<size_t>(nbytes);
    } else {
      at = r.take<int64_t>();
      if (!r.ok || nbytes < 0 || at < 0 || at > data_bytes || nbytes > data_bytes - at)
        return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: tensor '%s' lies outside the data region", path,
                    name.c_str());
      bytes = p + data_at + at;
    }

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
    image = image && at == s.offset;
  }
  if (version == 1 && r.pos != r.size)
    return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' is corrupt: %zu unexpected bytes after the last tensor", path,
                r.size - r.pos);
  for (int32_t i = 0; i < m->n_state; ++i)
    if (!data[static_cast<size_t>(i)])
      return fail(POCK_ERR_CHECKPOINT, "checkpoint '%s' lacks tensor '%s' of model '%s'", path, m->state[i].name,
                  m->name);
  out->steps = steps;
  out->lr = lr;
  out->data = std::move(data);
  out->image_at = image ? data_at : -1;
  return POCK_OK;
}

}  // namespace pock_rt
