#include "sluice/core/status.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace sluice {

std::string printable(std::string text) {
  // Backslashes are not escaped: that keeps printable(printable(x)) == printable(x), so a
  // message that quotes another error's message is not escaped twice.
  auto needs_escape = [](unsigned char c) { return c < 0x20 || c == 0x7f; };
  if (std::none_of(text.begin(), text.end(), [&](char c) { return needs_escape(c); })) return text;
  std::string out;
  out.reserve(text.size() + 8);
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (!needs_escape(c)) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kNotFound:
      return "not_found";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kIoError:
      return "io_error";
    case Code::kCorruption:
      return "corruption";
    case Code::kNoSpace:
      return "no_space";
    case Code::kQuotaExceeded:
      return "quota_exceeded";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kPermissionDenied:
      return "permission_denied";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kCancelled:
      return "cancelled";
    case Code::kTimedOut:
      return "timed_out";
    case Code::kConflict:
      return "conflict";
    case Code::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Error::to_string() const {
  std::string out(code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Error Error::with_context(std::string_view context) const {
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Error(code_, std::move(msg), sys_errno_);
}

static Code code_for_errno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return Code::kNotFound;
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case EBADF:
    case ELOOP:
      return Code::kInvalidArgument;
    case ENOSPC:
    case EDQUOT:
      return Code::kNoSpace;
    case EFBIG:  // a file larger than the file system allows: not a full disk
      return Code::kInvalidArgument;
    case EACCES:
    case EPERM:
    case EROFS:
      return Code::kPermissionDenied;
    case EEXIST:
    case ENOTEMPTY:
      return Code::kAlreadyExists;
    case ENOSYS:
    case EOPNOTSUPP:
      return Code::kUnsupported;
    case EINTR:  // interrupted: worth another try, unlike a cancel by the user
    case EAGAIN:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return Code::kUnavailable;
    case ETIMEDOUT:
      return Code::kTimedOut;
    case ECANCELED:
      return Code::kCancelled;
    default:
      return Code::kIoError;
  }
}

Error error_from_errno(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return Error(code_for_errno(err), std::move(msg), err);
}

}  // namespace sluice
