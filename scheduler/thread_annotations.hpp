// Clang thread-safety annotations and the annotated mutex the scheduler's shared state uses.
//
// With clang and -Wthread-safety, a member declared KVTIER_GUARDED_BY(mu) that is touched without
// `mu` held, or a KVTIER_REQUIRES(mu) function called without it, is a compile-time warning. Other
// compilers see empty macros. `Mutex` is std::mutex with the capability attribute (std::mutex
// itself carries none in libstdc++); `MutexLock` is its scoped holder.
//
// Rejected: annotating std::mutex through a wrapper typedef (attributes do not attach to aliases),
// and a spin lock (shard critical sections are short, but a spinning waiter that preempts the
// holder on a 2-core machine burns its whole slice; futex-backed std::mutex parks it instead).
#pragma once

#include <mutex>

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION_(x)
#endif

#define KVTIER_CAPABILITY(x) KVTIER_THREAD_ANNOTATION_(capability(x))
#define KVTIER_SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION_(scoped_lockable)
#define KVTIER_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(guarded_by(x))
#define KVTIER_PT_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(pt_guarded_by(x))
#define KVTIER_REQUIRES(...) KVTIER_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE(...) KVTIER_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define KVTIER_RELEASE(...) KVTIER_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define KVTIER_EXCLUDES(...) KVTIER_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define KVTIER_NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace kvtier {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void unlock() KVTIER_RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class KVTIER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) KVTIER_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() KVTIER_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace kvtier
