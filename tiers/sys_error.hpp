// Status from a failed system call: "<what>: <strerror> (errno N)".
//
// One spelling for every errno-bearing message in tiers/, so logs and tests can rely on the
// "(errno N)" suffix. `what` names the call and the thing: "pwrite /x/store0.kvs at offset 4096".
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"

namespace kvtier {

inline std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

inline Status errno_status(StatusCode code, std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += errno_text(err);
  return Status(code, std::move(msg));
}

// ENOSPC and EDQUOT mean the medium is full: kResourceExhausted; everything else is an I/O error.
inline StatusCode io_errno_code(int err) {
  return (err == ENOSPC || err == EDQUOT) ? StatusCode::kResourceExhausted : StatusCode::kIoError;
}

// The errnos a failed read or write of a device's media comes back with: EIO (what most drivers
// and file systems return), ENODATA (the block layer's "critical medium error") and EILSEQ (its
// protection-information mismatch). Unlike EINVAL, EBADF or ENOSPC, they blame the sectors the
// request touched, not the request or the device as a whole.
inline bool is_media_error(int err) { return err == EIO || err == ENODATA || err == EILSEQ; }

// open(2): EINVAL is how a filesystem refuses O_DIRECT, so it is kInvalidArgument (callers may
// retry without it); ENOENT is kNotFound (a path that is not there); a full medium is
// kResourceExhausted; the rest are I/O errors.
inline StatusCode open_errno_code(int err) {
  if (err == EINVAL) return StatusCode::kInvalidArgument;
  if (err == ENOENT) return StatusCode::kNotFound;
  return io_errno_code(err);
}

}  // namespace kvtier
