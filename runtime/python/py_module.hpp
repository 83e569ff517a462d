// The Python module `kvtier` (pybind11 over the C++ Runtime facade): shared pieces.
//
// Errors. A failed Status becomes a C++ StatusError, thrown wherever it happens (also while the GIL
// is released) and translated by py_errors.cpp, with the GIL held, into the kvtier.Error subclass
// of its code. Nothing else from kvtier throws.
//
// GIL. Every call that can wait (on the runtime's loop, on a layer, on shutdown) releases the GIL
// for the wait: py::call_guard<py::gil_scoped_release> where the arguments are plain C++ values
// (pybind11 converts them before the guard releases), a scoped release otherwise. Nothing touches
// a Python object while the GIL is released.
//
// Lifetimes. A Runtime, its Steps and every NumPy array over the HBM arena share one RuntimeState
// (shared_ptr). kvtier::Runtime frees the arena at shutdown, so shutdown is refused with
// BufferError while an array still views it (as mmap.close() is while a buffer is exported); each
// such array holds an HbmLease, counted in `views`. Lock order: `mu` (shared for a call, exclusive
// for shutdown) is only taken with the GIL released or by calls that never wait for it while
// holding anything the shutdown needs, so the GIL and `mu` never deadlock. Step.wait_layer, which
// may block for wait_timeout_ms, holds `mu` only to check the runtime open, not for the wait:
// shutdown would otherwise wait for the very wait its Runtime::shutdown wakes (py_step.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/kvtier.hpp"

namespace kvtier::python {

namespace py = pybind11;

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T value_or_throw(Result<T>&& r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

struct RuntimeState {
  mutable std::shared_mutex mu;  // shared: a call in progress; exclusive: shutdown
  // Raised before shutdown waits for `mu`, so new calls fail at once and a stream of calls on
  // other threads cannot starve it (glibc's rwlock prefers readers).
  std::atomic<bool> closing{false};
  std::unique_ptr<Runtime> runtime;  // set at open, freed only with the state
  bool shut_down = false;            // guarded by mu
  std::atomic<int> views{0};         // NumPy arrays over the HBM arena still alive
};

// Drops a reference to the state; when it is the last one, kvtier::Runtime's destructor shuts the
// runtime down (persisting to NVMe, bounded by shutdown_timeout), so the GIL is released for it.
// Releasing the GIL needs it held: a destructor can also run on an error path inside a call that
// already released it.
inline bool holds_gil() { return Py_IsInitialized() && PyGILState_Check() == 1; }

inline void release_state(std::shared_ptr<RuntimeState>& state) {
  if (state == nullptr) return;
  if (state.use_count() == 1 && holds_gil()) {
    py::gil_scoped_release unlocked;
    state.reset();
    return;
  }
  state.reset();
}

// The Python object kvtier.Runtime.
struct PyRuntime {
  std::shared_ptr<RuntimeState> state;
  PyRuntime() = default;
  PyRuntime(const PyRuntime&) = delete;
  PyRuntime& operator=(const PyRuntime&) = delete;
  ~PyRuntime() { release_state(state); }
};

// The Python object kvtier.Step: one begin_step's StepInfo; aborts the step when dropped unended.
struct PyStep {
  std::shared_ptr<RuntimeState> state;
  StepInfo info;
  std::mutex mu;          // guards finished
  bool finished = false;  // ended or aborted
  PyStep() = default;
  PyStep(const PyStep&) = delete;
  PyStep& operator=(const PyStep&) = delete;
  ~PyStep();
};

// Runtime.begin_step (py_step.cpp).
std::unique_ptr<PyStep> begin_step(PyRuntime& self,
                                   const std::vector<std::pair<SequenceId, uint32_t>>& items);

// Runs fn(Runtime&) with the runtime held open; FailedPreconditionError after shutdown.
// The runtime held shared for one call; FailedPreconditionError once a shutdown has begun.
inline std::shared_lock<std::shared_mutex> lock_open(RuntimeState& state) {
  if (!state.closing.load(std::memory_order_acquire)) {
    std::shared_lock lock(state.mu);
    if (!state.shut_down) return lock;
  }
  throw StatusError(failed_precondition("the runtime was shut down"));
}

template <typename Fn>
auto with_runtime(const std::shared_ptr<RuntimeState>& state, Fn&& fn) {
  auto lock = lock_open(*state);
  return fn(*state->runtime);
}

// Token ids from a 1-D sequence or array of integers in [0, 2^32) (a list, a NumPy array, or
// anything NumPy can read, a CPU torch tensor included); copied, with the GIL held.
std::vector<uint32_t> tokens_from(py::handle tokens);

// Registration, one per source file, in module order.
void register_errors(py::module_& m);
void register_keys(py::module_& m);
void register_runtime(py::module_& m);
void register_step(py::module_& m);

}  // namespace kvtier::python
