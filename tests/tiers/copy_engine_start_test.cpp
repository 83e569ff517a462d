// The copy engines when a worker thread cannot be created (pthread_create: EAGAIN, e.g. at the
// RLIMIT_NPROC or cgroup pids limit): a kResourceExhausted Status, never an exception escaping
// the factory or std::terminate from a started thread left joinable.
//
// The seam is this executable's own pthread_create, which the dynamic linker prefers over libc's
// for std::thread too; it fails the nth call from when it is armed and forwards the rest. Its own
// executable, so no other test runs with it.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/copy_engine.hpp"

namespace {
std::atomic<int> fail_nth_thread{0};  // the nth pthread_create from now fails; 0 = none
}  // namespace

extern "C" int pthread_create(pthread_t* __restrict thread, const pthread_attr_t* __restrict attr,
                              void* (*start)(void*), void* __restrict arg) noexcept {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  int n = fail_nth_thread.load();
  while (n > 0 && !fail_nth_thread.compare_exchange_weak(n, n - 1)) {
  }
  if (n == 1) return EAGAIN;
  return real(thread, attr, start, arg);
}

namespace kvtier {
namespace {

void expect_host_engine_refused(int nth) {
  fail_nth_thread = nth;
  auto e = make_host_copy_engine(HostCopyOptions{}, nullptr);
  fail_nth_thread = 0;
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("worker thread"), std::string::npos) << e.status().message();
  // Threads can be had again: the engine starts and works.
  auto again = make_host_copy_engine(HostCopyOptions{}, nullptr);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
}

TEST(CopyEngineStart, HostEngineReportsItsFirstThreadRefused) { expect_host_engine_refused(1); }

// The first worker is running when the second cannot start: it must be stopped and joined.
TEST(CopyEngineStart, HostEngineReportsItsSecondThreadRefused) { expect_host_engine_refused(2); }

TEST(CopyEngineStart, CudaEngineReportsAThreadItCannotStart) {
  auto device = std::make_shared<testing::FakeDevice>();
  // The fake's two streams take the first two threads; then issuer and completer per direction.
  for (int nth = 3; nth <= 6; ++nth) {
    fail_nth_thread = nth;
    auto e = make_cuda_copy_engine(device, nullptr);
    fail_nth_thread = 0;
    ASSERT_FALSE(e.ok()) << nth;
    EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted) << nth;
    EXPECT_NE(e.status().message().find("thread"), std::string::npos) << e.status().message();
  }
  auto e = make_cuda_copy_engine(device, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
}

}  // namespace
}  // namespace kvtier
