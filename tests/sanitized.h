// Whether this test program is built under AddressSanitizer (ULTRA_SANITIZE, .ci/run's second suite). The
// slowest tests run fewer iterations or a sample of their cases there, with the same assertions: the
// sanitizers look for memory errors and undefined behaviour, which a sample exercises, and the full counts
// (the statistical power, every file of a list) run in the normal build.
#pragma once

namespace ultra::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace ultra::test
