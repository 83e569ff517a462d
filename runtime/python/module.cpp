// `import kvtier`: the Python face of the kvtier runtime (see py_module.hpp for the conventions).
// NumPy is imported on first use (tokens, frames, layer tables); torch never is: a CPU tensor given
// as tokens is read through NumPy's array protocol.
#include <chrono>
#include <string>

#include "kvtier/version.hpp"
#include "runtime/python/py_module.hpp"

PYBIND11_MODULE(kvtier, m) {
  namespace py = pybind11;
  using namespace kvtier::python;
  m.doc() =
      "kvtier: a tiered KV-cache runtime (GPU HBM, pinned host RAM, NVMe) for LLM serving. "
      "Open a Runtime from YAML, compute block keys, open sequences over them, and run steps "
      "whose block tables name HBM frames, which hbm_frames() exposes as a NumPy array.";
  m.attr("__version__") = std::string(kvtier::version());
  m.attr("TIERS") = py::make_tuple("hbm", "host", "nvme");
  m.def(
      "version", [] { return std::string(kvtier::version()); },
      "The version of the loaded library (MAJOR.MINOR.PATCH).");
  m.def(
      "now_ns",
      [] {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
      },
      "Now on the runtime's clock (CLOCK_MONOTONIC) in nanoseconds: the base of hint times.");
  register_errors(m);
  register_keys(m);
  register_runtime(m);
  register_step(m);
}
