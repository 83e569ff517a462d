// The C ABI's internals (include/kvtier/kvtier.h): the structs behind the opaque handles, the
// tables of live handles, and the plumbing that turns a Status or an escaping C++ exception into
// a kvt_status plus this thread's kvt_last_error() text.
//
// Handles. A kvt_runtime or kvt_step pointer is an opaque token, never the object's address and
// never dereferenced: it is looked up in its type's table of live handles, which owns the object
// through a shared_ptr; a call copies that shared_ptr and works on the copy. Tokens come from one
// process-wide 64-bit counter, as (0x10000 + n) << 4: never 0, 16-aligned and far above the first
// page, because Go's cgo checks the pointer-typed values it finds on a goroutine stack and throws
// "invalid pointer found on stack" for small ones (1, 2, 3... did). They are never reused, so a
// destroyed handle stays invalid even when the allocator gives its freed object's address to the
// next one (keying by address made a stale kvt_step* act on whichever step lived there next), and a
// token of one type is never live in the other's table. So a NULL, destroyed or foreign pointer is
// an error message, and a destroy racing with a call on another thread frees the object only after
// that call returns. The tables are never destroyed (leaked singletons), so a call made during
// static destruction still finds them.
//
// Shutdown. kvtier::Runtime frees its tiers and scheduler at shutdown, after which some of its
// accessors (hbm_view, stats) would read freed state. Every call therefore holds the runtime's
// `mu` shared and checks `shut_down`; shutdown raises `closing` (new calls fail at once, so they
// cannot starve it) and takes `mu` exclusively, so it waits only for the calls in progress (each
// bounded by call_timeout) and every later call fails cleanly. The one call that blocks longer,
// kvt_step_wait_layer (up to wait_timeout_ms, and only Runtime::shutdown wakes it early), checks
// the runtime open under `mu`, then waits without it, holding the kvtier::Runtime by a shared_ptr
// copy: a shutdown or destroy then never waits for it, and the Runtime it waits in outlives the
// wait even when destroy drops the handle's reference meanwhile (Runtime::wait_layer itself is safe
// against a concurrent Runtime::shutdown, which aborts the step and wakes it).
//
// Lock order: a handle table's mutex is released before anything else is taken; kvt_step::mu
// (layer-table cache) may be held while kvt_runtime::mu is held shared, never the reverse.
//
// Rejected: integer handle types in the header (typed pointers let the compiler catch a step
// passed as a runtime; the tokens are cast to them); a magic number in each struct (a freed struct
// may be reused, and reading it is already undefined behaviour).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier.hpp"

struct kvt_runtime {
  mutable std::shared_mutex mu;  // shared: a call in progress; exclusive: shutdown and destroy
  // Set before shutdown waits for `mu`: new calls fail at once instead of queueing for the shared
  // lock, so a stream of calls on other threads cannot starve the shutdown (glibc's rwlock
  // prefers readers).
  std::atomic<bool> closing{false};
  // Reset by destroy, after shutdown; shared only with kvt_step_wait_layer calls in progress.
  std::shared_ptr<kvtier::Runtime> runtime;
  bool shut_down = false;  // guarded by mu
};

struct kvt_step {
  // How the step left the runtime; kvt_step_layer_table refuses once it did (the runtime forgot
  // the step's tables and its frames are no longer the step's).
  enum class Finished { kNo, kEnded, kAborted };

  std::shared_ptr<kvt_runtime> owner;
  kvtier::StepInfo info;
  std::mutex mu;  // guards tables and finished
  // One per layer, fetched on the first kvt_step_layer_table of that layer: the C caller holds
  // pointers into these vectors until kvt_step_destroy, so they are never replaced.
  std::vector<std::unique_ptr<kvtier::LayerTable>> tables;
  Finished finished = Finished::kNo;
};

namespace kvtier::capi {

// The next handle token, (0x10000 + n) << 4 for n = 0, 1, 2, ...: shared by every table, never
// reused (about 2^60 of them on a 64-bit machine before the value could wrap).
inline std::uintptr_t next_handle_token() {
  static std::atomic<std::uint64_t> next{0};
  const std::uint64_t n = next.fetch_add(1, std::memory_order_relaxed);
  return static_cast<std::uintptr_t>((std::uint64_t{0x10000} + n) << 4);
}

template <typename T>
class HandleTable {
 public:
  explicit HandleTable(std::string_view type_name) : type_name_(type_name) {}

  // The token the caller gets for `handle` (see Handles above).
  T* add(std::shared_ptr<T> handle) {
    T* token = reinterpret_cast<T*>(next_handle_token());
    std::unique_lock lock(mu_);
    live_.emplace(token, std::move(handle));
    return token;
  }

  Result<std::shared_ptr<T>> find(const T* handle, std::string_view argument) const {
    if (handle == nullptr) return null_handle(argument);
    std::shared_lock lock(mu_);
    auto it = live_.find(handle);
    if (it == live_.end()) return stale_handle(handle, argument);
    return it->second;
  }

  // Removes the handle from the table; the object lives on while calls in progress hold it.
  Result<std::shared_ptr<T>> take(const T* handle, std::string_view argument) {
    if (handle == nullptr) return null_handle(argument);
    std::unique_lock lock(mu_);
    auto it = live_.find(handle);
    if (it == live_.end()) return stale_handle(handle, argument);
    std::shared_ptr<T> out = std::move(it->second);
    live_.erase(it);
    return out;
  }

 private:
  Status null_handle(std::string_view argument) const {
    return invalid_argument(std::string(argument) + " is NULL");
  }
  Status stale_handle(const T* handle, std::string_view argument) const;

  std::string_view type_name_;
  mutable std::shared_mutex mu_;
  std::unordered_map<const T*, std::shared_ptr<T>> live_;
};

template <typename T>
Status HandleTable<T>::stale_handle(const T* handle, std::string_view argument) const {
  char address[32];
  std::snprintf(address, sizeof address, "%p", static_cast<const void*>(handle));
  return invalid_argument(std::string(argument) + " (" + address + ") is not a live " +
                          std::string(type_name_) + " handle: it was destroyed, or never was one");
}

HandleTable<kvt_runtime>& runtimes();
HandleTable<kvt_step>& steps();

// Records "<function>: <code name>: <message>" as this thread's last error; returns `code`.
kvt_status record_error(const char* function, kvt_status code, std::string_view message) noexcept;
kvt_status to_c_status(StatusCode code) noexcept;

// Runs `fn` (returning Status) and converts its outcome; nothing escapes.
template <typename Fn>
kvt_status guarded(const char* function, Fn&& fn) noexcept {
  try {
    Status s = fn();
    if (s.ok()) return KVT_OK;
    return record_error(function, to_c_status(s.code()), s.message());
  } catch (const std::bad_alloc&) {
    return record_error(function, KVT_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return record_error(function, KVT_INTERNAL, e.what());
  } catch (...) {
    return record_error(function, KVT_INTERNAL, "an unknown C++ exception");
  }
}

inline Status require(const void* pointer, std::string_view argument) {
  if (pointer == nullptr) return invalid_argument(std::string(argument) + " is NULL");
  return ok_status();
}

// An element count the ABI takes (kvtier.h, convention (3)): at most UINT32_MAX, which also keeps
// the vectors copied from it far from std::vector's max_size (std::length_error) and the 32-bit
// counts reported back (kvt_step_info.batch) exact. `name` is the count's own name (n_keys).
inline Status require_count(std::size_t count, std::string_view name) {
  if (count > std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument(std::string(name) + " is " + std::to_string(count) +
                            ", more than the largest count taken (UINT32_MAX, 4294967295)");
  }
  return ok_status();
}

// A (pointer, count) array: NULL is allowed only with a count of 0.
inline Status require_array(const void* pointer, std::size_t count, std::string_view argument) {
  if (pointer == nullptr && count > 0) {
    return invalid_argument(std::string(argument) + " is NULL but its count is " +
                            std::to_string(count));
  }
  return ok_status();
}

inline BlockKey from_c(const kvt_block_key& k) { return BlockKey{k.lo, k.hi}; }
inline kvt_block_key to_c(const BlockKey& k) { return kvt_block_key{k.lo, k.hi}; }

// The keys of a (keys, n) array; `count_name` names n in messages (n_keys, requests[2].n_keys).
Result<std::vector<BlockKey>> copy_keys(const kvt_block_key* keys, std::size_t n,
                                        std::string_view argument, std::string_view count_name);

// Writes `keys` to (out, capacity); *n_keys is their number even when the buffer is too short.
Status block_keys_to_c(const std::vector<BlockKey>& keys, kvt_block_key* out, std::size_t capacity,
                       std::size_t* n_keys);

// The runtime held shared for one call; kFailedPrecondition once a shutdown has begun.
inline Result<std::shared_lock<std::shared_mutex>> lock_open(const kvt_runtime& rt,
                                                             std::string_view what = "runtime") {
  const auto closed = [&] {
    return failed_precondition("the " + std::string(what) + " was shut down");
  };
  if (rt.closing.load(std::memory_order_acquire)) return closed();
  std::shared_lock lock(rt.mu);
  if (rt.shut_down) return closed();
  return lock;
}

// Runs `fn(Runtime&)` with the runtime held shared and open; kFailedPrecondition after shutdown.
template <typename Fn>
Status with_runtime(const kvt_runtime* handle, Fn&& fn) {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<kvt_runtime> rt, runtimes().find(handle, "runtime"));
  auto lock = lock_open(*rt);
  if (!lock.ok()) return std::move(lock).status();
  return fn(*rt->runtime);
}

}  // namespace kvtier::capi
