// kvtier.Runtime: opening, describing and shutting down a runtime, its cache calls, and the HBM
// arena as NumPy arrays without copies. See py_module.hpp for errors, the GIL and lifetimes.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kvtier/kvtier.hpp"
#include "runtime/c_api_yaml.hpp"
#include "runtime/config_loader.hpp"
#include "runtime/python/py_module.hpp"
#include "runtime/stats_fields.hpp"
#include "runtime/timeouts.hpp"

namespace kvtier::python {
namespace {

// Keeps the runtime (and so its HBM arena) alive under a NumPy array; counted so that shutdown
// refuses while one exists.
struct HbmLease {
  std::shared_ptr<RuntimeState> state;
  explicit HbmLease(std::shared_ptr<RuntimeState> s) : state(std::move(s)) {}
  HbmLease(const HbmLease&) = delete;
  HbmLease& operator=(const HbmLease&) = delete;
  ~HbmLease() {
    state->views.fetch_sub(1, std::memory_order_acq_rel);
    release_state(state);
  }
};

RuntimeOptions make_options(int64_t call_timeout_ms, int64_t wait_timeout_ms,
                            int64_t shutdown_timeout_ms, bool persist_on_shutdown) {
  const std::pair<const char*, int64_t> timeouts[] = {{"call_timeout_ms", call_timeout_ms},
                                                      {"wait_timeout_ms", wait_timeout_ms},
                                                      {"shutdown_timeout_ms", shutdown_timeout_ms}};
  // Any positive value is taken, 2**63 - 1 too: Runtime::open clamps to kMaxTimeout.
  for (const auto& [name, value] : timeouts) {
    throw_if_error(check_timeout_ms(value, name));
  }
  RuntimeOptions o;
  o.call_timeout = std::chrono::milliseconds(call_timeout_ms);
  o.wait_timeout = std::chrono::milliseconds(wait_timeout_ms);
  o.shutdown_timeout = std::chrono::milliseconds(shutdown_timeout_ms);
  o.persist_on_shutdown = persist_on_shutdown;
  return o;
}

std::unique_ptr<PyRuntime> open_config(const Config& config, const RuntimeOptions& options) {
  auto state = std::make_shared<RuntimeState>();
  state->runtime = value_or_throw(Runtime::open(config, options));
  auto out = std::make_unique<PyRuntime>();
  out->state = std::move(state);
  return out;
}

py::dict per_tier(const std::array<uint64_t, kNumTiers>& values) {
  py::dict d;
  for (Tier t : kAllTiers) d[py::str(std::string(tier_name(t)))] = values[tier_index(t)];
  return d;
}

py::dict per_tier(const std::array<uint32_t, kNumTiers>& values) {
  py::dict d;
  for (Tier t : kAllTiers) d[py::str(std::string(tier_name(t)))] = values[tier_index(t)];
  return d;
}

py::dict stats_dict(const RuntimeStats& s) {
  py::dict d;
  for (const StatsField& f : runtime_stats_fields()) {
    const py::str name{std::string(f.name)};
    if (f.per_tier != nullptr) {
      d[name] = per_tier(s.*f.per_tier);
    } else {
      d[name] = s.*f.scalar;
    }
  }
  return d;
}

// NumPy has no bfloat16 or float8: those frames are exposed as their raw bits (uint16, uint8);
// `.view(ml_dtypes.bfloat16)` reinterprets them without a copy where ml_dtypes is installed.
py::dtype element_dtype(Dtype d) {
  switch (d) {
    case Dtype::kF32: return py::dtype("float32");
    case Dtype::kF16: return py::dtype("float16");
    case Dtype::kBF16: return py::dtype("uint16");
    case Dtype::kFP8E4M3: return py::dtype("uint8");
  }
  return py::dtype("uint8");
}

std::string hex_pointer(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

py::array hbm_frames(PyRuntime& self, bool raw) {
  const std::shared_ptr<RuntimeState>& state = self.state;
  HbmView view;
  Geometry g;
  std::unique_ptr<HbmLease> lease_ptr;
  {
    auto lock = lock_open(*state);
    view = state->runtime->hbm_view();
    g = state->runtime->geometry();
    if (view.on_device) {
      throw StatusError(unavailable(
          "the HBM arena is CUDA device memory (base " + hex_pointer(view.base) +
          "): NumPy cannot map it; hbm_view().base is its device pointer for a CUDA library"));
    }
    if (view.base == nullptr || view.frames == 0) {
      throw StatusError(unavailable("the runtime has no HBM frames"));
    }
    lease_ptr = std::make_unique<HbmLease>(state);
    state->views.fetch_add(1, std::memory_order_acq_rel);  // the lease's destructor gives it back
  }
  py::object lease = py::cast(std::move(lease_ptr));
  const auto frames = static_cast<py::ssize_t>(view.frames);
  const auto stride = static_cast<py::ssize_t>(view.frame_stride);
  if (raw) {
    return py::array(py::dtype("uint8"), {frames, static_cast<py::ssize_t>(view.page_bytes)},
                     {stride, py::ssize_t{1}}, view.base, lease);
  }
  const auto es = static_cast<py::ssize_t>(dtype_size(g.dtype));
  const auto head_dim = static_cast<py::ssize_t>(g.head_dim);
  const auto heads = static_cast<py::ssize_t>(g.kv_heads);
  const auto tokens = static_cast<py::ssize_t>(g.page_tokens);
  return py::array(
      element_dtype(g.dtype), {frames, py::ssize_t{2}, tokens, heads, head_dim},
      {stride, tokens * heads * head_dim * es, heads * head_dim * es, head_dim * es, es}, view.base,
      lease);
}

void shutdown(PyRuntime& self) {
  const std::shared_ptr<RuntimeState>& state = self.state;
  const auto refuse_while_viewed = [&] {
    const int views = state->views.load(std::memory_order_acquire);
    if (views > 0) {
      throw py::buffer_error(
          "cannot shut down: " + std::to_string(views) +
          " NumPy array(s) from hbm_frames() still view the HBM arena, which shutdown frees; "
          "release them (del) first");
    }
  };
  Status s;
  {
    GilRelease unlocked;
    // Arrays are only made inside a call: checked before deciding (the usual refusal leaves the
    // gate untouched) and again once every call in progress has left (one made meanwhile: the
    // refusal lets the calls that waited go ahead).
    refuse_while_viewed();
    CallGate::Closing closing(state->gate);
    if (closing.already_shut()) return;
    refuse_while_viewed();
    closing.commit();
    s = state->runtime->shutdown();
  }
  throw_if_error(s);
}

}  // namespace

void register_runtime(py::module_& m) {
  py::class_<HbmLease>(m, "_HbmLease", "Keeps the HBM arena mapped under a NumPy array.");

  py::class_<Geometry>(m, "Geometry", "The model's KV shape.")
      .def_readonly("layers", &Geometry::layers)
      .def_readonly("kv_heads", &Geometry::kv_heads)
      .def_readonly("head_dim", &Geometry::head_dim)
      .def_readonly("page_tokens", &Geometry::page_tokens)
      .def_property_readonly("dtype",
                             [](const Geometry& g) { return std::string(dtype_name(g.dtype)); })
      .def_property_readonly("dtype_size", [](const Geometry& g) { return dtype_size(g.dtype); })
      .def_property_readonly("token_bytes", &Geometry::token_bytes)
      .def_property_readonly("page_bytes", &Geometry::page_bytes)
      .def_property_readonly("block_bytes", &Geometry::block_bytes)
      .def("__repr__", [](const Geometry& g) {
        return "kvtier.Geometry(layers=" + std::to_string(g.layers) +
               ", kv_heads=" + std::to_string(g.kv_heads) +
               ", head_dim=" + std::to_string(g.head_dim) + ", dtype='" +
               std::string(dtype_name(g.dtype)) +
               "', page_tokens=" + std::to_string(g.page_tokens) + ")";
      });

  py::class_<HbmView>(m, "HbmView",
                      "Where the HBM frames are: frame f starts at base + f * frame_stride. "
                      "`base` is an address (an int); a CUDA device pointer when on_device.")
      .def_property_readonly("base",
                             [](const HbmView& v) { return reinterpret_cast<uintptr_t>(v.base); })
      .def_readonly("frame_stride", &HbmView::frame_stride)
      .def_readonly("page_bytes", &HbmView::page_bytes)
      .def_readonly("frames", &HbmView::frames)
      .def_readonly("on_device", &HbmView::on_device);

  py::class_<MatchResult>(m, "MatchResult", "The cached prefix of a key chain, per tier.")
      .def_readonly("blocks", &MatchResult::blocks)
      .def_property_readonly("by_tier", [](const MatchResult& r) { return per_tier(r.by_tier); })
      .def("__repr__", [](const MatchResult& r) {
        return "kvtier.MatchResult(blocks=" + std::to_string(r.blocks) +
               ", by_tier=" + std::string(py::repr(per_tier(r.by_tier))) + ")";
      });

  py::class_<OpenedSequence>(m, "OpenedSequence", "A sequence just opened over a prompt's keys.")
      .def_readonly("id", &OpenedSequence::id)
      .def_readonly("prompt_blocks", &OpenedSequence::prompt_blocks)
      .def_readonly("matched_blocks", &OpenedSequence::matched_blocks)
      .def_readonly("reused_blocks", &OpenedSequence::reused_blocks)
      .def_readonly("reused_tokens", &OpenedSequence::reused_tokens)
      .def_readonly("recompute_blocks", &OpenedSequence::recompute_blocks)
      .def_property_readonly("reused_by_tier",
                             [](const OpenedSequence& s) { return per_tier(s.reused_by_tier); })
      .def("__repr__", [](const OpenedSequence& s) {
        return "kvtier.OpenedSequence(id=" + std::to_string(s.id) +
               ", reused_blocks=" + std::to_string(s.reused_blocks) +
               ", reused_tokens=" + std::to_string(s.reused_tokens) + ")";
      });

  const auto release = py::call_guard<GilRelease>();
  py::class_<PyRuntime>(m, "Runtime",
                        "A kvtier runtime: the tiers, the page table and the scheduler. Open it "
                        "with Runtime.open_yaml or Runtime.open_file; use it as a context manager "
                        "or call shutdown().")
      .def_static(
          "open_yaml",
          [](const std::string& text, const std::vector<std::string>& overrides,
             bool use_environment, int64_t call_timeout_ms, int64_t wait_timeout_ms,
             int64_t shutdown_timeout_ms, bool persist_on_shutdown) {
            const RuntimeOptions options = make_options(call_timeout_ms, wait_timeout_ms,
                                                        shutdown_timeout_ms, persist_on_shutdown);
            const Config config = value_or_throw(load_yaml_text(text, overrides, use_environment));
            return open_config(config, options);
          },
          release, py::arg("text") = "", py::arg("overrides") = std::vector<std::string>{},
          py::kw_only(), py::arg("use_environment") = true, py::arg("call_timeout_ms") = 5000,
          py::arg("wait_timeout_ms") = 30000, py::arg("shutdown_timeout_ms") = 60000,
          py::arg("persist_on_shutdown") = true,
          "Opens a runtime from YAML text over the embedded default, then the KVTIER_* "
          "environment (unless use_environment=False), then `overrides` ('key.path=value').")
      .def_static(
          "open_file",
          [](const std::string& path, const std::vector<std::string>& overrides,
             bool use_environment, int64_t call_timeout_ms, int64_t wait_timeout_ms,
             int64_t shutdown_timeout_ms, bool persist_on_shutdown) {
            const RuntimeOptions options = make_options(call_timeout_ms, wait_timeout_ms,
                                                        shutdown_timeout_ms, persist_on_shutdown);
            ConfigSources sources;
            sources.file = path;
            sources.overrides = overrides;
            sources.use_environment = use_environment;
            return open_config(value_or_throw(load_config(sources)), options);
          },
          release, py::arg("path"), py::arg("overrides") = std::vector<std::string>{},
          py::kw_only(), py::arg("use_environment") = true, py::arg("call_timeout_ms") = 5000,
          py::arg("wait_timeout_ms") = 30000, py::arg("shutdown_timeout_ms") = 60000,
          py::arg("persist_on_shutdown") = true, "Opens a runtime from a YAML file.")
      .def(
          "__enter__", [](PyRuntime& self) -> PyRuntime& { return self; },
          py::return_value_policy::reference)
      .def("__exit__",
           [](PyRuntime& self, py::handle type, py::handle, py::handle) {
             if (type.is_none()) {
               shutdown(self);
               return;
             }
             // Leaving on an exception whose traceback may still hold arrays over the arena: the
             // runtime then shuts down when its last reference goes, not here.
             try {
               shutdown(self);
             } catch (const py::buffer_error&) {
             }
           })
      .def("shutdown", &shutdown,
           "Finishes or cancels transfers, persists cached blocks to NVMe and stops the runtime. "
           "Idempotent. BufferError while arrays from hbm_frames() are alive.")
      .def_property_readonly("closed", [](PyRuntime& self) { return self.state->gate.shut_down(); })
      .def_property_readonly("geometry",
                             [](PyRuntime& self) {
                               return with_runtime(self.state,
                                                   [](Runtime& rt) { return rt.geometry(); });
                             })
      .def_property_readonly("key_namespace",
                             [](PyRuntime& self) {
                               return with_runtime(self.state, [](Runtime& rt) {
                                 const ModelConfig& model = rt.config().model;
                                 return model.key_namespace.empty() ? model.name
                                                                    : model.key_namespace;
                               });
                             })
      .def_property_readonly("namespace_root",
                             [](PyRuntime& self) {
                               return with_runtime(self.state,
                                                   [](Runtime& rt) { return rt.namespace_root(); });
                             })
      .def_property_readonly("metrics_port",
                             [](PyRuntime& self) {
                               return with_runtime(self.state,
                                                   [](Runtime& rt) { return rt.metrics_port(); });
                             })
      .def(
          "block_keys",
          [](PyRuntime& self, py::handle tokens) {
            const std::vector<uint32_t> t = tokens_from(tokens);
            return with_runtime(self.state, [&](Runtime& rt) { return rt.block_keys(t); });
          },
          py::arg("tokens"), "Keys of every full block of `tokens` in this runtime's namespace.")
      .def(
          "block_key",
          [](PyRuntime& self, const BlockKey& parent, py::handle tokens) {
            const std::vector<uint32_t> t = tokens_from(tokens);
            return with_runtime(
                self.state, [&](Runtime& rt) { return value_or_throw(rt.block_key(parent, t)); });
          },
          py::arg("parent"), py::arg("block_tokens"),
          "The key of one full block after `parent` (a key, or namespace_root).")
      .def(
          "match",
          [](PyRuntime& self, const std::vector<BlockKey>& keys) {
            return with_runtime(self.state,
                                [&](Runtime& rt) { return value_or_throw(rt.match(keys)); });
          },
          release, py::arg("keys"), "The cached prefix of `keys`, per tier (no references).")
      .def(
          "open_sequence",
          [](PyRuntime& self, const std::vector<BlockKey>& keys) {
            return with_runtime(
                self.state, [&](Runtime& rt) { return value_or_throw(rt.open_sequence(keys)); });
          },
          release, py::arg("keys"),
          "Opens a sequence over a prompt's keys, reusing and loading its cached prefix.")
      .def(
          "close_sequence",
          [](PyRuntime& self, SequenceId sequence, std::optional<uint64_t> generated_tokens) {
            with_runtime(self.state, [&](Runtime& rt) {
              throw_if_error(rt.close_sequence(sequence, generated_tokens));
            });
          },
          release, py::arg("sequence"), py::arg("generated_tokens") = py::none(),
          "Releases the sequence. generated_tokens: how many tokens the request generated after "
          "its prompt, when known (the lookahead policy learns which prompts come back).")
      .def(
          "hint",
          [](PyRuntime& self,
             const std::vector<std::tuple<uint64_t, int64_t, std::vector<BlockKey>>>& waiting) {
            std::vector<HintedRequest> requests;
            requests.reserve(waiting.size());
            for (const auto& [id, start, keys] : waiting) {
              requests.push_back(HintedRequest{id, start, keys});
            }
            with_runtime(self.state, [&](Runtime& rt) { throw_if_error(rt.hint(requests)); });
          },
          release, py::arg("waiting"),
          "The requests waiting in the engine's queue, as (request_id, expected_start_ns, keys), "
          "in the order they will start; replaces the previous hint, so hint the whole queue "
          "whenever it changes. Start times are on kvtier.now_ns()'s clock.")
      .def(
          "pin_prefix",
          [](PyRuntime& self, const std::vector<BlockKey>& keys, int64_t ttl_ms) {
            throw_if_error(check_timeout_ms(ttl_ms, "ttl_ms"));
            return with_runtime(self.state, [&](Runtime& rt) {
              return value_or_throw(rt.pin_prefix(keys, std::chrono::milliseconds(ttl_ms)));
            });
          },
          release, py::arg("keys"), py::arg("ttl_ms"),
          "Keeps the cached blocks of `keys` in HBM until unpin_prefix or the TTL; returns the "
          "pin's id.")
      .def(
          "unpin_prefix",
          [](PyRuntime& self, PrefixPinId pin) {
            with_runtime(self.state, [&](Runtime& rt) { throw_if_error(rt.unpin_prefix(pin)); });
          },
          release, py::arg("pin"))
      .def("begin_step", &begin_step, release, py::arg("items"),
           "Begins a step over [(sequence, new_tokens), ...]: pins what the batch reads and "
           "writes and schedules the loads still needed. Returns a Step.")
      .def(
          "hbm_view",
          [](PyRuntime& self) {
            return with_runtime(self.state, [](Runtime& rt) { return rt.hbm_view(); });
          },
          "Where the HBM frames are (an address and a stride).")
      .def("hbm_frames", &hbm_frames, py::arg("raw") = false,
           "The HBM arena as a writable NumPy array without a copy: shape (frames, 2, "
           "page_tokens, kv_heads, head_dim) (K then V), dtype float32/float16, or the raw bits "
           "of bf16 (uint16) and fp8 (uint8); raw=True gives uint8 (frames, page_bytes). The "
           "array keeps the runtime alive, and shutdown() refuses (BufferError) while it lives. "
           "UnavailableError when the arena is CUDA device memory.")
      .def(
          "stats",
          [](PyRuntime& self) {
            RuntimeStats s;
            {
              GilRelease unlocked;
              s = with_runtime(self.state, [](Runtime& rt) { return rt.stats(); });
            }
            return stats_dict(s);
          },
          "A snapshot of the runtime's counters; per-tier values are dicts keyed by tier name.")
      .def(
          "audit",
          [](PyRuntime& self) {
            with_runtime(self.state, [](Runtime& rt) { throw_if_error(rt.audit()); });
          },
          release,
          "Checks kvtier's own invariants (frames, counts, each tier's eviction policy); raises "
          "InternalError naming the first broken one. Walks the whole page table: for tests.");
}

}  // namespace kvtier::python
