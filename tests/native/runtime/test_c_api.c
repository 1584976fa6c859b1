/* test_c_api.c — the C API (pock.h) over the hand-written tiny model
 * (fixtures/tiny_model.cpp), as a mobile SDK would call it.
 *
 * Usage: test_c_api TMPDIR   (prints "ALL OK" and exits 0 on success)
 */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "pock.h"

static int g_failures = 0;
static char g_dir[4096];

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
      ++g_failures;                                                        \
    }                                                                      \
  } while (0)

/* status == want, and the last error mentions `part` */
#define CHECK_ERR(call, want, part)                                                                      \
  do {                                                                                                   \
    pock_status s_ = (call);                                                                             \
    if (s_ != (want) || !strstr(pock_last_error(), (part))) {                                            \
      fprintf(stderr, "FAIL %s:%d: %s -> status %d (want %d), message '%s' (want '%s')\n", __FILE__,     \
              __LINE__, #call, (int)s_, (int)(want), pock_last_error(), (part));                         \
      ++g_failures;                                                                                      \
    }                                                                                                    \
  } while (0)

#define CHECK_OK(call) CHECK_ERR(call, POCK_OK, "")

static const int64_t X_SHAPE[2] = {4, 3}, IDS_SHAPE[1] = {4}, T_SHAPE[2] = {4, 2};
static const float X[12] = {0.5f, -1.0f, 2.0f, 1.5f, 0.0f, -0.5f, -2.0f, 1.0f, 0.25f, 1.0f, 1.0f, 1.0f};
static int64_t IDS[4] = {0, 4, 2, 1};
static float T[8];

static pock_tensor x_in(void) { pock_tensor t = {X, POCK_F32, 2, X_SHAPE}; return t; }
static pock_tensor ids_in(void) { pock_tensor t = {IDS, POCK_I64, 1, IDS_SHAPE}; return t; }
static pock_tensor t_in(void) { pock_tensor t = {T, POCK_F32, 2, T_SHAPE}; return t; }

/* TMPDIR/name, in one of a few rotating buffers: copy it to keep it. */
static char* path_in(const char* name) {
  static char buf[4][4200];
  static int next = 0;
  char* p = buf[next++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
  return p;
}

static pock_status step(pock_trainer* t, float* loss) {
  pock_tensor in[2] = {x_in(), ids_in()}, tg[1] = {t_in()};
  return pock_step(t, in, 2, tg, 1, loss);
}

static pock_status forward(pock_trainer* t, float y[8]) {
  pock_tensor in[2] = {x_in(), ids_in()};
  pock_buffer out[1] = {{y, 8 * sizeof(float)}};
  return pock_forward(t, in, 2, out, 1);
}

/* Every state tensor's bytes, the step count and the lr, concatenated. */
static size_t snapshot(pock_trainer* t, unsigned char* buf, size_t cap) {
  size_t n = 0;
  for (int32_t i = 0; i < pock_tensor_count(); ++i) {
    pock_tensor_info info;
    pock_tensor_info_at(i, &info);
    if (n + (size_t)info.nbytes > cap) return 0;
    pock_get_tensor(t, info.name, buf + n, info.nbytes);
    n += (size_t)info.nbytes;
  }
  int64_t steps = -1;
  float lr = -1;
  pock_step_count(t, &steps);
  pock_get_learning_rate(t, &lr);
  memcpy(buf + n, &steps, 8);
  memcpy(buf + n + 8, &lr, 4);
  return n + 12;
}

static long read_all(const char* path, unsigned char* buf, long cap) {
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  long n = (long)fread(buf, 1, (size_t)cap, f);
  fclose(f);
  return n;
}

static void write_all(const char* path, const unsigned char* buf, long n) {
  FILE* f = fopen(path, "wb");
  fwrite(buf, 1, (size_t)n, f);
  fclose(f);
}

static uint32_t crc32_of(const unsigned char* p, long n) {
  uint32_t c = 0xFFFFFFFFu;
  for (long i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

static int count_tmp_files(void) {
  int n = 0;
  DIR* d = opendir(g_dir);
  struct dirent* e;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".tmp-")) ++n;
  if (d) closedir(d);
  return n;
}

static void test_describe(void) {
  pock_tensor_info info;
  CHECK(strcmp(pock_model_name(), "tiny") == 0);
  CHECK(strlen(pock_model_hash()) > 0);
  CHECK(strlen(pock_version()) > 0);
  CHECK(pock_io_count(POCK_INPUTS) == 2);
  CHECK(pock_io_count(POCK_TARGETS) == 1);
  CHECK(pock_io_count(POCK_OUTPUTS) == 1);
  CHECK(pock_io_count(9) == -1);
  CHECK_OK(pock_io_info(POCK_INPUTS, 1, &info));
  CHECK(strcmp(info.name, "ids") == 0 && info.dtype == POCK_I64 && info.ndim == 1);
  CHECK(info.shape[0] == 4 && info.nbytes == 32);
  CHECK_ERR(pock_io_info(POCK_INPUTS, 2, &info), POCK_ERR_INVALID_ARGUMENT, "index 2");
  CHECK_ERR(pock_io_info(7, 0, &info), POCK_ERR_INVALID_ARGUMENT, "unknown group");
  CHECK_ERR(pock_io_info(POCK_INPUTS, 0, NULL), POCK_ERR_INVALID_ARGUMENT, "NULL");
  CHECK(pock_tensor_count() == 6);
  CHECK_OK(pock_tensor_info_at(0, &info));
  CHECK(strcmp(info.name, "fc.weight") == 0 && info.kind == POCK_PARAM && info.shape[1] == 3);
  CHECK_OK(pock_tensor_info_at(2, &info));
  CHECK(info.kind == POCK_BUFFER && info.ndim == 0 && info.dtype == POCK_I64);
  CHECK_ERR(pock_tensor_info_at(6, &info), POCK_ERR_INVALID_ARGUMENT, "index 6");
}

static void test_null_and_closed(void) {
  float loss, lr;
  int64_t steps;
  pock_close(NULL);
  CHECK_ERR(pock_open(NULL, NULL), POCK_ERR_INVALID_ARGUMENT, "NULL");
  CHECK_ERR(step(NULL, &loss), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_forward(NULL, NULL, 0, NULL, 0), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_get_tensor(NULL, "fc.bias", &lr, 4), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_save(NULL, "x"), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_load(NULL, "x"), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_save_trained(NULL, "x"), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_step_count(NULL, &steps), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");
  CHECK_ERR(pock_set_learning_rate(NULL, 0.1f), POCK_ERR_INVALID_ARGUMENT, "trainer is NULL");

  pock_trainer* t = NULL;
  CHECK_OK(pock_open(NULL, &t));
  CHECK_ERR(pock_save(t, NULL), POCK_ERR_INVALID_ARGUMENT, "path is NULL");
  CHECK_ERR(pock_save_trained(t, NULL), POCK_ERR_INVALID_ARGUMENT, "path is NULL");
  /* a hand-written model without a trained-parameter table cannot tell trained from frozen */
  CHECK_ERR(pock_save_trained(t, "never-written"), POCK_ERR_INVALID_ARGUMENT, "table of trained parameters");
  CHECK_ERR(pock_get_tensor(t, NULL, &lr, 4), POCK_ERR_INVALID_ARGUMENT, "name is NULL");
  CHECK_ERR(pock_get_learning_rate(t, NULL), POCK_ERR_INVALID_ARGUMENT, "NULL");
  CHECK_ERR(pock_step(t, NULL, 2, NULL, 1, &loss), POCK_ERR_INVALID_ARGUMENT, "NULL");
  pock_tensor in[2] = {x_in(), ids_in()}, tg[1] = {t_in()};
  in[0].data = NULL;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_INVALID_ARGUMENT, "input 0 'x': data is NULL");
  in[0] = x_in();
  in[0].shape = NULL;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_INVALID_ARGUMENT, "shape is NULL");
  in[0] = x_in();
  CHECK_OK(pock_step(t, in, 2, tg, 1, NULL)); /* loss_out may be NULL */
  pock_close(t);
}

static void test_training(void) {
  pock_trainer* t = NULL;
  float loss0 = 0, loss = 0, lr = 0, w[6], b[2], y[8];
  int64_t steps = -1, seen = -1;
  CHECK_OK(pock_open(NULL, &t));
  CHECK_OK(pock_get_learning_rate(t, &lr));
  CHECK(fabsf(lr - 0.1f) < 1e-7f);
  CHECK_OK(pock_set_learning_rate(t, 0.05f));
  CHECK_ERR(pock_set_learning_rate(t, -1.0f), POCK_ERR_VALUE, "learning rate");
  CHECK_ERR(pock_set_learning_rate(t, NAN), POCK_ERR_VALUE, "learning rate");
  CHECK_OK(pock_set_num_threads(t, 2));
  CHECK_ERR(pock_set_num_threads(t, 0), POCK_ERR_INVALID_ARGUMENT, "threads");

  for (int i = 0; i < 20; ++i) {
    CHECK_OK(step(t, &loss));
    if (i == 0) loss0 = loss;
  }
  CHECK(loss0 > 0.5f);
  CHECK(loss < 0.5f * loss0);
  CHECK_OK(pock_step_count(t, &steps));
  CHECK(steps == 20);
  CHECK_OK(pock_get_tensor(t, "steps_seen", &seen, 8));
  CHECK(seen == 20); /* the model saw ctx->step == 19 on the last step */

  /* forward = x @ W^T + b with the trained weights */
  CHECK_OK(pock_get_tensor(t, "fc.weight", w, sizeof w));
  CHECK_OK(pock_get_tensor(t, "fc.bias", b, sizeof b));
  CHECK_OK(forward(t, y));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      float want = b[j];
      for (int k = 0; k < 3; ++k) want += X[i * 3 + k] * w[j * 3 + k];
      CHECK(fabsf(y[i * 2 + j] - want) < 1e-5f);
    }
  float y_small[7];
  pock_tensor in[2] = {x_in(), ids_in()};
  pock_buffer out[1] = {{y_small, sizeof y_small}};
  CHECK_ERR(pock_forward(t, in, 2, out, 1), POCK_ERR_INVALID_ARGUMENT,
            "output 0 'y': buffer holds 28 bytes, expected 32");
  CHECK_ERR(pock_forward(t, in, 2, out, 2), POCK_ERR_INVALID_ARGUMENT, "expected 1 outputs (y), got 2");
  CHECK_OK(pock_step_count(t, &steps));
  CHECK(steps == 20); /* forward does not count */

  /* set/get by name */
  float nb[2] = {1.0f, -1.0f}, back[2];
  CHECK_OK(pock_set_tensor(t, "fc.bias", nb, sizeof nb));
  CHECK_OK(pock_get_tensor(t, "fc.bias", back, sizeof back));
  CHECK(back[0] == 1.0f && back[1] == -1.0f);
  CHECK_ERR(pock_set_tensor(t, "fc.nope", nb, sizeof nb), POCK_ERR_INVALID_ARGUMENT, "unknown state tensor 'fc.nope'");
  CHECK_ERR(pock_get_tensor(t, "fc.bias", back, 4), POCK_ERR_INVALID_ARGUMENT, "(2,) float32 (8 bytes), got 4 bytes");
  CHECK_ERR(pock_get_tensor(t, "fc.bias", NULL, 8), POCK_ERR_INVALID_ARGUMENT, "NULL");
  char long_name[1001];
  memset(long_name, 'w', 1000);
  long_name[1000] = '\0';
  CHECK_ERR(pock_get_tensor(t, long_name, back, 8), POCK_ERR_INVALID_ARGUMENT, long_name); /* > 512 chars */
  pock_close(t);
}

static void test_validation(void) {
  pock_trainer* t = NULL;
  float loss;
  int64_t steps = -1;
  CHECK_OK(pock_open(NULL, &t));
  pock_tensor in[2] = {x_in(), ids_in()}, tg[1] = {t_in()};

  CHECK_ERR(pock_step(t, in, 1, tg, 1, &loss), POCK_ERR_INVALID_ARGUMENT, "expected 2 inputs (x, ids), got 1");
  CHECK_ERR(pock_step(t, in, 2, tg, 0, &loss), POCK_ERR_INVALID_ARGUMENT, "expected 1 targets (target), got 0");

  const int64_t bad_shape[2] = {4, 4};
  in[0].shape = bad_shape;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_SHAPE,
            "input 0 'x': expected shape (4, 3) float32, got (4, 4) float32");
  in[0] = x_in();
  in[0].ndim = 1;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_SHAPE, "got (4,) float32");
  in[0].ndim = 9;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_SHAPE, "ndim 9");
  in[0] = x_in();
  in[1].dtype = POCK_F32;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_DTYPE,
            "input 1 'ids': expected shape (4,) int64, got (4,) float32");
  in[1] = ids_in();
  tg[0].dtype = POCK_I64;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_DTYPE, "target 0 'target'");
  tg[0] = t_in();

  int64_t bad_ids[4] = {0, 1, 5, 2};
  in[1].data = bad_ids;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_VALUE, "input 1 'ids' holds 5 at flat index 2, outside [0, 5)");
  bad_ids[2] = -1;
  CHECK_ERR(pock_forward(t, in, 2, NULL, 0), POCK_ERR_VALUE, "holds -1 at flat index 2");

  /* int32 where int64 is compiled: widened, and range-checked too */
  int32_t ids32[4] = {0, 4, 2, 1};
  in[1].data = ids32;
  in[1].dtype = POCK_I32;
  CHECK_OK(pock_step(t, in, 2, tg, 1, &loss));
  ids32[3] = 7;
  CHECK_ERR(pock_step(t, in, 2, tg, 1, &loss), POCK_ERR_VALUE, "holds 7 at flat index 3");
  CHECK_OK(pock_step_count(t, &steps));
  CHECK(steps == 1); /* failed steps do not count */

  /* int32 and int64 ids give the same step */
  pock_trainer *a = NULL, *b = NULL;
  CHECK_OK(pock_open(NULL, &a));
  CHECK_OK(pock_open(NULL, &b));
  ids32[3] = 1;
  float la, lb, wa[6], wb[6];
  CHECK_OK(pock_step(a, in, 2, tg, 1, &la));
  CHECK_OK(step(b, &lb));
  CHECK_OK(pock_get_tensor(a, "fc.weight", wa, sizeof wa));
  CHECK_OK(pock_get_tensor(b, "fc.weight", wb, sizeof wb));
  CHECK(la == lb && memcmp(wa, wb, sizeof wa) == 0);
  pock_close(a);
  pock_close(b);
  pock_close(t);
}

static void test_checkpoints(void) {
  static unsigned char before[4096], after[4096], file[8192], mutated[8192];
  pock_trainer* t = NULL;
  float loss, y0[8], y1[8], y2[8];
  CHECK_OK(pock_open(NULL, &t));
  for (int i = 0; i < 5; ++i) CHECK_OK(step(t, &loss));
  CHECK_OK(pock_set_learning_rate(t, 0.02f));
  char good[4200];
  snprintf(good, sizeof good, "%s", path_in("good.ckpt"));
  CHECK_OK(pock_save(t, good));
  CHECK(count_tmp_files() == 0);
  CHECK_OK(forward(t, y0));
  size_t n0 = snapshot(t, before, sizeof before);

  /* train on, then load: everything as it was */
  for (int i = 0; i < 3; ++i) CHECK_OK(step(t, &loss));
  CHECK_OK(pock_set_learning_rate(t, 0.5f));
  CHECK_OK(pock_load(t, good));
  CHECK_OK(forward(t, y1));
  CHECK(memcmp(y0, y1, sizeof y0) == 0);
  CHECK(snapshot(t, after, sizeof after) == n0 && memcmp(before, after, n0) == 0);

  /* a fresh trainer opened from the checkpoint matches too */
  pock_trainer* u = NULL;
  CHECK_OK(pock_open(good, &u));
  CHECK_OK(forward(u, y2));
  CHECK(memcmp(y0, y2, sizeof y0) == 0);
  CHECK(snapshot(u, after, sizeof after) == n0 && memcmp(before, after, n0) == 0);
  pock_close(u);

  long n = read_all(good, file, sizeof file);
  CHECK(n > 100 && memcmp(file, "POCKCKPT", 8) == 0);

  /* bad files: each fails with POCK_ERR_CHECKPOINT and leaves the state alone */
  struct {
    const char* name;
    long size;
    long flip; /* byte to flip, or -1 */
    const char* msg;
  } cases[] = {
      {"flip.ckpt", n, n / 2, "CRC-32 mismatch"},
      {"flip_crc.ckpt", n, n - 1, "CRC-32 mismatch"},
      {"trunc.ckpt", n - 10, -1, "corrupt or truncated"},
      {"short.ckpt", 12, -1, "truncated"},
      {"empty.ckpt", 0, -1, "not a PockEngine checkpoint"},
      {"magic.ckpt", n, 0, "bad magic"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    memcpy(mutated, file, (size_t)n);
    if (cases[c].flip >= 0) mutated[cases[c].flip] ^= 0x10;
    write_all(path_in(cases[c].name), mutated, cases[c].size);
    for (int i = 0; i < 2; ++i) CHECK_OK(step(t, &loss));
    size_t nb = snapshot(t, before, sizeof before);
    CHECK_ERR(pock_load(t, path_in(cases[c].name)), POCK_ERR_CHECKPOINT, cases[c].msg);
    CHECK(snapshot(t, after, sizeof after) == nb && memcmp(before, after, nb) == 0);
    pock_trainer* v = (pock_trainer*)1;
    CHECK_ERR(pock_open(path_in(cases[c].name), &v), POCK_ERR_CHECKPOINT, cases[c].msg);
    CHECK(v == NULL);
  }

  /* valid CRC, but another model's hash (bytes 16.. hold the hash text) */
  memcpy(mutated, file, (size_t)n);
  mutated[16] = mutated[16] == 'f' ? 'e' : 'f';
  uint32_t crc = crc32_of(mutated, n - 4);
  memcpy(mutated + n - 4, &crc, 4);
  write_all(path_in("other.ckpt"), mutated, n);
  CHECK_ERR(pock_load(t, path_in("other.ckpt")), POCK_ERR_CHECKPOINT, "checkpoint is for model ");
  CHECK(strstr(pock_last_error(), pock_model_hash()) != NULL);
  /* valid CRC, unknown version */
  memcpy(mutated, file, (size_t)n);
  mutated[8] = 9;
  crc = crc32_of(mutated, n - 4);
  memcpy(mutated + n - 4, &crc, 4);
  write_all(path_in("v9.ckpt"), mutated, n);
  CHECK_ERR(pock_load(t, path_in("v9.ckpt")), POCK_ERR_CHECKPOINT, "format version 9");
  CHECK_ERR(pock_load(t, path_in("missing.ckpt")), POCK_ERR_IO, "missing.ckpt");

  /* saving into a missing directory fails; nothing appears */
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/no/such/dir/x.ckpt", g_dir);
  CHECK_ERR(pock_save(t, missing), POCK_ERR_IO, "cannot save checkpoint");

  /* a failing write (file size limit: a full disk) leaves the old checkpoint intact */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old_lim, lim;
  getrlimit(RLIMIT_FSIZE, &old_lim);
  lim = old_lim;
  lim.rlim_cur = 64;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  for (int i = 0; i < 2; ++i) CHECK_OK(step(t, &loss));
  CHECK_ERR(pock_save(t, good), POCK_ERR_IO, "writing failed");
  setrlimit(RLIMIT_FSIZE, &old_lim);
  long n2 = read_all(good, mutated, sizeof mutated);
  CHECK(n2 == n && memcmp(mutated, file, (size_t)n) == 0);
  CHECK(count_tmp_files() == 0);

  /* the rename fails (the path is a non-empty directory): temp file removed */
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", path_in("adir"));
  mkdir(dir, 0755);
  char inner[4300];
  snprintf(inner, sizeof inner, "%s/keep", dir);
  write_all(inner, (const unsigned char*)"x", 1);
  CHECK_ERR(pock_save(t, dir), POCK_ERR_IO, "is a directory, not a regular file");  /* refused before writing (issue 40) */
  CHECK(count_tmp_files() == 0);

  /* saving over an existing checkpoint replaces it */
  CHECK_OK(pock_save(t, good));
  CHECK(read_all(good, mutated, sizeof mutated) == n && memcmp(mutated, file, (size_t)n) != 0);
  pock_close(t);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s TMPDIR\n", argv[0]);
    return 2;
  }
  snprintf(g_dir, sizeof g_dir, "%s", argv[1]);
  /* targets from a known linear map: T = X @ W*^T + b* */
  const float w_true[6] = {1.0f, -1.0f, 0.5f, 0.2f, 0.3f, -1.0f}, b_true[2] = {0.5f, -0.25f};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      T[i * 2 + j] = b_true[j];
      for (int k = 0; k < 3; ++k) T[i * 2 + j] += X[i * 3 + k] * w_true[j * 3 + k];
    }
  test_describe();
  test_null_and_closed();
  test_training();
  test_validation();
  test_checkpoints();
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("ALL OK\n");
  return 0;
}
