// last_error.cpp — pock_last_error() and pock_rt::fail() for the standalone tokenizer
// library (libpock_tokenizer: the tokenizer without a model, for Python's
// pe.Tokenizer).  A model library takes both from pock_api.cpp instead, so this file
// is not among the runtime sources (it sits outside tokenizer/*.cpp).
#include <cstdarg>
#include <cstdio>
#include <string>

#include "pock.h"

namespace {
thread_local std::string g_last_error;
}

namespace pock_rt {

pock_status fail(pock_status s, const char* fmt, ...) {
  try {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_last_error.assign(buf, n < 0 ? 0 : static_cast<size_t>(n) < sizeof buf ? static_cast<size_t>(n) : sizeof buf - 1);
  } catch (...) {
    g_last_error.clear();
  }
  return s;
}

}  // namespace pock_rt

extern "C" POCK_API const char* pock_last_error(void) { return g_last_error.c_str(); }
