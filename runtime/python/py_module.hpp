// The Python module `kvtier` (pybind11 over the C++ Runtime facade): shared pieces.
//
// Errors. A failed Status becomes a C++ StatusError, thrown wherever it happens (also while the GIL
// is released) and translated by py_errors.cpp, with the GIL held, into the kvtier.Error subclass
// of its code. Nothing else from kvtier throws.
//
// GIL. Every call that can wait (on the runtime's loop, on a layer, on shutdown) releases the GIL
// for the wait: py::call_guard<GilRelease> where the arguments are plain C++ values (pybind11
// converts them before the guard releases), a scoped GilRelease otherwise. Nothing touches a Python
// object while the GIL is released. GilRelease, not py::gil_scoped_release: at exit CPython 3.11
// ends a daemon thread that re-takes the GIL with pthread_exit, whose forced unwind aborts the
// process (std::terminate) at the first noexcept frame, pybind11's ~gil_scoped_release among
// them (pybind11 #2215). GilRelease parks such a thread for good where the unwind starts, as
// CPython 3.14 itself does (gh-87135) and PyO3 does; see restore_gil. Every lock a call takes is
// released before the GIL is re-taken, so a parked thread holds none.
//
// Lifetimes. A Runtime, its Steps and every NumPy array over the HBM arena share one RuntimeState
// (shared_ptr). kvtier::Runtime frees the arena at shutdown, so shutdown is refused with
// BufferError while an array still views it (as mmap.close() is while a buffer is exported); each
// such array holds an HbmLease, counted in `views`. Calls and shutdown meet at a CallGate
// (call_gate.hpp): a call is admitted shared, a shutdown decides exclusively, and a call arriving
// while one decides waits for the decision, so a refused shutdown fails no call. Nothing waits at
// the gate with the GIL held (lock_open), so the GIL and the gate never deadlock and a deciding
// shutdown never stalls the Python threads. Step.wait_layer, which may block for
// wait_timeout_ms, passes the gate only to check the runtime open, not for the wait: shutdown
// would otherwise wait for the very wait its Runtime::shutdown wakes (py_step.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/kvtier.hpp"
#include "runtime/python/call_gate.hpp"

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
  CallGate gate;                     // admits calls; shut once a shutdown went through
  std::unique_ptr<Runtime> runtime;  // set at open, freed only with the state
  std::atomic<int> views{0};         // NumPy arrays over the HBM arena still alive
};

// Drops a reference to the state; when it is the last one, kvtier::Runtime's destructor shuts the
// runtime down (persisting to NVMe, bounded by shutdown_timeout), so the GIL is released for it.
// Releasing the GIL needs it held: a destructor can also run on an error path inside a call that
// already released it.
inline bool holds_gil() { return Py_IsInitialized() && PyGILState_Check() == 1; }

// Re-takes the GIL given up by PyEval_SaveThread (py_gil.cpp). Where the interpreter is
// finalizing, CPython 3.11 answers with pthread_exit instead; its forced unwind is stopped here and
// the thread parked until the process exits, never unwound: the unwind would run C++ cleanups that
// drop Python references without the GIL (pybind11's argument holders), and end in std::terminate
// wherever the re-take runs in a noexcept frame (any destructor, ~PyStep's among them) or during
// an exception's unwinding. Rejected: a noexcept(false) destructor that lets the unwind pass
// (still fatal in those frames), and not re-taking the GIL once _Py_IsFinalizing() (racy: the
// flag is raised while the thread already waits inside PyEval_RestoreThread; returning to Python
// without the GIL is worse).
void restore_gil(PyThreadState* thread) noexcept;

// Releases the GIL for its scope; the GIL must be held. See restore_gil.
class GilRelease {
 public:
  GilRelease() : thread_(PyEval_SaveThread()) {}
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;
  ~GilRelease() { restore_gil(thread_); }

 private:
  PyThreadState* thread_;
};

inline void release_state(std::shared_ptr<RuntimeState>& state) {
  if (state == nullptr) return;
  if (state.use_count() == 1 && holds_gil()) {
    GilRelease unlocked;
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

// The CallGate's wait_with for every Python call: runs a wait without the GIL when this thread
// holds it. The lock the wait takes is let go inside it, before the GIL is re-taken.
struct WithoutGil {
  template <typename Fn>
  void operator()(Fn&& wait) const {
    if (!holds_gil()) {
      wait();
      return;
    }
    GilRelease unlocked;
    wait();
  }
};

// The runtime held open for one call; FailedPreconditionError once a shutdown went through. A
// call that arrives while a shutdown decides waits for the decision without the GIL.
inline CallGate::Call lock_open(RuntimeState& state) {
  std::optional<CallGate::Call> call = state.gate.enter(WithoutGil{});
  if (!call) throw StatusError(failed_precondition("the runtime was shut down"));
  return std::move(*call);
}

// Runs fn(Runtime&) with the runtime held open (lock_open).
template <typename Fn>
auto with_runtime(const std::shared_ptr<RuntimeState>& state, Fn&& fn) {
  auto lock = lock_open(*state);
  return fn(*state->runtime);
}

// The name of h's type, for messages ("NoneType", "str").
inline std::string type_name(py::handle h) {
  return py::str(py::type::handle_of(h).attr("__name__"));
}

// Token ids from a 1-D sequence or array of integers in [0, 2^32) (a list, a tuple, a NumPy array,
// or anything NumPy can read, a CPU torch tensor included); copied, with the GIL held. TypeError
// for what is not a sequence of integers, InvalidArgumentError for an id out of range, naming it.
std::vector<uint32_t> tokens_from(py::handle tokens);

// Registration, one per source file, in module order.
void register_errors(py::module_& m);
void register_keys(py::module_& m);
void register_runtime(py::module_& m);
void register_step(py::module_& m);

}  // namespace kvtier::python
