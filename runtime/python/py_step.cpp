// kvtier.Step: one engine step (begin_step's StepInfo) and its per-layer calls, and
// kvtier.LayerTable, a layer's CSR block table: a copy of the runtime's, shown as read-only NumPy
// int32 views (so no write from Python can make frames() read past `indices`, which it checks
// anyway). A Step used as a context manager ends on a normal exit and aborts on an exception; a
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
    std::optional<GilRelease> unlocked;
    if (holds_gil()) unlocked.emplace();
    // Waits out a shutdown that is deciding: one refused (a NumPy view made meanwhile) leaves the
    // runtime open, and skipping the abort then would leave this step's pages pinned. A shutdown
    // that went through aborted every step itself (the gate is shut, nothing is left to unpin).
    std::optional<CallGate::Call> call = state->gate.enter(WithoutGil{});
    if (call) {
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
  LayerTable table;
};

// A read-only array over `v`, which `owner` (the Python LayerTable holding it) keeps alive. NumPy
// refuses to make it writable again: its base exposes no writable buffer.
py::array_t<int32_t> read_only_view(const std::vector<int32_t>& v, py::handle owner) {
  py::array_t<int32_t> out({static_cast<py::ssize_t>(v.size())},
                           {static_cast<py::ssize_t>(sizeof(int32_t))}, v.data(), owner);
  out.attr("setflags")(py::arg("write") = false);
  return out;
}

// Item `item`'s frame indices, checked against the table's sizes rather than trusted.
py::array_t<int32_t> item_frames(const LayerTable& t, py::ssize_t item) {
  const auto batch = static_cast<py::ssize_t>(t.last_page_len.size());
  if (item < 0 || item >= batch) {
    throw StatusError(
        out_of_range("item " + std::to_string(item) + " of a batch of " + std::to_string(batch)));
  }
  const auto where = "layer table item " + std::to_string(item) + ": ";
  if (t.indptr.size() != static_cast<std::size_t>(batch) + 1) {
    throw StatusError(out_of_range(where + "indptr has " + std::to_string(t.indptr.size()) +
                                   " entries for a batch of " + std::to_string(batch)));
  }
  const int64_t begin = t.indptr[item];
  const int64_t end = t.indptr[item + 1];
  if (begin < 0 || end < begin || end > static_cast<int64_t>(t.indices.size())) {
    throw StatusError(out_of_range(where + "indptr names indices[" + std::to_string(begin) + ":" +
                                   std::to_string(end) + "], but the table has " +
                                   std::to_string(t.indices.size()) + " indices"));
  }
  return py::array_t<int32_t>(static_cast<py::ssize_t>(end - begin), t.indices.data() + begin);
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
  GilRelease unlocked;
  with_runtime(step.state,
               [&](Runtime& rt) { throw_if_error(rt.end_step(step.info.id, completions)); });
  mark_finished(step);
}

void abort_step(PyStep& step) {
  GilRelease unlocked;
  with_runtime(step.state, [&](Runtime& rt) { throw_if_error(rt.abort_step(step.info.id)); });
  mark_finished(step);
}

// Checked open at the runtime's gate, then waited for outside it: a deciding shutdown waits for
// the calls inside, and must not wait for the wait that its Runtime::shutdown is about to wake. The
// Runtime outlives the wait: the step holds its RuntimeState, which never drops the Runtime
// before it is freed, and Runtime::wait_layer is safe against a concurrent Runtime::shutdown.
void wait_layer(PyStep& step, uint32_t layer) {
  { auto lock = lock_open(*step.state); }
  Status waited = step.state->runtime->wait_layer(step.info.id, layer);
  if (waited.code() == StatusCode::kCancelled && step.state->gate.shut_down()) {
    throw StatusError(cancelled(waited.message() + " (the runtime is shutting down)"));
  }
  throw_if_error(waited);
}

// What pybind11's casters took as a pair or a list of keys: a sequence, but not a str or bytes.
bool is_sequence(py::handle h) {
  return PySequence_Check(h.ptr()) == 1 && !py::isinstance<py::str>(h) &&
         !py::isinstance<py::bytes>(h);
}

// A sequence is named with its length, which is what is wrong with a pair of 3.
std::string describe(py::handle h) {
  if (!is_sequence(h)) return type_name(h);
  return "a " + type_name(h) + " of " + std::to_string(py::len(h));
}

StepCompletion completion_from(py::handle sequence, py::handle keys, const std::string& where) {
  StepCompletion c;
  try {
    c.sequence = sequence.cast<SequenceId>();
  } catch (const py::cast_error&) {
    throw py::type_error(where + ": the sequence id must be an int in [0, 2^64) (got " +
                         std::string(py::repr(sequence)) + ")");
  }
  if (!is_sequence(keys)) {
    throw py::type_error(where + ": expected a list of kvtier.BlockKey (got " + type_name(keys) +
                         ")");
  }
  std::size_t j = 0;
  for (py::handle key : keys) {
    if (!py::isinstance<BlockKey>(key)) {
      throw py::type_error(where + ": keys[" + std::to_string(j) +
                           "] must be a kvtier.BlockKey (got " + type_name(key) + ")");
    }
    c.full_block_keys.push_back(key.cast<BlockKey>());
    ++j;
  }
  return c;
}

// {sequence: [keys]} or [(sequence, [keys]), ...] -> completions, in the order given; TypeError
// naming the entry for anything else.
std::vector<StepCompletion> completions_from(py::handle arg) {
  std::vector<StepCompletion> out;
  if (arg.is_none()) return out;
  if (py::isinstance<py::dict>(arg)) {
    for (auto [sequence, keys] : py::reinterpret_borrow<py::dict>(arg)) {
      out.push_back(
          completion_from(sequence, keys, "completions[" + std::string(py::repr(sequence)) + "]"));
    }
    return out;
  }
  if (!py::isinstance<py::iterable>(arg) || py::isinstance<py::str>(arg) ||
      py::isinstance<py::bytes>(arg)) {
    throw py::type_error(
        "completions must be a dict {sequence: [keys]} or a list of (sequence, keys) pairs (got " +
        type_name(arg) + ")");
  }
  std::size_t i = 0;
  for (py::handle pair : arg) {
    const std::string where = "completions[" + std::to_string(i++) + "]";
    if (!is_sequence(pair) || py::len(pair) != 2) {
      throw py::type_error(where + ": expected a (sequence, [BlockKey, ...]) pair (got " +
                           describe(pair) + ")");
    }
    const py::sequence p = py::reinterpret_borrow<py::sequence>(pair);
    const py::object sequence = p[0];
    const py::object keys = p[1];
    out.push_back(completion_from(sequence, keys, where));
  }
  return out;
}

}  // namespace

std::unique_ptr<PyStep> begin_step(PyRuntime& self,
                                   const std::vector<std::pair<SequenceId, uint32_t>>& items) {
  std::vector<StepItem> batch;
  batch.reserve(items.size());
  for (const auto& [sequence, new_tokens] : items) batch.push_back(StepItem{sequence, new_tokens});
  // Made first: nothing that can throw comes between the begun step and its owner.
  auto step = std::make_unique<PyStep>();
  step->info =
      with_runtime(self.state, [&](Runtime& rt) { return value_or_throw(rt.begin_step(batch)); });
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
      .def_property_readonly(
          "indptr",
          [](py::handle self) {
            return read_only_view(self.cast<PyLayerTable&>().table.indptr, self);
          },
          "[batch + 1] offsets into indices (read-only).")
      .def_property_readonly(
          "indices",
          [](py::handle self) {
            return read_only_view(self.cast<PyLayerTable&>().table.indices, self);
          },
          "The HBM frame indices of every item, item after item (read-only).")
      .def_property_readonly(
          "last_page_len",
          [](py::handle self) {
            return read_only_view(self.cast<PyLayerTable&>().table.last_page_len, self);
          },
          "[batch] tokens in each item's last page (read-only).")
      .def(
          "frames",
          [](const PyLayerTable& t, py::ssize_t item) { return item_frames(t.table, item); },
          py::arg("item"), "The HBM frame indices of batch item `item` (a copy).");

  const auto release = py::call_guard<GilRelease>();
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
          "after wait_timeout_ms, or sooner when a read from NVMe went unanswered past "
          "tiers.nvme.io_timeout_ms (a hung drive: abort the step and begin it again), the "
          "load's error when a page failed (recompute the layer), CancelledError when the step "
          "is aborted or the runtime shuts down meanwhile.")
      .def(
          "layer_table",
          [](PyStep& s, uint32_t layer) {
            LayerTable t = with_runtime(s.state, [&](Runtime& rt) {
              return value_or_throw(rt.layer_table(s.info.id, layer));
            });
            return PyLayerTable{std::move(t)};
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
          [](PyStep& s, py::handle completions) { end_step(s, completions_from(completions)); },
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
