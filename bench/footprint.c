/* footprint.c — what training costs in memory, measured by the OS (plain C, no Python).
 *
 *   footprint CKPT STEPS [THREADS [ID_RANGE [CKPT_OUT]]]
 *
 * Links against one compiled model library (pock.h).  Opens a trainer from CKPT
 * (a checkpoint or a bundle's weights file), runs STEPS training steps on random
 * data (integer inputs and targets drawn from [0, ID_RANGE), default 64; float
 * ones from [-1, 1)), then prints one line of key=value pairs read from
 * /proc/self: after opening and after training
 *   private_dirty_kb  Private_Dirty of smaps_rollup: what iOS jetsam and Android's
 *                     low-memory killer charge the app
 *   rss_kb, hwm_kb    VmRSS and VmHWM (peak RSS) of /proc/self/status
 *   ckpt_rss_kb, ckpt_dirty_kb, ckpt_clean_kb
 *                     the checkpoint file's mappings in /proc/self/smaps: resident,
 *                     private dirty (pages copied on write) and clean (file-backed)
 * and ms_per_step (wall clock, steps after the first), and each step's loss (lossN, 9
 * significant digits: the float exactly).  FOOTPRINT_SMAPS=FILE: /proc/self/smaps after
 * training is copied to FILE (which mappings hold the private dirty pages).  With CKPT_OUT the final
 * state is saved there (to compare weights after training).  Exit status 1 on any error.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "pock.h"

static void check(pock_status s, const char* what) {
  if (s != POCK_OK) {
    fprintf(stderr, "footprint: %s failed (status %d): %s\n", what, (int)s, pock_last_error());
    exit(1);
  }
}

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static unsigned long long next_random(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

/* Buffers for group's tensors (pock_io_info), filled with random values. */
static pock_tensor* random_group(int32_t group, int32_t n, long id_range) {
  pock_tensor* ts = calloc((size_t)n + 1, sizeof *ts);
  pock_tensor_info* infos = calloc((size_t)n + 1, sizeof *infos); /* kept for the whole run */
  if (!ts || !infos) exit(1);
  for (int32_t i = 0; i < n; ++i) {
    check(pock_io_info(group, i, &infos[i]), "pock_io_info");
    void* data = malloc((size_t)infos[i].nbytes + 8);
    if (!data) exit(1);
    int64_t count = 1;
    for (int32_t d = 0; d < infos[i].ndim; ++d) count *= infos[i].shape[d];
    for (int64_t k = 0; k < count; ++k) {
      const unsigned long long r = next_random();
      if (infos[i].dtype == POCK_F32) ((float*)data)[k] = (float)((r >> 40) / (double)(1 << 24) * 2.0 - 1.0);
      if (infos[i].dtype == POCK_I64) ((int64_t*)data)[k] = (int64_t)(r % (unsigned long long)id_range);
      if (infos[i].dtype == POCK_I32) ((int32_t*)data)[k] = (int32_t)(r % (unsigned long long)id_range);
      if (infos[i].dtype == POCK_U8) ((uint8_t*)data)[k] = (uint8_t)(r % (unsigned long long)id_range);
    }
    ts[i].data = data;
    ts[i].dtype = infos[i].dtype;
    ts[i].ndim = infos[i].ndim;
    ts[i].shape = infos[i].shape;
  }
  return ts;
}

/* The value of "key:" (kB) in a /proc file, summed over every line that has it. */
static long long proc_kb(const char* path, const char* key) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  long long total = 0;
  const size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':') total += atoll(line + n + 1);
  fclose(f);
  return total;
}

/* Rss, Private_Dirty and clean pages (Private_Clean + Shared_Clean) of the
 * mappings of `file` in /proc/self/smaps. */
static void file_pages(const char* file, long long* rss, long long* dirty, long long* clean) {
  *rss = *dirty = *clean = 0;
  char real[PATH_MAX];
  if (!realpath(file, real)) return;
  FILE* f = fopen("/proc/self/smaps", "r");
  if (!f) return;
  char line[PATH_MAX + 256];
  int inside = 0;
  while (fgets(line, sizeof line, f)) {
    const char* dash = strchr(line, '-');
    const char* space = strchr(line, ' ');
    if (!(isxdigit((unsigned char)line[0]) && dash && space && dash < space)) { /* "Key:   N kB" */
      char key[64];
      long long kb;
      if (!inside || sscanf(line, "%63[^:]: %lld kB", key, &kb) != 2) continue;
      if (strcmp(key, "Rss") == 0) *rss += kb;
      if (strcmp(key, "Private_Dirty") == 0) *dirty += kb;
      if (strcmp(key, "Private_Clean") == 0 || strcmp(key, "Shared_Clean") == 0) *clean += kb;
    } else { /* a mapping's header line: "start-end perms offset dev inode path" */
      line[strcspn(line, "\n")] = '\0';
      const char* path = strchr(line, '/');
      inside = path != NULL && strcmp(path, real) == 0;
    }
  }
  fclose(f);
}

static void report(const char* when, const char* ckpt) {
  long long rss, dirty, clean;
  file_pages(ckpt, &rss, &dirty, &clean);
  printf("%s_private_dirty_kb=%lld %s_rss_kb=%lld %s_hwm_kb=%lld %s_ckpt_rss_kb=%lld %s_ckpt_dirty_kb=%lld "
         "%s_ckpt_clean_kb=%lld ",
         when, proc_kb("/proc/self/smaps_rollup", "Private_Dirty"), when, proc_kb("/proc/self/status", "VmRSS"),
         when, proc_kb("/proc/self/status", "VmHWM"), when, rss, when, dirty, when, clean);
}

static double clock_ms(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }
/* CPU time of the process (every thread): a step's time less what a loaded machine took away */
static double cpu_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: footprint CKPT STEPS [THREADS [ID_RANGE [CKPT_OUT]]]\n");
    return 1;
  }
  const int steps = atoi(argv[2]);
  const int threads = argc > 3 ? atoi(argv[3]) : 1;
  const long id_range = argc > 4 ? atol(argv[4]) : 64;
  if (steps < 0 || threads < 1 || id_range < 1) {
    fprintf(stderr, "footprint: STEPS >= 0, THREADS >= 1 and ID_RANGE >= 1\n");
    return 1;
  }
  int32_t n_in = pock_io_count(POCK_INPUTS), n_tg = pock_io_count(POCK_TARGETS);
  pock_tensor* inputs = random_group(POCK_INPUTS, n_in, id_range);
  pock_tensor* targets = random_group(POCK_TARGETS, n_tg, id_range);

  pock_trainer* t = NULL;
  check(pock_open(argv[1], &t), "pock_open");
  check(pock_set_num_threads(t, threads), "pock_set_num_threads");
  report("open", argv[1]);
  double t0 = 0.0, c0 = 0.0;
  struct rusage u0, u1;
  memset(&u0, 0, sizeof u0);
  for (int s = 0; s < steps; ++s) {
    if (s == 1) t0 = now_ms(), c0 = cpu_ms(), getrusage(RUSAGE_SELF, &u0);
    float loss = 0.0f;
    const pock_status st = pock_step(t, inputs, n_in, targets, n_tg, &loss);
    if (st != POCK_ERR_NONFINITE) check(st, "pock_step");  /* a skipped step still ran */
    printf("loss%d=%.9g ", s, (double)loss);                 /* 9 digits: the float exactly */
  }
  const double ms = steps > 1 ? (now_ms() - t0) / (steps - 1) : 0.0;
  const double cpu = steps > 1 ? (cpu_ms() - c0) / (steps - 1) : 0.0;
  getrusage(RUSAGE_SELF, &u1); /* page faults and waits of the timed steps (all of them when STEPS < 2) */
  printf("timed_minflt=%ld timed_majflt=%ld timed_nvcsw=%ld timed_nivcsw=%ld ", u1.ru_minflt - u0.ru_minflt,
         u1.ru_majflt - u0.ru_majflt, u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_nivcsw - u0.ru_nivcsw);
  report("train", argv[1]);
  const char* dump = getenv("FOOTPRINT_SMAPS"); /* a copy of /proc/self/smaps after training there */
  if (dump && *dump) {
    FILE *in = fopen("/proc/self/smaps", "r"), *out = fopen(dump, "w");
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
  }
  printf("ms_per_step=%.2f cpu_ms_per_step=%.2f steps=%d threads=%d\n", ms, cpu, steps, threads);
  if (argc > 5) check(pock_save(t, argv[5]), "pock_save");
  pock_close(t);
  return 0;
}
