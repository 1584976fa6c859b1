/* train_driver.c — train a compiled model through pock.h alone (plain C).
 *
 *   train_driver CKPT_IN DATA STEPS CKPT_OUT [THREADS]
 *
 * Opens a trainer from CKPT_IN, runs STEPS steps, prints "loss <value>" per
 * step and saves the final state to CKPT_OUT.  DATA holds, for every step in
 * turn, the raw bytes of each input and then each target tensor, in the
 * compiled order, shape and dtype (pock_io_info).  Exit status 1 on any error.
 */
#include <stdio.h>
#include <stdlib.h>

#include "pock.h"

static void check(pock_status s, const char* what) {
  if (s != POCK_OK) {
    fprintf(stderr, "train_driver: %s failed (status %d): %s\n", what, (int)s, pock_last_error());
    exit(1);
  }
}

/* Describe group's tensors and give each a buffer of its size. */
static pock_tensor* alloc_group(int32_t group, int32_t n) {
  pock_tensor* ts = calloc((size_t)n + 1, sizeof *ts);
  pock_tensor_info* infos = calloc((size_t)n + 1, sizeof *infos); /* kept for the whole run */
  if (!ts || !infos) exit(1);
  for (int32_t i = 0; i < n; ++i) {
    check(pock_io_info(group, i, &infos[i]), "pock_io_info");
    ts[i].data = malloc((size_t)infos[i].nbytes + 1);
    if (!ts[i].data) exit(1);
    ts[i].dtype = infos[i].dtype;
    ts[i].ndim = infos[i].ndim;
    ts[i].shape = infos[i].shape;
  }
  return ts;
}

static void read_group(FILE* f, int32_t group, pock_tensor* ts, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    pock_tensor_info info;
    check(pock_io_info(group, i, &info), "pock_io_info");
    if (fread((void*)ts[i].data, 1, (size_t)info.nbytes, f) != (size_t)info.nbytes) {
      fprintf(stderr, "train_driver: data file too short for '%s'\n", info.name);
      exit(1);
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: train_driver CKPT_IN DATA STEPS CKPT_OUT [THREADS]\n");
    return 1;
  }
  pock_trainer* t = NULL;
  check(pock_open(argv[1], &t), "pock_open");
  if (argc > 5) check(pock_set_num_threads(t, atoi(argv[5])), "pock_set_num_threads");
  int32_t n_in = pock_io_count(POCK_INPUTS), n_tg = pock_io_count(POCK_TARGETS);
  pock_tensor* inputs = alloc_group(POCK_INPUTS, n_in);
  pock_tensor* targets = alloc_group(POCK_TARGETS, n_tg);
  FILE* data = fopen(argv[2], "rb");
  if (!data) {
    fprintf(stderr, "train_driver: cannot open %s\n", argv[2]);
    return 1;
  }
  int steps = atoi(argv[3]);
  for (int s = 0; s < steps; ++s) {
    read_group(data, POCK_INPUTS, inputs, n_in);
    read_group(data, POCK_TARGETS, targets, n_tg);
    float loss = 0.0f;
    check(pock_step(t, inputs, n_in, targets, n_tg, &loss), "pock_step");
    printf("loss %.9g\n", loss);
  }
  fclose(data);
  check(pock_save(t, argv[4]), "pock_save");
  pock_close(t);
  return 0;
}
