// Serial stand-in for the thread pool (replaced by the persistent pool).
#include "pock_parallel.h"

namespace pk {

void parallel_for_impl(i64 n, i64 grain, RangeFn fn) {
  (void)grain;
  fn(0, n);
}

int num_threads() { return 1; }

}  // namespace pk
