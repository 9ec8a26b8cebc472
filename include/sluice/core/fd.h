// sluice/core/fd.h: the one owner of a file descriptor, and the EINTR-safe I/O loops and
// directory sync every layer shares.
//
// UniqueFd is move-only and closes its descriptor when destroyed. The helpers retry EINTR,
// loop over short transfers, and turn errno into an Error (through error_from_errno) whose
// message is `what` plus the offset, so callers say what the descriptor is ("object
// 'a/b' in file:///data").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "sluice/core/status.h"

namespace sluice {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held (if any) and takes `fd`.
  void reset(int fd = -1);
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Reads until `dst` is full or the file ends; returns the bytes read.
Result<size_t> pread_full(int fd, std::span<std::byte> dst, uint64_t offset, std::string_view what);
// Writes all of `src` at `offset`.
Status pwrite_full(int fd, std::span<const std::byte> src, uint64_t offset, std::string_view what);
// Writes all of `src` at the descriptor's file position.
Status write_full(int fd, std::span<const std::byte> src, std::string_view what);
// Makes a directory's entries durable: fsync of a readable descriptor of the directory
// `dirfd` refers to (which may be an O_PATH descriptor).
Status sync_directory(int dirfd, std::string_view what);
// A settings file (a config, a peers list, a secret): a regular file of at most `max_bytes`,
// read whole. A FIFO or a device is refused before it is read (it would block, or never
// end). `what` names it in errors.
Result<std::string> read_small_file(const std::string& path, std::string_view what,
                                    uint64_t max_bytes = 1 << 20);

}  // namespace sluice
