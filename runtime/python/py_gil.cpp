// Re-taking the GIL at interpreter exit (GilRelease, py_module.hpp). CPython 3.11's
// PyEval_RestoreThread ends any thread but the finalizing one with pthread_exit once finalization
// has begun, even one that was already waiting for the GIL when it began. glibc's pthread_exit is a
// forced unwind (abi::__forced_unwind): it may be caught, but a handler that ends without
// rethrowing aborts the process, so the handler here never ends: the thread is parked until the
// process exits, with every signal blocked so that they go to the threads still running. CPython
// 3.14 parks such threads itself (gh-87135); there PyEval_RestoreThread simply never returns.
#include <pthread.h>
#include <unistd.h>

#include <csignal>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

#include "runtime/python/py_module.hpp"

namespace kvtier::python {
namespace {

[[noreturn]] void park_forever() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) pause();
}

}  // namespace

void restore_gil(PyThreadState* thread) noexcept {
#if defined(__GLIBCXX__)
  try {
    PyEval_RestoreThread(thread);
  } catch (abi::__forced_unwind&) {
    park_forever();
  }
#else
  PyEval_RestoreThread(thread);
#endif
}

}  // namespace kvtier::python
