// kvtier error model: Status and Result<T>.
//
// Every fallible call in kvtier returns a [[nodiscard]] Status (no value) or Result<T> (a value or
// the Status that explains why there is none). No exception crosses a module boundary; a type whose
// construction can fail offers `static Result<std::unique_ptr<T>> create(...)`.
//
// A Status is a code plus a message that names the thing that was wrong: the YAML key path with
// file:line:col, the file with its offset and errno, the block key and tier. `with_context`
// prepends what the caller knows ("while opening tier nvme: ...") without losing the code.
//
// Checked statuses: when built with KVTIER_ASSERT_STATUS_CHECKED (sanitizer and debug presets), an
// error Status whose result nobody looked at (ok(), code(), message(), ignore()) aborts in its
// destructor and names the code, so a dropped error is found in tests rather than in production.
// Copying marks the source checked and leaves the copy unchecked; moving hands the obligation to
// the target. OK statuses (default-constructed) carry no obligation: a dropped OK loses nothing,
// and holders that start OK and are overwritten later (results, members) stay simple. Release
// builds carry no flag and no cost.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // bad input: a config key, a size, an API argument
  kNotFound = 2,            // a key, handle, file or page that does not exist
  kAlreadyExists = 3,       // a key or handle that already exists
  kFailedPrecondition = 4,  // an illegal transition (pin an absent page, free a pinned one)
  kResourceExhausted = 5,   // no free frame, extent, queue slot or memory
  kOutOfRange = 6,          // an index or count past its bound
  kIoError = 7,             // a failed system call or device I/O (message has file, offset, errno)
  kDataLoss = 8,            // a checksum or header that does not match: the data is dropped
  kDeadlineExceeded = 9,    // a wait that ran past its deadline
  kCancelled = 10,          // an operation cancelled by shutdown or by its owner
  kUnavailable = 11,        // not here (no GPU, io_uring refused) or no longer (a step's HBM room)
  kInternal = 12,           // a broken invariant inside kvtier: a bug, reported instead of crashing
};

// Stable lower-case name of a code ("invalid_argument"), used in messages, the C ABI and metrics.
constexpr std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kAlreadyExists: return "already_exists";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kOutOfRange: return "out_of_range";
    case StatusCode::kIoError: return "io_error";
    case StatusCode::kDataLoss: return "data_loss";
    case StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
    if (code_ != StatusCode::kOk) reset_checked();
  }

  Status(const Status& other) : code_(other.code_), message_(other.message_) {
    other.mark_checked();
    if (code_ != StatusCode::kOk) reset_checked();
  }
  Status& operator=(const Status& other) {
    if (this != &other) {
      check_before_overwrite();
      code_ = other.code_;
      message_ = other.message_;
      other.mark_checked();
      if (code_ == StatusCode::kOk) {
        mark_checked();
      } else {
        reset_checked();
      }
    }
    return *this;
  }
  Status(Status&& other) noexcept : code_(other.code_), message_(std::move(other.message_)) {
    take_obligation(other);
  }
  Status& operator=(Status&& other) noexcept {
    if (this != &other) {
      check_before_overwrite();
      code_ = other.code_;
      message_ = std::move(other.message_);
      take_obligation(other);
    }
    return *this;
  }
  ~Status() { check_on_destroy(); }

  static Status ok_status() { return Status(); }

  bool ok() const {
    mark_checked();
    return code_ == StatusCode::kOk;
  }
  StatusCode code() const {
    mark_checked();
    return code_;
  }
  const std::string& message() const {
    mark_checked();
    return message_;
  }
  // Marks the status as deliberately dropped (best-effort paths such as destructors).
  void ignore() const { mark_checked(); }

  // "io_error: open /x/y: No such file or directory (errno 2)"
  std::string to_string() const {
    mark_checked();
    if (code_ == StatusCode::kOk) return "ok";
    std::string out(status_code_name(code_));
    out += ": ";
    out += message_;
    return out;
  }

  // Same code, message prefixed with `context + ": "`. OK stays OK.
  Status with_context(std::string_view context) const& {
    mark_checked();
    if (code_ == StatusCode::kOk) return Status();
    std::string msg(context);
    msg += ": ";
    msg += message_;
    return Status(code_, std::move(msg));
  }

 private:
#ifdef KVTIER_ASSERT_STATUS_CHECKED
  void mark_checked() const { checked_ = true; }
  void reset_checked() { checked_ = false; }
  void take_obligation(const Status& other) {
    checked_ = other.checked_;
    other.checked_ = true;
  }
  void check_before_overwrite() const { check_on_destroy(); }
  void check_on_destroy() const {
    if (!checked_) {
      std::fprintf(stderr, "kvtier: a Status (%s: %s) was destroyed without being checked\n",
                   std::string(status_code_name(code_)).c_str(), message_.c_str());
      std::abort();
    }
  }
  mutable bool checked_ = true;  // set false by the error constructor
#else
  void mark_checked() const {}
  void reset_checked() {}
  void take_obligation(const Status&) {}
  void check_before_overwrite() const {}
  void check_on_destroy() const {}
#endif

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status not_found(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
inline Status already_exists(std::string msg) {
  return Status(StatusCode::kAlreadyExists, std::move(msg));
}
inline Status failed_precondition(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status resource_exhausted(std::string msg) {
  return Status(StatusCode::kResourceExhausted, std::move(msg));
}
inline Status out_of_range(std::string msg) {
  return Status(StatusCode::kOutOfRange, std::move(msg));
}
inline Status io_error(std::string msg) { return Status(StatusCode::kIoError, std::move(msg)); }
inline Status data_loss(std::string msg) { return Status(StatusCode::kDataLoss, std::move(msg)); }
inline Status deadline_exceeded(std::string msg) {
  return Status(StatusCode::kDeadlineExceeded, std::move(msg));
}
inline Status cancelled(std::string msg) { return Status(StatusCode::kCancelled, std::move(msg)); }
inline Status unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status internal_error(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// A value of type T, or the Status explaining why there is none. Constructing a Result from an OK
// Status is a bug and becomes an internal error rather than undefined behaviour.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Result<Status> makes no sense");

 public:
  Result(const T& value) : value_(value) { status_.ignore(); }        // NOLINT: implicit
  Result(T&& value) : value_(std::move(value)) { status_.ignore(); }  // NOLINT: implicit
  Result(Status status) : status_(std::move(status)) {                // NOLINT: implicit by design
    if (status_.ok()) status_ = internal_error("Result constructed from an OK Status");
  }
  template <typename U>
  requires(std::is_convertible_v<U&&, T> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status>) Result(U&& value)
      : value_(T(std::forward<U>(value))) {  // NOLINT: implicit by design
    status_.ignore();
  }

  bool ok() const { return value_.has_value(); }
  // The error; OK when a value is present. The rvalue form hands the caller a fresh, unchecked
  // Status, so an error propagated with KVTIER_ASSIGN_OR_RETURN must still be looked at.
  const Status& status() const& { return status_; }
  Status status() && {
    if (status_.ok()) return Status();
    return Status(status_.code(), std::string(status_.message()));
  }

  // Preconditions: ok(). Calling these on an error is a bug; it aborts with the status message
  // (never reached through bad input, only through a caller that skipped the check).
  T& value() & {
    assert_has_value();
    return *value_;
  }
  const T& value() const& {
    assert_has_value();
    return *value_;
  }
  T&& value() && {
    assert_has_value();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? *value_ : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void assert_has_value() const {
    if (!value_.has_value()) {
      std::fprintf(stderr, "kvtier: Result::value() on an error: %s\n",
                   status_.to_string().c_str());
      std::abort();
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace kvtier

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::kvtier::Status kvtier_status_ = (expr);        \
    if (!kvtier_status_.ok()) return kvtier_status_; \
  } while (false)

// `KVTIER_ASSIGN_OR_RETURN(auto x, make_x())`: evaluates a Result, returns its Status on error,
// otherwise moves the value into `lhs`.
#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_result_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                  \
  if (!result.ok()) return std::move(result).status();   \
  lhs = std::move(result).value()
