// C ABI, part 2: the runtime handle (open, shutdown, destroy), what it describes (geometry, HBM
// view, stats), its block keys, and the cache calls (match, sequences, hints, prefix pins).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier.hpp"
#include "runtime/c_api_handles.hpp"
#include "runtime/c_api_yaml.hpp"
#include "runtime/config_loader.hpp"
#include "runtime/stats_fields.hpp"
#include "runtime/timeouts.hpp"

namespace kvtier::capi {
namespace {

// kvt_runtime_params versions (kvtier.h, convention (6)). The first one (0.1.0) ended with
// persist_on_shutdown; `reserved` fills what was tail padding, so that every appended field changes
// sizeof and struct_size tells the versions apart.
static_assert(offsetof(kvt_runtime_params, persist_on_shutdown) + sizeof(int32_t) ==
              KVT_RUNTIME_PARAMS_MIN_SIZE);
static_assert(offsetof(kvt_runtime_params, reserved) + sizeof(int32_t) ==
              sizeof(kvt_runtime_params));
static_assert(sizeof(kvt_runtime_params) <= KVT_RUNTIME_PARAMS_MAX_SIZE);

// Where each version of the struct ends, oldest first; the last is this library's sizeof. A size
// in between would cut a field in two.
constexpr std::size_t kParamsSizes[] = {KVT_RUNTIME_PARAMS_MIN_SIZE, sizeof(kvt_runtime_params)};

// A struct_size this library can read or fill; `name` is how the message calls it.
Status check_params_size(std::size_t size, std::string_view name) {
  const auto said = [&] { return std::string(name) + " is " + std::to_string(size); };
  if (size < KVT_RUNTIME_PARAMS_MIN_SIZE) {
    return invalid_argument(said() + ", smaller than the first kvt_runtime_params (" +
                            std::to_string(KVT_RUNTIME_PARAMS_MIN_SIZE) +
                            " bytes): initialise params with kvt_runtime_default_params");
  }
  if (size > KVT_RUNTIME_PARAMS_MAX_SIZE) {
    return invalid_argument(said() + ", larger than any kvt_runtime_params (at most " +
                            std::to_string(KVT_RUNTIME_PARAMS_MAX_SIZE) +
                            " bytes): initialise params with kvt_runtime_default_params");
  }
  if (size <= sizeof(kvt_runtime_params) &&
      std::find(std::begin(kParamsSizes), std::end(kParamsSizes), size) == std::end(kParamsSizes)) {
    return invalid_argument(said() + ", which ends inside a field of kvt_runtime_params (kvtier " +
                            std::string(version()) + ")");
  }
  return ok_status();
}

kvt_runtime_params default_params() {
  const RuntimeOptions defaults;
  kvt_runtime_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof(kvt_runtime_params);
  p.use_environment = 1;
  p.call_timeout_ms = defaults.call_timeout.count();
  p.wait_timeout_ms = defaults.wait_timeout.count();
  p.shutdown_timeout_ms = defaults.shutdown_timeout.count();
  p.persist_on_shutdown = defaults.persist_on_shutdown ? 1 : 0;
  p.reserved = 0;
  return p;
}

// The caller's params over the defaults: the fields its struct_size covers (an older, smaller
// struct keeps the defaults for the rest), and a newer, larger struct only while the fields this
// library does not know are all zero (unset), so that no option a caller asked for is dropped.
Result<RuntimeOptions> options_from(const kvt_runtime_params* params, bool* use_environment) {
  kvt_runtime_params p = default_params();
  if (params != nullptr) {
    const std::size_t size = params->struct_size;
    if (size == 0) {
      return invalid_argument(
          "params.struct_size is 0: initialise params with kvt_runtime_default_params");
    }
    KVTIER_RETURN_IF_ERROR(check_params_size(size, "params.struct_size"));
    const auto* bytes = reinterpret_cast<const unsigned char*>(params);
    std::memcpy(&p, bytes, std::min(size, sizeof p));
    for (std::size_t i = sizeof p; i < size; ++i) {
      if (bytes[i] != 0) {
        return invalid_argument(
            "params.struct_size is " + std::to_string(size) + " and byte " + std::to_string(i) +
            " is set: a field of a newer kvt_runtime_params that this library (kvtier " +
            std::string(version()) + ", " + std::to_string(sizeof p) +
            "-byte kvt_runtime_params) does not have; use a newer libkvtier.so or leave it unset");
      }
    }
    if (p.reserved != 0) {
      return invalid_argument("params.reserved is " + std::to_string(p.reserved) +
                              "; it must be 0");
    }
  }
  const struct {
    const char* name;
    int64_t value;
  } timeouts[] = {{"call_timeout_ms", p.call_timeout_ms},
                  {"wait_timeout_ms", p.wait_timeout_ms},
                  {"shutdown_timeout_ms", p.shutdown_timeout_ms}};
  // Any positive value is taken, INT64_MAX too: Runtime::open clamps to kMaxTimeout.
  for (const auto& t : timeouts) {
    KVTIER_RETURN_IF_ERROR(check_timeout_ms(t.value, std::string("params.") + t.name));
  }
  RuntimeOptions o;
  o.call_timeout = std::chrono::milliseconds(p.call_timeout_ms);
  o.wait_timeout = std::chrono::milliseconds(p.wait_timeout_ms);
  o.shutdown_timeout = std::chrono::milliseconds(p.shutdown_timeout_ms);
  o.persist_on_shutdown = p.persist_on_shutdown != 0;
  *use_environment = p.use_environment != 0;
  return o;
}

Result<std::vector<std::string>> copy_overrides(const char* const* overrides, std::size_t n) {
  KVTIER_RETURN_IF_ERROR(require_count(n, "n_overrides"));
  KVTIER_RETURN_IF_ERROR(require_array(overrides, n, "overrides"));
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (overrides[i] == nullptr) {
      return invalid_argument("overrides[" + std::to_string(i) + "] is NULL");
    }
    out.emplace_back(overrides[i]);
  }
  return out;
}

Status open_runtime(const Config& config, const RuntimeOptions& options, kvt_runtime** out) {
  auto opened = Runtime::open(config, options);
  if (!opened.ok()) return std::move(opened).status();
  auto handle = std::make_shared<kvt_runtime>();
  handle->runtime = std::move(opened).value();
  *out = runtimes().add(std::move(handle));
  return ok_status();
}

Status shutdown_locked(kvt_runtime& rt) {
  if (rt.shut_down) return ok_status();
  rt.shut_down = true;
  return rt.runtime->shutdown();
}

void tiers_to_c(const std::array<uint64_t, kNumTiers>& in, uint64_t* out) {
  for (int i = 0; i < kNumTiers; ++i) out[i] = in[i];
}

void tiers_to_c(const std::array<uint32_t, kNumTiers>& in, uint32_t* out) {
  for (int i = 0; i < kNumTiers; ++i) out[i] = in[i];
}

}  // namespace
}  // namespace kvtier::capi

using kvtier::Runtime;
using kvtier::Status;
using kvtier::capi::guarded;
using kvtier::capi::require;
using kvtier::capi::require_array;
using kvtier::capi::require_count;
using kvtier::capi::with_runtime;

extern "C" {

kvt_status kvt_runtime_default_params_sized(kvt_runtime_params* params, size_t struct_size) {
  return guarded("kvt_runtime_default_params_sized", [&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(params, "params"));
    KVTIER_RETURN_IF_ERROR(kvtier::capi::check_params_size(struct_size, "struct_size"));
    kvt_runtime_params defaults = kvtier::capi::default_params();
    defaults.struct_size = static_cast<uint32_t>(struct_size);
    // Only the caller's struct_size bytes: a caller built against an older header has a smaller
    // object; one built against a newer header gets zeros (unset) for the fields past ours.
    auto* bytes = reinterpret_cast<unsigned char*>(params);
    std::memcpy(bytes, &defaults, std::min(struct_size, sizeof defaults));
    if (struct_size > sizeof defaults) {
      std::memset(bytes + sizeof defaults, 0, struct_size - sizeof defaults);
    }
    return kvtier::ok_status();
  });
}

kvt_status kvt_runtime_open_file(const char* yaml_path, const char* const* overrides,
                                 size_t n_overrides, const kvt_runtime_params* params,
                                 kvt_runtime** out) {
  return guarded("kvt_runtime_open_file", [&] {
    KVTIER_RETURN_IF_ERROR(require(yaml_path, "yaml_path"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    bool use_environment = true;
    KVTIER_ASSIGN_OR_RETURN(auto options, kvtier::capi::options_from(params, &use_environment));
    kvtier::ConfigSources sources;
    sources.file = std::string(yaml_path);
    KVTIER_ASSIGN_OR_RETURN(sources.overrides,
                            kvtier::capi::copy_overrides(overrides, n_overrides));
    sources.use_environment = use_environment;
    KVTIER_ASSIGN_OR_RETURN(auto config, kvtier::load_config(sources));
    return kvtier::capi::open_runtime(config, options, out);
  });
}

kvt_status kvt_runtime_open_yaml(const char* yaml_text, const char* const* overrides,
                                 size_t n_overrides, const kvt_runtime_params* params,
                                 kvt_runtime** out) {
  return guarded("kvt_runtime_open_yaml", [&] {
    KVTIER_RETURN_IF_ERROR(require(yaml_text, "yaml_text"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    bool use_environment = true;
    KVTIER_ASSIGN_OR_RETURN(auto options, kvtier::capi::options_from(params, &use_environment));
    KVTIER_ASSIGN_OR_RETURN(auto list, kvtier::capi::copy_overrides(overrides, n_overrides));
    KVTIER_ASSIGN_OR_RETURN(auto config,
                            kvtier::load_yaml_text(yaml_text, std::move(list), use_environment));
    return kvtier::capi::open_runtime(config, options, out);
  });
}

kvt_status kvt_runtime_shutdown(kvt_runtime* runtime) {
  return guarded("kvt_runtime_shutdown", [&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(auto rt, kvtier::capi::runtimes().find(runtime, "runtime"));
    rt->closing.store(true, std::memory_order_release);
    std::unique_lock lock(rt->mu);
    return kvtier::capi::shutdown_locked(*rt);
  });
}

kvt_status kvt_runtime_destroy(kvt_runtime* runtime) {
  if (runtime == nullptr) return KVT_OK;
  return guarded("kvt_runtime_destroy", [&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(auto rt, kvtier::capi::runtimes().take(runtime, "runtime"));
    rt->closing.store(true, std::memory_order_release);
    std::unique_lock lock(rt->mu);
    Status s = kvtier::capi::shutdown_locked(*rt);
    // Steps that still hold the handle see shut_down and never reach the Runtime; a
    // kvt_step_wait_layer woken by the shutdown may still hold it, and frees it on its way out.
    rt->runtime.reset();
    return s;
  });
}

kvt_status kvt_runtime_geometry(const kvt_runtime* runtime, kvt_geometry* out) {
  return guarded("kvt_runtime_geometry", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_runtime(runtime, [&](Runtime& rt) {
      const kvtier::Geometry& g = rt.geometry();
      out->layers = g.layers;
      out->kv_heads = g.kv_heads;
      out->head_dim = g.head_dim;
      out->page_tokens = g.page_tokens;
      out->dtype = static_cast<int32_t>(g.dtype);
      out->dtype_size = static_cast<uint32_t>(kvtier::dtype_size(g.dtype));
      out->token_bytes = g.token_bytes();
      out->page_bytes = g.page_bytes();
      out->block_bytes = g.block_bytes();
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_hbm_view(const kvt_runtime* runtime, kvt_hbm_view* out) {
  return guarded("kvt_runtime_hbm_view", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_runtime(runtime, [&](Runtime& rt) {
      const kvtier::HbmView v = rt.hbm_view();
      out->base = v.base;
      out->frame_stride = v.frame_stride;
      out->page_bytes = v.page_bytes;
      out->frames = v.frames;
      out->on_device = v.on_device ? 1 : 0;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_stats(const kvt_runtime* runtime, kvt_stats* out) {
  return guarded("kvt_runtime_stats", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_runtime(runtime, [&](Runtime& rt) {
      using kvtier::capi::tiers_to_c;
      const kvtier::RuntimeStats s = rt.stats();
      kvt_stats c;
      std::memset(&c, 0, sizeof c);
      c.lookup_tokens = s.lookup_tokens;
      tiers_to_c(s.hit_tokens, c.hit_tokens);
      tiers_to_c(s.used_bytes, c.used_bytes);
      tiers_to_c(s.capacity_bytes, c.capacity_bytes);
      tiers_to_c(s.promotions, c.promotions);
      tiers_to_c(s.demotions, c.demotions);
      tiers_to_c(s.evictions, c.evictions);
      c.recompute_tokens = s.recompute_tokens;
      c.stall_nanos = s.stall_nanos;
      c.late_prefetches = s.late_prefetches;
      c.failed_loads = s.failed_loads;
      c.checksum_failures = s.checksum_failures;
      c.io_errors = s.io_errors;
      c.nvme_recovered_blocks = s.nvme_recovered_blocks;
      c.open_sequences = s.open_sequences;
      c.pinned_prefix_blocks = s.pinned_prefix_blocks;
      *out = c;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_audit(kvt_runtime* runtime) {
  return guarded("kvt_runtime_audit",
                 [&] { return with_runtime(runtime, [](Runtime& rt) { return rt.audit(); }); });
}

kvt_status kvt_runtime_counter(const kvt_runtime* runtime, const char* name,
                               uint64_t out[KVT_NUM_TIERS], int32_t* per_tier) {
  return guarded("kvt_runtime_counter", [&] {
    KVTIER_RETURN_IF_ERROR(require(name, "name"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    const kvtier::StatsField* field = kvtier::find_stats_field(name);
    if (field == nullptr) {
      std::string known;
      for (const kvtier::StatsField& f : kvtier::runtime_stats_fields()) {
        known += (known.empty() ? "" : ", ") + std::string(f.name);
      }
      return kvtier::not_found("no counter is named '" + std::string(name) + "' (there are " +
                               known + ")");
    }
    return with_runtime(runtime, [&](Runtime& rt) {
      const kvtier::RuntimeStats s = rt.stats();
      std::fill_n(out, KVT_NUM_TIERS, uint64_t{0});
      if (field->per_tier != nullptr) {
        kvtier::capi::tiers_to_c(s.*field->per_tier, out);
      } else {
        out[0] = s.*field->scalar;
      }
      if (per_tier != nullptr) *per_tier = field->per_tier != nullptr ? 1 : 0;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_metrics_port(const kvt_runtime* runtime, uint16_t* port) {
  return guarded("kvt_runtime_metrics_port", [&] {
    KVTIER_RETURN_IF_ERROR(require(port, "port"));
    return with_runtime(runtime, [&](Runtime& rt) {
      *port = rt.metrics_port();
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_block_keys(const kvt_runtime* runtime, const uint32_t* tokens,
                                  size_t n_tokens, kvt_block_key* keys, size_t capacity,
                                  size_t* n_keys) {
  return guarded("kvt_runtime_block_keys", [&] {
    KVTIER_RETURN_IF_ERROR(require_count(n_tokens, "n_tokens"));
    KVTIER_RETURN_IF_ERROR(require_array(tokens, n_tokens, "tokens"));
    KVTIER_RETURN_IF_ERROR(require(n_keys, "n_keys"));
    return with_runtime(runtime, [&](Runtime& rt) {
      const auto chain = rt.block_keys(std::span<const uint32_t>(tokens, n_tokens));
      return kvtier::capi::block_keys_to_c(chain, keys, capacity, n_keys);
    });
  });
}

kvt_status kvt_runtime_block_key(const kvt_runtime* runtime, const kvt_block_key* parent,
                                 const uint32_t* block_tokens, size_t n_tokens,
                                 kvt_block_key* out) {
  return guarded("kvt_runtime_block_key", [&] {
    KVTIER_RETURN_IF_ERROR(require(parent, "parent"));
    KVTIER_RETURN_IF_ERROR(require_count(n_tokens, "n_tokens"));
    KVTIER_RETURN_IF_ERROR(require_array(block_tokens, n_tokens, "block_tokens"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_runtime(runtime, [&](Runtime& rt) -> Status {
      KVTIER_ASSIGN_OR_RETURN(auto key,
                              rt.block_key(kvtier::capi::from_c(*parent),
                                           std::span<const uint32_t>(block_tokens, n_tokens)));
      *out = kvtier::capi::to_c(key);
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_namespace_root(const kvt_runtime* runtime, kvt_block_key* out) {
  return guarded("kvt_runtime_namespace_root", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_runtime(runtime, [&](Runtime& rt) {
      *out = kvtier::capi::to_c(rt.namespace_root());
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_runtime_match(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                             kvt_match* out) {
  return guarded("kvt_runtime_match", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    KVTIER_ASSIGN_OR_RETURN(auto list, kvtier::capi::copy_keys(keys, n_keys, "keys", "n_keys"));
    return with_runtime(runtime, [&](Runtime& rt) -> Status {
      KVTIER_ASSIGN_OR_RETURN(auto m, rt.match(list));
      out->blocks = m.blocks;
      kvtier::capi::tiers_to_c(m.by_tier, out->by_tier);
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_sequence_open(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                             kvt_opened_sequence* out) {
  return guarded("kvt_sequence_open", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    KVTIER_ASSIGN_OR_RETURN(auto list, kvtier::capi::copy_keys(keys, n_keys, "keys", "n_keys"));
    return with_runtime(runtime, [&](Runtime& rt) -> Status {
      KVTIER_ASSIGN_OR_RETURN(auto s, rt.open_sequence(list));
      out->id = s.id;
      out->reused_tokens = s.reused_tokens;
      out->prompt_blocks = s.prompt_blocks;
      out->matched_blocks = s.matched_blocks;
      out->reused_blocks = s.reused_blocks;
      out->recompute_blocks = s.recompute_blocks;
      kvtier::capi::tiers_to_c(s.reused_by_tier, out->reused_by_tier);
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_sequence_close(kvt_runtime* runtime, kvt_sequence_id sequence) {
  return guarded("kvt_sequence_close", [&] {
    return with_runtime(runtime, [&](Runtime& rt) { return rt.close_sequence(sequence); });
  });
}

kvt_status kvt_sequence_finish(kvt_runtime* runtime, kvt_sequence_id sequence,
                               uint64_t generated_tokens) {
  return guarded("kvt_sequence_finish", [&] {
    return with_runtime(runtime,
                        [&](Runtime& rt) { return rt.close_sequence(sequence, generated_tokens); });
  });
}

kvt_status kvt_runtime_hint(kvt_runtime* runtime, const kvt_hinted_request* requests,
                            size_t n_requests) {
  return guarded("kvt_runtime_hint", [&] {
    KVTIER_RETURN_IF_ERROR(require_count(n_requests, "n_requests"));
    KVTIER_RETURN_IF_ERROR(require_array(requests, n_requests, "requests"));
    std::vector<kvtier::HintedRequest> waiting(n_requests);
    for (std::size_t i = 0; i < n_requests; ++i) {
      waiting[i].request_id = requests[i].request_id;
      waiting[i].expected_start_ns = requests[i].expected_start_ns;
      const std::string name = "requests[" + std::to_string(i) + "]";
      KVTIER_ASSIGN_OR_RETURN(waiting[i].keys,
                              kvtier::capi::copy_keys(requests[i].keys, requests[i].n_keys,
                                                      name + ".keys", name + ".n_keys"));
    }
    return with_runtime(runtime, [&](Runtime& rt) { return rt.hint(waiting); });
  });
}

kvt_status kvt_prefix_pin(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                          int64_t ttl_ms, kvt_pin_id* out) {
  return guarded("kvt_prefix_pin", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    KVTIER_RETURN_IF_ERROR(kvtier::check_timeout_ms(ttl_ms, "ttl_ms"));
    KVTIER_ASSIGN_OR_RETURN(auto list, kvtier::capi::copy_keys(keys, n_keys, "keys", "n_keys"));
    return with_runtime(runtime, [&](Runtime& rt) -> Status {
      KVTIER_ASSIGN_OR_RETURN(auto pin, rt.pin_prefix(list, std::chrono::milliseconds(ttl_ms)));
      *out = pin;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_prefix_unpin(kvt_runtime* runtime, kvt_pin_id pin) {
  return guarded("kvt_prefix_unpin", [&] {
    return with_runtime(runtime, [&](Runtime& rt) { return rt.unpin_prefix(pin); });
  });
}

}  // extern "C"
