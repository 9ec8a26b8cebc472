#include "sluice/core/fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace sluice
