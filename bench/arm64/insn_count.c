/* insn_count.c — a QEMU TCG plugin that counts the guest instructions executed.
 *
 *   qemu-aarch64 -plugin libinsn_count.so -d plugin PROGRAM ...   -> "insns N" on stderr
 *   qemu-aarch64 -plugin libinsn_count.so,ranges=FILE,classes=1 -d plugin PROGRAM ...
 *
 * Debian's qemu-user is built with plugin support but ships no plugins (no
 * libinsn.so), so bench/arm64/insns.py builds this one.  It declares the few entry
 * points of QEMU's plugin API (version 1, QEMU 7.2+) it uses instead of needing
 * qemu-plugin.h (not packaged).  One counter, bumped inline per translated block
 * by the block's instruction count: exact for a single-threaded guest (run the
 * step on one thread).
 *
 * Optional (bench/arm64/compute_insns.py), both off by default:
 *   ranges=FILE  lines "START END GROUP" (hex addresses, END exclusive, GROUP 0..255, sorted and
 *                disjoint): a block's instructions also count to the group whose range holds the
 *                block's first address -> "group G N" lines (an exclusive profile by code range);
 *   classes=1    counts of a few AArch64 instructions -> "class NAME N" lines: BFMMLA, BFDOT,
 *                FMLA on fp16 vectors (.4h/.8h, by vector or element), FMLA on fp32 vectors (.2s/.4s).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct qemu_info_t qemu_info_t;
enum { INLINE_ADD_U64 = 0 };
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb*));
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
extern uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb* tb);
extern struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb* tb, size_t idx);
extern const void* qemu_plugin_insn_data(const struct qemu_plugin_insn* insn);
extern size_t qemu_plugin_insn_size(const struct qemu_plugin_insn* insn);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, int op, void* ptr, uint64_t imm);
extern void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn* insn, int op, void* ptr, uint64_t imm);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, void*), void* userdata);
extern void qemu_plugin_outs(const char* s);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t count;

#define MAX_GROUPS 256
struct range { uint64_t start, end; int group; };
static struct range* ranges;
static size_t n_ranges;
static uint64_t group_count[MAX_GROUPS];

/* name, mask, value: an instruction word w is in the class when (w & mask) == value */
static const struct { const char* name; uint32_t mask, value; } CLASSES[] = {
    {"bfmmla", 0xFFE0FC00u, 0x6E40EC00u},     /* BFMMLA Vd.4S, Vn.8H, Vm.8H */
    {"bfdot", 0xBFE0FC00u, 0x2E40FC00u},      /* BFDOT (vector) */
    {"bfdot", 0xBFC0F400u, 0x0F40F000u},      /* BFDOT (by element) */
    {"fmla_f16", 0xBFE0FC00u, 0x0E400C00u},   /* FMLA Vd.4H/8H (vector) */
    {"fmla_f16", 0xBFC0F400u, 0x0F001000u},   /* FMLA Vd.4H/8H (by element) */
    {"fmla_f32", 0xBFE0FC00u, 0x0E20CC00u},   /* FMLA Vd.2S/4S (vector) */
    {"fmla_f32", 0xBFC0F400u, 0x0F801000u},   /* FMLA Vd.2S/4S (by element) */
};
#define N_CLASSES (sizeof CLASSES / sizeof CLASSES[0])
static const char* CLASS_NAMES[] = {"bfmmla", "bfdot", "fmla_f16", "fmla_f32"};
#define N_NAMES (sizeof CLASS_NAMES / sizeof CLASS_NAMES[0])
static int classes_on;
static uint64_t class_count[N_NAMES];

static int group_of(uint64_t pc) {
  size_t lo = 0, hi = n_ranges;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (pc < ranges[mid].start) hi = mid;
    else if (pc >= ranges[mid].end) lo = mid + 1;
    else return ranges[mid].group;
  }
  return -1;
}

static int class_of(uint32_t w) {
  for (size_t c = 0; c < N_CLASSES; ++c) {
    if ((w & CLASSES[c].mask) != CLASSES[c].value) continue;
    for (size_t k = 0; k < N_NAMES; ++k)
      if (strcmp(CLASS_NAMES[k], CLASSES[c].name) == 0) return (int)k;
  }
  return -1;
}

static void on_tb(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  const size_t n = qemu_plugin_tb_n_insns(tb);
  qemu_plugin_register_vcpu_tb_exec_inline(tb, INLINE_ADD_U64, &count, n);
  if (n_ranges) {
    const int g = group_of(qemu_plugin_tb_vaddr(tb));
    if (g >= 0) qemu_plugin_register_vcpu_tb_exec_inline(tb, INLINE_ADD_U64, &group_count[g], n);
  }
  if (!classes_on) return;
  for (size_t i = 0; i < n; ++i) {
    struct qemu_plugin_insn* insn = qemu_plugin_tb_get_insn(tb, i);
    if (qemu_plugin_insn_size(insn) != 4) continue;
    uint32_t w;
    memcpy(&w, qemu_plugin_insn_data(insn), 4);
    const int c = class_of(w);
    if (c >= 0) qemu_plugin_register_vcpu_insn_exec_inline(insn, INLINE_ADD_U64, &class_count[c], 1);
  }
}

static void on_exit_cb(qemu_plugin_id_t id, void* p) {
  (void)id; (void)p;
  char buf[96];
  snprintf(buf, sizeof buf, "insns %" PRIu64 "\n", count);
  qemu_plugin_outs(buf);
  for (int g = 0; g < MAX_GROUPS && n_ranges; ++g) {
    if (!group_count[g]) continue;
    snprintf(buf, sizeof buf, "group %d %" PRIu64 "\n", g, group_count[g]);
    qemu_plugin_outs(buf);
  }
  for (size_t k = 0; k < N_NAMES && classes_on; ++k) {
    snprintf(buf, sizeof buf, "class %s %" PRIu64 "\n", CLASS_NAMES[k], class_count[k]);
    qemu_plugin_outs(buf);
  }
}

static int load_ranges(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  size_t cap = 0;
  unsigned long long s, e;
  int g;
  while (fscanf(f, "%llx %llx %d", &s, &e, &g) == 3) {
    if (g < 0 || g >= MAX_GROUPS || e <= s || (n_ranges && s < ranges[n_ranges - 1].end)) {
      fclose(f);
      return -1;  /* out of order, overlapping or a bad group */
    }
    if (n_ranges == cap) {
      cap = cap ? 2 * cap : 256;
      struct range* r = realloc(ranges, cap * sizeof *r);
      if (!r) { fclose(f); return -1; }
      ranges = r;
    }
    ranges[n_ranges++] = (struct range){s, e, g};
  }
  fclose(f);
  return 0;
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  (void)info;
  for (int i = 0; i < argc; ++i) {
    if (strncmp(argv[i], "ranges=", 7) == 0) {
      if (load_ranges(argv[i] + 7) != 0) {
        fprintf(stderr, "insn_count: bad ranges file %s\n", argv[i] + 7);
        return -1;
      }
    } else if (strcmp(argv[i], "classes=1") == 0) {
      classes_on = 1;
    } else {
      fprintf(stderr, "insn_count: unknown argument %s\n", argv[i]);
      return -1;
    }
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb);
  qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
  return 0;
}
