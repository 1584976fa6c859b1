/* e2e_driver.c — one compiled model's training step through pock.h, for the
 * ASan/UBSan run of tests/codegen/test_reliability_sanitizers.py.  Any model: inputs are
 * made from pock_io_info (floats sin(k)/2, integer ids k % 5).  Checks: good
 * steps train; an id of +-10^6 is POCK_ERR_VALUE and a NaN input
 * POCK_ERR_NONFINITE, both with the step count unchanged; forward, save, load.
 * usage: e2e_driver CHECKPOINT WORKDIR */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pock.h"

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "FAILED %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,     \
              pock_last_error());                                                \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

typedef struct {
  pock_tensor t[8];
  int64_t shape[8][POCK_MAX_DIMS];
  void* data[8];
  int64_t count[8];
  int32_t n;
} group;

static void make_group(int32_t which, group* g) {
  g->n = pock_io_count(which);
  CHECK(g->n >= 0 && g->n <= 8);
  for (int32_t i = 0; i < g->n; ++i) {
    pock_tensor_info info;
    CHECK(pock_io_info(which, i, &info) == POCK_OK);
    int64_t count = 1;
    for (int32_t d = 0; d < info.ndim; ++d) {
      g->shape[i][d] = info.shape[d];
      count *= info.shape[d];
    }
    g->count[i] = count;
    g->data[i] = malloc((size_t)info.nbytes + 1);
    for (int64_t k = 0; k < count; ++k) {
      if (info.dtype == POCK_F32) ((float*)g->data[i])[k] = 0.5f * sinf((float)k);
      if (info.dtype == POCK_I64) ((int64_t*)g->data[i])[k] = k % 5;
    }
    g->t[i].data = g->data[i];
    g->t[i].dtype = info.dtype;
    g->t[i].ndim = info.ndim;
    g->t[i].shape = g->shape[i];
  }
}

static int32_t first_of(const group* g, int32_t dtype) {
  for (int32_t i = 0; i < g->n; ++i)
    if (g->t[i].dtype == dtype) return i;
  return -1;
}

int main(int argc, char** argv) {
  CHECK(argc == 3);
  pock_trainer* t = NULL;
  CHECK(pock_open(argv[1], &t) == POCK_OK);
  group in, tg;
  make_group(POCK_INPUTS, &in);
  make_group(POCK_TARGETS, &tg);
  float first = 0, loss = 0;
  for (int s = 0; s < 4; ++s) {
    CHECK(pock_step(t, in.t, in.n, tg.t, tg.n, &loss) == POCK_OK);
    CHECK(isfinite(loss));
    if (s == 0) first = loss;
  }
  CHECK(loss < first);
  int64_t steps = 0;
  CHECK(pock_step_count(t, &steps) == POCK_OK && steps == 4);

  const int32_t ids = first_of(&in, POCK_I64);
  if (ids >= 0) {
    int64_t* v = (int64_t*)in.data[ids];
    const int64_t last = in.count[ids] - 1, keep = v[last];
    const int64_t bad[2] = {1000000, -1000000};
    for (int k = 0; k < 2; ++k) {
      v[last] = bad[k];
      CHECK(pock_step(t, in.t, in.n, tg.t, tg.n, &loss) == POCK_ERR_VALUE);
      CHECK(strstr(pock_last_error(), "outside") != NULL);
    }
    v[last] = keep;
  }
  const int32_t xs = first_of(&in, POCK_F32);
  if (xs >= 0) {
    float* v = (float*)in.data[xs];
    const float keep = v[0];
    v[0] = NAN;
    CHECK(pock_step(t, in.t, in.n, tg.t, tg.n, &loss) == POCK_ERR_NONFINITE);
    v[0] = keep;
  }
  CHECK(pock_step_count(t, &steps) == POCK_OK && steps == 4);

  const int32_t n_out = pock_io_count(POCK_OUTPUTS);
  CHECK(n_out >= 1 && n_out <= 8);
  pock_buffer outs[8];
  for (int32_t i = 0; i < n_out; ++i) {
    pock_tensor_info info;
    CHECK(pock_io_info(POCK_OUTPUTS, i, &info) == POCK_OK);
    outs[i].data = malloc((size_t)info.nbytes + 1);
    outs[i].nbytes = info.nbytes;
  }
  CHECK(pock_forward(t, in.t, in.n, outs, n_out) == POCK_OK);

  char path[4096];
  snprintf(path, sizeof path, "%s/e2e.pock", argv[2]);
  CHECK(pock_save(t, path) == POCK_OK);
  CHECK(pock_step(t, in.t, in.n, tg.t, tg.n, &loss) == POCK_OK);
  CHECK(pock_load(t, path) == POCK_OK);
  CHECK(pock_step_count(t, &steps) == POCK_OK && steps == 4);

  for (int32_t i = 0; i < n_out; ++i) free(outs[i].data);
  for (int32_t i = 0; i < in.n; ++i) free(in.data[i]);
  for (int32_t i = 0; i < tg.n; ++i) free(tg.data[i]);
  pock_close(t);
  printf("ALL OK\n");
  return 0;
}
