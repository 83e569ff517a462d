// kvtier.Step: one engine step (begin_step's StepInfo) and its per-layer calls, and
// kvtier.LayerTable, a layer's CSR block table as NumPy int32 arrays (small copies, owned by
// Python). A Step used as a context manager ends on a normal exit and aborts on an exception; a
// Step dropped while still open is aborted, so its pages never stay pinned.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/kvtier.hpp"
#include "kvtier/log.hpp"
#include "runtime/python/py_module.hpp"

namespace kvtier::python {

PyStep::~PyStep() {
  if (state == nullptr) return;
  bool open = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    open = !finished;
  }
  if (open) {
    // Dropped by the garbage collector with the GIL held; the abort waits on the loop.
    std::optional<py::gil_scoped_release> unlocked;
    if (holds_gil()) unlocked.emplace();
    const bool open_runtime =
        !state->closing.load(std::memory_order_acquire);  // else nothing is left to unpin
    std::shared_lock runtime_lock(state->mu, std::defer_lock);
    if (open_runtime) runtime_lock.lock();
    if (open_runtime && !state->shut_down) {
      Status s = state->runtime->abort_step(info.id);
      if (!s.ok() && s.code() != StatusCode::kNotFound) {
        log(LogLevel::kWarn,
            "aborting step " + std::to_string(info.id) + " dropped while open: " + s.to_string());
      }
    }
  }
  release_state(state);
}

namespace {

struct PyLayerTable {
  py::array_t<int32_t> indptr;
  py::array_t<int32_t> indices;
  py::array_t<int32_t> last_page_len;
};

py::array_t<int32_t> to_numpy(const std::vector<int32_t>& v) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

void mark_finished(PyStep& step) {
  std::lock_guard<std::mutex> lock(step.mu);
  step.finished = true;
}

bool is_finished(PyStep& step) {
  std::lock_guard<std::mutex> lock(step.mu);
  return step.finished;
}

void end_step(PyStep& step, std::vector<StepCompletion> completions) {
  py::gil_scoped_release unlocked;
  with_runtime(step.state,
               [&](Runtime& rt) { throw_if_error(rt.end_step(step.info.id, completions)); });
  mark_finished(step);
}

void abort_step(PyStep& step) {
  py::gil_scoped_release unlocked;
  with_runtime(step.state, [&](Runtime& rt) { throw_if_error(rt.abort_step(step.info.id)); });
  mark_finished(step);
}

// Checked open under the runtime's lock, then waited for without it: shutdown takes that lock
// exclusively, and must not wait for the wait that its Runtime::shutdown is about to wake. The
// Runtime outlives the wait: the step holds its RuntimeState, which never drops the Runtime
// before it is freed, and Runtime::wait_layer is safe against a concurrent Runtime::shutdown.
void wait_layer(PyStep& step, uint32_t layer) {
  { auto lock = lock_open(*step.state); }
  Status waited = step.state->runtime->wait_layer(step.info.id, layer);
  if (waited.code() == StatusCode::kCancelled &&
      step.state->closing.load(std::memory_order_acquire)) {
    throw StatusError(cancelled(waited.message() + " (the runtime is shutting down)"));
  }
  throw_if_error(waited);
}

// {sequence: [keys]} or [(sequence, [keys]), ...] -> completions, in the order given.
std::vector<StepCompletion> completions_from(py::handle arg) {
  std::vector<StepCompletion> out;
  if (arg.is_none()) return out;
  py::iterable pairs = py::isinstance<py::dict>(arg)
                           ? py::iterable(py::reinterpret_borrow<py::dict>(arg).attr("items")())
                           : py::reinterpret_borrow<py::iterable>(arg);
  for (py::handle pair : pairs) {
    auto [sequence, keys] = pair.cast<std::pair<SequenceId, std::vector<BlockKey>>>();
    out.push_back(StepCompletion{sequence, std::move(keys)});
  }
  return out;
}

}  // namespace

std::unique_ptr<PyStep> begin_step(PyRuntime& self,
                                   const std::vector<std::pair<SequenceId, uint32_t>>& items) {
  std::vector<StepItem> batch;
  batch.reserve(items.size());
  for (const auto& [sequence, new_tokens] : items) batch.push_back(StepItem{sequence, new_tokens});
  StepInfo info =
      with_runtime(self.state, [&](Runtime& rt) { return value_or_throw(rt.begin_step(batch)); });
  auto step = std::make_unique<PyStep>();
  step->info = std::move(info);
  step->state = self.state;
  return step;
}

void register_step(py::module_& m) {
  py::class_<StepItemInfo>(m, "StepItemInfo", "One batch item of a step, in request order.")
      .def_readonly("sequence", &StepItemInfo::sequence)
      .def_readonly("context_tokens", &StepItemInfo::context_tokens,
                    "Tokens with K/V before this step; the engine writes from here.")
      .def_readonly("new_tokens", &StepItemInfo::new_tokens)
      .def_readonly("recomputed_tokens", &StepItemInfo::recomputed_tokens)
      .def_readonly("pages", &StepItemInfo::pages)
      .def("__repr__", [](const StepItemInfo& i) {
        return "kvtier.StepItemInfo(sequence=" + std::to_string(i.sequence) +
               ", context_tokens=" + std::to_string(i.context_tokens) +
               ", new_tokens=" + std::to_string(i.new_tokens) +
               ", pages=" + std::to_string(i.pages) + ")";
      });

  py::class_<PyLayerTable>(m, "LayerTable",
                           "A layer's block table, CSR: item i's HBM frames are "
                           "indices[indptr[i]:indptr[i+1]], the last holding last_page_len[i] "
                           "tokens.")
      .def_readonly("indptr", &PyLayerTable::indptr)
      .def_readonly("indices", &PyLayerTable::indices)
      .def_readonly("last_page_len", &PyLayerTable::last_page_len)
      .def(
          "frames",
          [](const PyLayerTable& t, py::ssize_t item) {
            const py::ssize_t batch = t.last_page_len.size();
            if (item < 0 || item >= batch) {
              throw StatusError(out_of_range("item " + std::to_string(item) + " of a batch of " +
                                             std::to_string(batch)));
            }
            const int32_t* p = t.indptr.data();
            return py::array_t<int32_t>(p[item + 1] - p[item], t.indices.data() + p[item]);
          },
          py::arg("item"), "The HBM frame indices of batch item `item` (a copy).");

  const auto release = py::call_guard<py::gil_scoped_release>();
  py::class_<PyStep>(m, "Step",
                     "One step of the engine: wait_layer(l), layer_table(l), write K/V and run "
                     "attention, end_layer(l) for each layer, then end() (or abort()).")
      .def_property_readonly("id", [](const PyStep& s) { return s.info.id; })
      .def_property_readonly("layers", [](const PyStep& s) { return s.info.layers; })
      .def_property_readonly("window", [](const PyStep& s) { return s.info.window; })
      .def_property_readonly("windowed", [](const PyStep& s) { return s.info.windowed; })
      .def_property_readonly("items", [](const PyStep& s) { return s.info.items; })
      .def_property_readonly("finished", [](PyStep& s) { return is_finished(s); })
      .def(
          "wait_layer", [](PyStep& s, uint32_t layer) { wait_layer(s, layer); }, release,
          py::arg("layer"),
          "Blocks (without the GIL) until the layer's pages are in HBM; DeadlineExceededError "
          "after wait_timeout_ms, the load's error when a page failed (recompute the layer), "
          "CancelledError when the step is aborted or the runtime shuts down meanwhile.")
      .def(
          "layer_table",
          [](PyStep& s, uint32_t layer) {
            const LayerTable t = with_runtime(s.state, [&](Runtime& rt) {
              return value_or_throw(rt.layer_table(s.info.id, layer));
            });
            return PyLayerTable{to_numpy(t.indptr), to_numpy(t.indices), to_numpy(t.last_page_len)};
          },
          py::arg("layer"), "The layer's block table (FailedPreconditionError before wait_layer).")
      .def(
          "end_layer",
          [](PyStep& s, uint32_t layer) {
            with_runtime(s.state,
                         [&](Runtime& rt) { throw_if_error(rt.end_layer(s.info.id, layer)); });
          },
          release, py::arg("layer"), "The engine has read and written `layer`.")
      .def(
          "end",
          [](PyStep& s, py::object completions) { end_step(s, completions_from(completions)); },
          py::arg("completions") = py::none(),
          "Ends the step: unpins, completes what was written, publishes full blocks. "
          "`completions` ({sequence: [keys]}) names the blocks this step filled, in order "
          "from the block holding its first token (prompt blocks must match their keys).")
      .def("abort", &abort_step, "Unpins and forgets what this step would have written.")
      .def(
          "__enter__", [](PyStep& s) -> PyStep& { return s; }, py::return_value_policy::reference)
      .def("__exit__", [](PyStep& s, py::handle type, py::handle, py::handle) {
        if (is_finished(s)) return;
        if (type.is_none()) {
          end_step(s, {});
          return;
        }
        try {
          abort_step(s);
        } catch (const StatusError&) {
          // The exception that left the block says more than a failed abort would.
        }
      });
}

}  // namespace kvtier::python
