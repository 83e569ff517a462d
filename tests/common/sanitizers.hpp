// Whether this test runs under a sanitizer that maps its shadow memory in the process's address
// space (ASan, TSan). An address-space limit (RLIMIT_AS) small enough to reach an out-of-memory
// path leaves no room for that shadow, and such a sanitizer reports an allocation failure as a
// fatal error instead of throwing std::bad_alloc: tests of those paths run without a sanitizer.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVTIER_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVTIER_TEST_SANITIZED 1
#endif
#endif

namespace kvtier::testing {

#ifdef KVTIER_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace kvtier::testing
