// arm_features.h — whether this arm64 CPU has an optional feature, asked at run time, so one
// build (one AAR, one XCFramework slice) serves every phone: Linux/Android read the auxiliary
// vector's hwcaps, Apple its sysctl hw.optional.arm.FEAT_* names.  lowp_dot.cpp (BF16) and
// lowp_fmla.cpp (FP16 arithmetic) ask through it.
#pragma once

#if defined(__aarch64__)
#include <cstddef>
#if defined(__APPLE__)
#include <sys/sysctl.h>
#else
#include <sys/auxv.h>
#endif

namespace pk {
namespace detail {

// apple: the sysctl name; word: 1 for AT_HWCAP, 2 for AT_HWCAP2; bit: the feature's mask in it
// (asm/hwcap.h)
inline bool arm_has(const char* apple, int word, unsigned long bit) {
#if defined(__APPLE__)
  (void)word;
  (void)bit;
  int v = 0;
  size_t n = sizeof(v);
  return sysctlbyname(apple, &v, &n, nullptr, 0) == 0 && v != 0;
#else
  (void)apple;
  return (getauxval(word == 2 ? AT_HWCAP2 : AT_HWCAP) & bit) != 0;
#endif
}

}  // namespace detail
}  // namespace pk
#endif
