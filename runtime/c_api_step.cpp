// C ABI, part 3: the step handle. It owns the StepInfo kvtier::Runtime::begin_step returned and
// a copy of each layer's block table, so the arrays a C caller reads stay put until
// kvt_step_destroy (also after the step ended, though kvt_step_layer_table then refuses to hand
// out more); every call also goes through the runtime handle that made the step, and so
// fails cleanly once that runtime is shut down or destroyed.
#include <memory>
#include <string>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier.hpp"
#include "runtime/c_api_handles.hpp"

namespace kvtier::capi {
namespace {

// Runs `fn(Runtime&, kvt_step&)` with the step's runtime held shared and open.
template <typename Fn>
Status with_step(const kvt_step* handle, Fn&& fn) {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<kvt_step> step, steps().find(handle, "step"));
  kvt_runtime& owner = *step->owner;
  auto lock = lock_open(owner, "runtime of step " + std::to_string(step->info.id));
  if (!lock.ok()) return std::move(lock).status();
  return fn(*owner.runtime, *step);
}

Status check_layer(const kvt_step& step, uint32_t layer, std::string_view call) {
  if (layer >= step.info.layers) {
    return out_of_range(std::string(call) + ": layer " + std::to_string(layer) + " of step " +
                        std::to_string(step.info.id) + ", which has " +
                        std::to_string(step.info.layers) + " layers");
  }
  return ok_status();
}

}  // namespace
}  // namespace kvtier::capi

using kvtier::Runtime;
using kvtier::Status;
using kvtier::capi::guarded;
using kvtier::capi::require;
using kvtier::capi::require_array;
using kvtier::capi::require_count;
using kvtier::capi::with_step;

extern "C" {

kvt_status kvt_step_begin(kvt_runtime* runtime, const kvt_step_item* items, size_t n_items,
                          kvt_step** out) {
  return guarded("kvt_step_begin", [&]() -> Status {
    // kvt_step_info.batch is 32-bit: a larger batch is refused here, not truncated there.
    KVTIER_RETURN_IF_ERROR(require_count(n_items, "n_items"));
    KVTIER_RETURN_IF_ERROR(require_array(items, n_items, "items"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    std::vector<kvtier::StepItem> batch(n_items);
    for (std::size_t i = 0; i < n_items; ++i) {
      batch[i] = kvtier::StepItem{items[i].sequence, items[i].new_tokens};
    }
    KVTIER_ASSIGN_OR_RETURN(auto owner, kvtier::capi::runtimes().find(runtime, "runtime"));
    auto lock = kvtier::capi::lock_open(*owner);
    if (!lock.ok()) return std::move(lock).status();
    KVTIER_ASSIGN_OR_RETURN(kvtier::StepInfo info, owner->runtime->begin_step(batch));
    const kvtier::StepId id = info.id;
    // From here the step is pinned in the runtime: if the handle cannot be made, abort it.
    try {
      auto step = std::make_shared<kvt_step>();
      step->tables.resize(info.layers);
      step->info = std::move(info);
      step->owner = owner;
      *out = kvtier::capi::steps().add(std::move(step));
    } catch (...) {
      owner->runtime->abort_step(id).ignore();
      throw;
    }
    return kvtier::ok_status();
  });
}

kvt_status kvt_step_get_info(const kvt_step* step, kvt_step_info* out) {
  return guarded("kvt_step_get_info", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_step(step, [&](Runtime&, kvt_step& s) {
      out->id = s.info.id;
      out->layers = s.info.layers;
      out->window = s.info.window;
      out->windowed = s.info.windowed ? 1 : 0;
      out->batch = static_cast<uint32_t>(s.info.items.size());  // <= n_items <= UINT32_MAX
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_step_get_item(const kvt_step* step, size_t index, kvt_step_item_info* out) {
  return guarded("kvt_step_get_item", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_step(step, [&](Runtime&, kvt_step& s) {
      if (index >= s.info.items.size()) {
        return kvtier::out_of_range("item " + std::to_string(index) + " of step " +
                                    std::to_string(s.info.id) + ", whose batch has " +
                                    std::to_string(s.info.items.size()) + " items");
      }
      const kvtier::StepItemInfo& item = s.info.items[index];
      out->sequence = item.sequence;
      out->context_tokens = item.context_tokens;
      out->new_tokens = item.new_tokens;
      out->recomputed_tokens = item.recomputed_tokens;
      out->pages = item.pages;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_step_wait_layer(kvt_step* step, uint32_t layer) {
  return guarded("kvt_step_wait_layer", [&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(auto s, kvtier::capi::steps().find(step, "step"));
    // Checked open under the handle's lock, then waited for without it (see Shutdown in
    // c_api_handles.hpp): a shutdown must not wait for the wait it is about to wake.
    std::shared_ptr<Runtime> rt;
    {
      auto lock =
          kvtier::capi::lock_open(*s->owner, "runtime of step " + std::to_string(s->info.id));
      if (!lock.ok()) return std::move(lock).status();
      rt = s->owner->runtime;
    }
    Status waited = rt->wait_layer(s->info.id, layer);
    if (waited.code() == kvtier::StatusCode::kCancelled &&
        s->owner->closing.load(std::memory_order_acquire)) {
      return kvtier::cancelled(waited.message() + " (the runtime is shutting down)");
    }
    return waited;
  });
}

kvt_status kvt_step_layer_table(kvt_step* step, uint32_t layer, kvt_layer_table* out) {
  return guarded("kvt_step_layer_table", [&] {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return with_step(step, [&](Runtime& rt, kvt_step& s) -> Status {
      KVTIER_RETURN_IF_ERROR(kvtier::capi::check_layer(s, layer, "layer_table"));
      std::lock_guard<std::mutex> lock(s.mu);
      // Runtime::layer_table refuses a step that is no longer open, so a table cached before the
      // end is not handed out after it either (its arrays stay readable, as documented). A layer
      // ended with kvt_step_end_layer is still served: Runtime::layer_table serves it too.
      if (s.finished != kvt_step::Finished::kNo) {
        return kvtier::failed_precondition(
            "layer_table: step " + std::to_string(s.info.id) + " was already " +
            (s.finished == kvt_step::Finished::kEnded ? "ended" : "aborted") +
            "; its tables are only for the layers of an open step");
      }
      auto& slot = s.tables[layer];
      if (slot == nullptr) {
        KVTIER_ASSIGN_OR_RETURN(kvtier::LayerTable table, rt.layer_table(s.info.id, layer));
        slot = std::make_unique<kvtier::LayerTable>(std::move(table));
      }
      out->batch = static_cast<uint32_t>(slot->last_page_len.size());
      out->n_indices = static_cast<uint32_t>(slot->indices.size());
      out->indptr = slot->indptr.data();
      out->indices = slot->indices.data();
      out->last_page_len = slot->last_page_len.data();
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_step_end_layer(kvt_step* step, uint32_t layer) {
  return guarded("kvt_step_end_layer", [&] {
    return with_step(step,
                     [&](Runtime& rt, kvt_step& s) { return rt.end_layer(s.info.id, layer); });
  });
}

kvt_status kvt_step_end(kvt_step* step, const kvt_step_completion* completions,
                        size_t n_completions) {
  return guarded("kvt_step_end", [&] {
    KVTIER_RETURN_IF_ERROR(require_count(n_completions, "n_completions"));
    KVTIER_RETURN_IF_ERROR(require_array(completions, n_completions, "completions"));
    std::vector<kvtier::StepCompletion> list(n_completions);
    for (std::size_t i = 0; i < n_completions; ++i) {
      list[i].sequence = completions[i].sequence;
      const std::string name = "completions[" + std::to_string(i) + "]";
      KVTIER_ASSIGN_OR_RETURN(
          list[i].full_block_keys,
          kvtier::capi::copy_keys(completions[i].full_block_keys, completions[i].n_keys,
                                  name + ".full_block_keys", name + ".n_keys"));
    }
    return with_step(step, [&](Runtime& rt, kvt_step& s) -> Status {
      KVTIER_RETURN_IF_ERROR(rt.end_step(s.info.id, list));
      std::lock_guard<std::mutex> lock(s.mu);
      s.finished = kvt_step::Finished::kEnded;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_step_abort(kvt_step* step) {
  return guarded("kvt_step_abort", [&] {
    return with_step(step, [&](Runtime& rt, kvt_step& s) -> Status {
      KVTIER_RETURN_IF_ERROR(rt.abort_step(s.info.id));
      std::lock_guard<std::mutex> lock(s.mu);
      s.finished = kvt_step::Finished::kAborted;
      return kvtier::ok_status();
    });
  });
}

kvt_status kvt_step_destroy(kvt_step* step) {
  if (step == nullptr) return KVT_OK;
  return guarded("kvt_step_destroy", [&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(auto s, kvtier::capi::steps().take(step, "step"));
    kvt_runtime& owner = *s->owner;
    bool finished = false;
    {
      std::lock_guard<std::mutex> step_lock(s->mu);
      finished = s->finished != kvt_step::Finished::kNo;
    }
    // A step left open would keep its pages pinned until the runtime shuts down; once the
    // runtime is shutting down there is nothing left to unpin.
    auto lock = kvtier::capi::lock_open(owner);
    if (!finished && lock.ok()) {
      Status aborted = owner.runtime->abort_step(s->info.id);
      // kNotFound: the step already ended through a call that failed after ending it.
      if (!aborted.ok() && aborted.code() != kvtier::StatusCode::kNotFound) return aborted;
    }
    return kvtier::ok_status();
  });
}

}  // extern "C"
