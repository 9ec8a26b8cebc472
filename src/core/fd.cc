#include "sluice/core/fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <span>
#include <string>

namespace sluice {

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<size_t> pread_full(int fd, std::span<std::byte> dst, uint64_t offset,
                          std::string_view what) {
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n =
        ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return fail_errno(
          errno, "read " + std::string(what) + " at offset " + std::to_string(offset + done));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

Status pwrite_full(int fd, std::span<const std::byte> src, uint64_t offset, std::string_view what) {
  size_t done = 0;
  while (done < src.size()) {
    ssize_t n =
        ::pwrite(fd, src.data() + done, src.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return fail_errno(
          errno, "write " + std::string(what) + " at offset " + std::to_string(offset + done));
    done += static_cast<size_t>(n);
  }
  return ok();
}

Status write_full(int fd, std::span<const std::byte> src, std::string_view what) {
  size_t done = 0;
  while (done < src.size()) {
    ssize_t n = ::write(fd, src.data() + done, src.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "write " + std::string(what));
    done += static_cast<size_t>(n);
  }
  return ok();
}

Status sync_directory(int dirfd, std::string_view what) {
  // An O_PATH descriptor cannot be fsynced; reopen the directory for reading.
  UniqueFd d(::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid()) return fail_errno(errno, "open directory of " + std::string(what) + " to sync");
  if (::fsync(d.get()) != 0) return fail_errno(errno, "sync directory of " + std::string(what));
  return ok();
}

Result<std::string> read_small_file(const std::string& path, std::string_view what,
                                    uint64_t max_bytes) {
  const std::string named = std::string(what) + " " + path;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return fail_errno(errno, "open " + named);
  struct stat sb;
  if (::fstat(fd.get(), &sb) != 0) return fail_errno(errno, "stat " + named);
  if (!S_ISREG(sb.st_mode)) return fail(Code::kInvalidArgument, named + " is not a regular file");
  if (static_cast<uint64_t>(sb.st_size) > max_bytes)
    return fail(Code::kInvalidArgument, named + " is over " + std::to_string(max_bytes) + " bytes");
  std::string text(static_cast<size_t>(sb.st_size), '\0');
  SLUICE_ASSIGN_OR_RETURN(size_t n,
                          pread_full(fd.get(), std::as_writable_bytes(std::span(text)), 0, named));
  text.resize(n);
  return text;
}

}  // namespace sluice
