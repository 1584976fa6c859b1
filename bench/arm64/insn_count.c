/* insn_count.c — a QEMU TCG plugin that counts the guest instructions executed.
 *
 *   qemu-aarch64 -plugin libinsn_count.so -d plugin PROGRAM ...   -> "insns N" on stderr
 *
 * Debian's qemu-user is built with plugin support but ships no plugins (no
 * libinsn.so), so bench/arm64/insns.py builds this one.  It declares the few entry
 * points of QEMU's plugin API (version 1, QEMU 7.2+) it uses instead of needing
 * qemu-plugin.h (not packaged).  One counter, bumped inline per translated block
 * by the block's instruction count: exact for a single-threaded guest (run the
 * step on one thread).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum { INLINE_ADD_U64 = 0 };
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb*));
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, int op, void* ptr, uint64_t imm);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, void*), void* userdata);
extern void qemu_plugin_outs(const char* s);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t count;

static void on_tb(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, INLINE_ADD_U64, &count, qemu_plugin_tb_n_insns(tb));
}
static void on_exit_cb(qemu_plugin_id_t id, void* p) {
  (void)id; (void)p;
  char buf[64];
  snprintf(buf, sizeof buf, "insns %" PRIu64 "\n", count);
  qemu_plugin_outs(buf);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  (void)info; (void)argc; (void)argv;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb);
  qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
  return 0;
}
