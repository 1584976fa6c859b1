// fuzz_checkpoint.cpp — libFuzzer target for the C runtime's checkpoint parser
// (native/runtime/checkpoint.cpp), over the hand-written tiny model
// (tests/native/runtime/fixtures/tiny_model.cpp).  Built with
// -fsanitize=fuzzer,address,undefined by test_fuzz_checkpoint.py.
//
// Every input is tried twice: as it is (magic, version, size and CRC checks) and
// with its CRC-32 recomputed, so that mutations reach the header and tensor
// parsing behind the CRC instead of all stopping at it.  A load either fails
// with a status or succeeds; a successful one must leave state that a save
// writes back and loads again.
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime_internal.h"

namespace {

pock_trainer* trainer() {
  static pock_trainer* t = [] {
    pock_trainer* p = nullptr;
    if (pock_open(nullptr, &p) != POCK_OK) __builtin_trap();
    return p;
  }();
  return t;
}

void try_load(const uint8_t* data, size_t size) {
  pock_trainer* t = trainer();
  const pock_status s = pock_rt::load_checkpoint_bytes(t, "fuzz input", data, size);
  if (s != POCK_OK && s != POCK_ERR_CHECKPOINT) __builtin_trap();  // only ever "bad checkpoint"
  if (s == POCK_OK) {
    float lr = 0;
    int64_t steps = 0;
    pock_get_learning_rate(t, &lr);
    pock_step_count(t, &steps);
    if (!(lr >= 0.0f) || steps < 0) __builtin_trap();  // the header checks held
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try_load(data, size);
  if (size >= 16) {
    std::vector<uint8_t> fixed(data, data + size);
    const uint32_t crc = pock_rt::crc32_update(0, fixed.data(), size - 4);
    std::memcpy(fixed.data() + size - 4, &crc, 4);
    try_load(fixed.data(), fixed.size());
  }
  return 0;
}
