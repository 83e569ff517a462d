// C ABI, part 1: version, errors, logging, the clock and block keys, which need no runtime; and
// the handle tables and error plumbing the other parts share (runtime/c_api_handles.hpp).
#include <chrono>
#include <cstring>
#include <string>

#include "kvtier/block_key.hpp"
#include "kvtier/kvtier.h"
#include "kvtier/log.hpp"
#include "kvtier/version.hpp"
#include "runtime/c_api_handles.hpp"

namespace kvtier::capi {
namespace {

// The codes are each other's negatives; the C enum must follow StatusCode if it ever grows.
static_assert(KVT_INVALID_ARGUMENT == -static_cast<int>(StatusCode::kInvalidArgument));
static_assert(KVT_NOT_FOUND == -static_cast<int>(StatusCode::kNotFound));
static_assert(KVT_ALREADY_EXISTS == -static_cast<int>(StatusCode::kAlreadyExists));
static_assert(KVT_FAILED_PRECONDITION == -static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(KVT_RESOURCE_EXHAUSTED == -static_cast<int>(StatusCode::kResourceExhausted));
static_assert(KVT_OUT_OF_RANGE == -static_cast<int>(StatusCode::kOutOfRange));
static_assert(KVT_IO_ERROR == -static_cast<int>(StatusCode::kIoError));
static_assert(KVT_DATA_LOSS == -static_cast<int>(StatusCode::kDataLoss));
static_assert(KVT_DEADLINE_EXCEEDED == -static_cast<int>(StatusCode::kDeadlineExceeded));
static_assert(KVT_CANCELLED == -static_cast<int>(StatusCode::kCancelled));
static_assert(KVT_UNAVAILABLE == -static_cast<int>(StatusCode::kUnavailable));
static_assert(KVT_INTERNAL == -static_cast<int>(StatusCode::kInternal));
static_assert(KVT_NUM_TIERS == kNumTiers);
static_assert(KVT_TIER_HBM == tier_index(Tier::kHbm) && KVT_TIER_HOST == tier_index(Tier::kHost) &&
              KVT_TIER_NVME == tier_index(Tier::kNvme));
static_assert(KVT_DTYPE_F32 == static_cast<int>(Dtype::kF32) &&
              KVT_DTYPE_F16 == static_cast<int>(Dtype::kF16) &&
              KVT_DTYPE_BF16 == static_cast<int>(Dtype::kBF16) &&
              KVT_DTYPE_FP8_E4M3 == static_cast<int>(Dtype::kFP8E4M3));
static_assert(sizeof(kvt_block_key) == sizeof(BlockKey) && sizeof(kvt_block_key) == 16);

thread_local std::string tls_error_text;
thread_local const char* tls_error = "";

}  // namespace

HandleTable<kvt_runtime>& runtimes() {
  static auto* table = new HandleTable<kvt_runtime>("kvt_runtime");
  return *table;
}

HandleTable<kvt_step>& steps() {
  static auto* table = new HandleTable<kvt_step>("kvt_step");
  return *table;
}

kvt_status to_c_status(StatusCode code) noexcept {
  const int c = static_cast<int>(code);
  if (c < 0 || c > static_cast<int>(StatusCode::kInternal)) return KVT_INTERNAL;
  return static_cast<kvt_status>(-c);
}

kvt_status record_error(const char* function, kvt_status code, std::string_view message) noexcept {
  try {
    tls_error_text.assign(function);
    tls_error_text += ": ";
    tls_error_text += kvt_status_name(code);
    tls_error_text += ": ";
    tls_error_text += message;
    tls_error = tls_error_text.c_str();
  } catch (...) {
    tls_error = "out of memory while formatting an error message";
  }
  return code;
}

Result<std::vector<BlockKey>> copy_keys(const kvt_block_key* keys, std::size_t n,
                                        std::string_view argument, std::string_view count_name) {
  KVTIER_RETURN_IF_ERROR(require_count(n, count_name));
  KVTIER_RETURN_IF_ERROR(require_array(keys, n, argument));
  std::vector<BlockKey> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = from_c(keys[i]);
  return out;
}

namespace {

// Copies `keys` out, or says how many there are when the buffer is short.
Status emit_keys(const std::vector<BlockKey>& keys, kvt_block_key* out, std::size_t capacity,
                 std::size_t* n_keys) {
  *n_keys = keys.size();
  if (keys.size() > capacity) {
    return out_of_range("the key buffer holds " + std::to_string(capacity) + " keys, " +
                        std::to_string(keys.size()) + " are needed (*n_keys says so)");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = to_c(keys[i]);
  return ok_status();
}

}  // namespace

Status block_keys_to_c(const std::vector<BlockKey>& keys, kvt_block_key* out, std::size_t capacity,
                       std::size_t* n_keys) {
  KVTIER_RETURN_IF_ERROR(require_array(out, capacity, "keys"));
  return emit_keys(keys, out, capacity, n_keys);
}

}  // namespace kvtier::capi

using kvtier::capi::guarded;
using kvtier::capi::require;
using kvtier::capi::require_array;
using kvtier::capi::require_count;

extern "C" {

const char* kvt_version(void) { return kvtier::version().data(); }

int kvt_version_number(void) { return KVT_VERSION_NUMBER; }

const char* kvt_last_error(void) { return kvtier::capi::tls_error; }

const char* kvt_status_name(kvt_status status) {
  const int c = static_cast<int>(status);
  if (c > 0 || c < KVT_INTERNAL) return "unknown";
  return kvtier::status_code_name(static_cast<kvtier::StatusCode>(-c)).data();
}

void kvt_set_log_callback(kvt_log_fn fn, void* user) {
  try {
    if (fn == nullptr) {
      kvtier::set_log_sink({});
      return;
    }
    kvtier::set_log_sink([fn, user](kvtier::LogLevel level, std::string_view message) {
      const std::string text(message);
      fn(static_cast<int32_t>(level), text.c_str(), user);
    });
  } catch (...) {
    // Out of memory while replacing the sink: the previous sink stays, which is still correct.
  }
}

kvt_status kvt_set_log_level(int32_t level) {
  return guarded("kvt_set_log_level", [&] {
    if (level < 0 || level > 3) {
      return kvtier::invalid_argument("level " + std::to_string(level) +
                                      " is not 0 (debug), 1 (info), 2 (warn) or 3 (error)");
    }
    kvtier::set_log_level(static_cast<kvtier::LogLevel>(level));
    return kvtier::ok_status();
  });
}

int64_t kvt_clock_now_ns(void) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

kvt_status kvt_chain_block_keys(const char* key_namespace, const uint32_t* tokens, size_t n_tokens,
                                uint32_t block_tokens, kvt_block_key* keys, size_t capacity,
                                size_t* n_keys) {
  return guarded("kvt_chain_block_keys", [&] {
    KVTIER_RETURN_IF_ERROR(require(key_namespace, "key_namespace"));
    KVTIER_RETURN_IF_ERROR(require_count(n_tokens, "n_tokens"));
    KVTIER_RETURN_IF_ERROR(require_array(tokens, n_tokens, "tokens"));
    KVTIER_RETURN_IF_ERROR(require(n_keys, "n_keys"));
    if (block_tokens == 0) return kvtier::invalid_argument("block_tokens is 0");
    const auto chain = kvtier::chain_block_keys(
        key_namespace, std::span<const uint32_t>(tokens, n_tokens), block_tokens);
    return kvtier::capi::block_keys_to_c(chain, keys, capacity, n_keys);
  });
}

kvt_status kvt_block_key_format(const kvt_block_key* key, char* buf, size_t buf_size) {
  return guarded("kvt_block_key_format", [&] {
    KVTIER_RETURN_IF_ERROR(require(key, "key"));
    // (NULL, 0) is an empty buffer (convention (3)): too small, like any other short one.
    KVTIER_RETURN_IF_ERROR(require_array(buf, buf_size, "buf"));
    const std::string text = kvtier::to_string(kvtier::capi::from_c(*key));
    if (buf_size < text.size() + 1) {
      return kvtier::out_of_range("buf_size is " + std::to_string(buf_size) + "; a key needs " +
                                  std::to_string(text.size() + 1) + " bytes with its NUL");
    }
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return kvtier::ok_status();
  });
}

}  // extern "C"
