// sluice/core/status.h: the one error model of sluice.
//
// Every fallible call returns `Result<T>` (a std::expected of T or Error) or `Status`
// (Result<void>). An Error carries a small fixed code, a message that names the file, key
// and offset involved, and the errno it came from when there was one. errno values are
// translated into codes in exactly one place, `error_from_errno`.
//
// Nothing in sluice throws across a public interface for an expected failure; exceptions
// are reserved for programming errors and allocation failure.
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace sluice {

enum class Code : int {
  kOk = 0,
  kNotFound,          // the file, object, key or bucket does not exist
  kInvalidArgument,   // the caller asked for something malformed (bad URI, size 0, ...)
  kIoError,           // the device or file system failed the operation
  kCorruption,        // bytes read back do not match their checksum or format
  kNoSpace,           // the file system or device is full (ENOSPC, EDQUOT)
  kQuotaExceeded,     // a sluice quota (per team) would be exceeded
  kUnavailable,       // a service or resource is temporarily unreachable; may succeed later
  kUnsupported,       // the platform lacks the feature (no io_uring, no CUDA, no O_DIRECT)
  kPermissionDenied,  // EACCES, EPERM, authentication or authorisation failure
  kAlreadyExists,     // exclusive create of something that is there
  kCancelled,         // the operation was abandoned (crash simulation, shutdown)
  kTimedOut,          // a deadline passed
  kConflict,          // the object changed under the caller (ETag mismatch, lost race)
  kInternal,          // a broken invariant inside sluice: a bug
};

// `text` with control characters (bytes below 0x20, and 0x7f) escaped as \n, \t, \r or
// \xNN: safe to print on one line of a log or a terminal. Idempotent (backslashes are
// kept as they are), so messages that quote messages are not escaped twice. Bytes from
// 0x80 up (UTF-8) are kept.
std::string printable(std::string text);

// The stable, lower-case name of a code ("not_found"), used in JSON and metrics.
std::string_view code_name(Code code);

class Error {
 public:
  // Control characters in `message` (a key with a newline, a server's text) are escaped,
  // so no message can forge a log line.
  Error(Code code, std::string message, int sys_errno = 0)
      : code_(code), message_(printable(std::move(message))), sys_errno_(sys_errno) {}

  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // The errno this error was translated from, or 0.
  int sys_errno() const { return sys_errno_; }

  // "not_found: open /data/x: No such file or directory"
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context` ("reading shard 3: ...").
  Error with_context(std::string_view context) const;

 private:
  Code code_;
  std::string message_;
  int sys_errno_;
};

// A value or an Error. [[nodiscard]]: dropping a Result (a commit(), a sync()) is a compile
// error under -Werror; where a result is deliberately ignored, say why and cast to void.
template <typename T>
class [[nodiscard]] Result : public std::expected<T, Error> {
 public:
  using Base = std::expected<T, Error>;
  using Base::Base;
  Result() = default;
  // From the std::expected that the monadic operations (and_then, transform) return.
  Result(Base other) : Base(std::move(other)) {}
};
using Status = Result<void>;

inline Status ok() {
  return {};
}

inline std::unexpected<Error> fail(Code code, std::string message) {
  return std::unexpected<Error>(Error(code, std::move(message)));
}

// The one place errno becomes a Code. `what` names the operation and its object, for
// example "open /data/shard-0001 for read" or "pread /data/x at offset 4096".
Error error_from_errno(int err, std::string_view what);

inline std::unexpected<Error> fail_errno(int err, std::string_view what) {
  return std::unexpected<Error>(error_from_errno(err, what));
}

}  // namespace sluice

// Propagates an error from an expression returning Status or Result<T>.
#define SLUICE_RETURN_IF_ERROR(expr)                                     \
  do {                                                                   \
    auto sluice_status_ = (expr);                                        \
    if (!sluice_status_) return std::unexpected(sluice_status_.error()); \
  } while (0)

#define SLUICE_CONCAT_INNER_(a, b) a##b
#define SLUICE_CONCAT_(a, b) SLUICE_CONCAT_INNER_(a, b)
#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp) return std::unexpected(tmp.error());      \
  lhs = std::move(*tmp)
// `SLUICE_ASSIGN_OR_RETURN(auto x, make_x());` declares x or returns the error.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_CONCAT_(sluice_result_, __LINE__), lhs, expr)
