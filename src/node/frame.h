// The node protocol's frames (docs/formats/node-protocol.md): what sluiced and its local
// clients send each other over a Unix domain socket.
//
// A frame is a 32-byte header, a JSON document and a data block; file descriptors may ride
// along (SCM_RIGHTS). Every field of the header and every byte after it is untrusted until
// decode_header and verify have checked them: lengths are bounded before anything is
// allocated, and a frame whose checksum does not match is refused.
//
// FrameChannel owns one connected socket and reads and writes whole frames with deadlines,
// so a peer that stops halfway (a slow or hostile client) costs a timeout, never a thread.
// Not thread-safe: one thread uses a channel at a time.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/fd.h"
#include "sluice/core/status.h"

namespace sluice::node {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr uint32_t kMaxJsonBytes = 1u << 20;   // 1 MiB
inline constexpr uint32_t kMaxDataBytes = 16u << 20;  // 16 MiB
inline constexpr size_t kMaxFds = 64;
inline constexpr size_t kMaxDeclareReads = 4096;  // reads in one DECLARE request

enum class FrameType : uint16_t {
  kHello = 1,
  kStat = 2,
  kRead = 3,
  kList = 4,
  kCacheStat = 5,
  kEvict = 6,
  kPin = 7,
  kChunks = 8,
  kDeclare = 9,
  kWindow = 10,
  kWarm = 11,
  kResponse = 0x8000,  // or'ed with the request's type
  kError = 0xFFFF,
};

inline uint16_t response_type(FrameType request) {
  return static_cast<uint16_t>(request) | static_cast<uint16_t>(FrameType::kResponse);
}

// Bytes that grow without being zeroed: frame data is always overwritten whole (received
// from the socket, or filled by the daemon's read), and zeroing up to 16 MiB a reply (as
// std::vector does) cost a pass over memory on each side.
class FrameBytes {
 public:
  FrameBytes() = default;
  FrameBytes(FrameBytes&& o) noexcept
      : p_(std::move(o.p_)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  FrameBytes& operator=(FrameBytes&& o) noexcept {
    p_ = std::move(o.p_);
    size_ = std::exchange(o.size_, 0);
    cap_ = std::exchange(o.cap_, 0);
    return *this;
  }

  std::byte* data() { return p_.get(); }
  const std::byte* data() const { return p_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::byte* begin() { return data(); }
  std::byte* end() { return data() + size_; }
  const std::byte* begin() const { return data(); }
  const std::byte* end() const { return data() + size_; }

  // Room for `n` bytes without moving them.
  void reserve(size_t n) {
    if (n <= cap_) return;
    std::unique_ptr<std::byte[]> q(new std::byte[n]);  // default-initialised: not zeroed
    if (size_ > 0) std::memcpy(q.get(), p_.get(), size_);
    p_ = std::move(q);
    cap_ = n;
  }
  // Keeps the first min(n, size()) bytes; the bytes added are not initialised.
  void resize(size_t n) {
    if (n > cap_) reserve(std::max(n, 2 * cap_));
    size_ = n;
  }

 private:
  std::unique_ptr<std::byte[]> p_;
  size_t size_ = 0, cap_ = 0;
};

struct Frame {
  uint16_t type = 0;
  uint64_t request_id = 0;
  std::string json;
  FrameBytes data;
  std::vector<UniqueFd> fds;  // received, or to send
};

struct Header {
  uint16_t version = 0, type = 0;
  uint32_t json_bytes = 0, data_bytes = 0;
  uint64_t request_id = 0, checksum = 0;
};

// Serialises a header for `f` (its checksum covers the header's first 24 bytes, the JSON
// and the data).
std::array<std::byte, kHeaderBytes> encode_header(const Frame& f);
// Checks magic, version and lengths; InvalidArgument names what is wrong.
Result<Header> decode_header(std::span<const std::byte, kHeaderBytes> bytes);
// Whether the frame's JSON and data match the header's checksum.
bool verify(const Header& h, std::span<const std::byte, kHeaderBytes> raw, const Frame& f);

class FrameChannel {
 public:
  explicit FrameChannel(UniqueFd socket) : fd_(std::move(socket)) {}

  // Sends a whole frame, fds included, within `timeout` (a peer that does not read fails
  // with TimedOut).
  Status send(const Frame& f, std::chrono::milliseconds timeout);
  // Waits up to `idle` for a frame to begin, then up to `timeout` for the rest of it. A
  // header announcing more than `max_data` data bytes is refused before anything is
  // allocated (requests carry none).
  // nullopt: the peer closed the connection between frames. Unavailable: it closed
  // mid-frame; TimedOut; InvalidArgument or Corruption: a malformed frame (the channel is
  // then unusable: its framing is lost).
  Result<std::optional<Frame>> receive(std::chrono::milliseconds idle,
                                       std::chrono::milliseconds timeout,
                                       uint32_t max_data = kMaxDataBytes);

  int fd() const { return fd_.get(); }

 private:
  Status read_exact(std::span<std::byte> dst, std::chrono::steady_clock::time_point deadline,
                    std::vector<UniqueFd>* fds, bool* closed_at_start);
  UniqueFd fd_;
};

// A connection's shared-memory reply window (WINDOW in docs/formats/node-protocol.md): a
// sealed memfd the daemon writes a connection's inline read bytes into and the client maps
// read-only, so those bytes cross no socket. The seals (no shrink, no grow, no writable
// mapping or write(2) after the daemon's own) mean the client can neither change what the
// daemon wrote (which the daemon's cache may be writing to NVMe from) nor make the daemon's
// writes fault. Move-only; unmaps when destroyed.
//
// The first page is the window's header: a little-endian u64 at offset 0, its generation,
// which the daemon changes each time the window passes to another connection (windows are
// reused, see server.cc). Reply bytes start at kHeaderBytes; a client checks after copying
// them that the generation is still the one the reply named, so bytes a reused window got
// meanwhile (a client stalled past its connection's end) are never taken for its own.
class Window {
 public:
  static constexpr size_t kHeaderBytes = 4096;

  // The daemon's side: `bytes` (a whole number of pages) of fresh memory, mapped writable.
  static Result<Window> create(size_t bytes);
  // The client's side: maps a window it was sent, read-only, after checking that it is
  // sealed against shrinking and holds at least `bytes`.
  static Result<Window> map(UniqueFd fd, size_t bytes);

  Window(Window&& o) noexcept
      : fd_(std::move(o.fd_)), p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Window& operator=(Window&& o) noexcept;
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  ~Window();

  std::span<std::byte> writable() { return {p_, size_}; }  // the daemon's side only
  std::span<const std::byte> bytes() const { return {p_, size_}; }
  uint64_t generation() const;
  void set_generation(uint64_t g);  // the daemon's side only
  size_t size() const { return size_; }
  const UniqueFd& fd() const { return fd_; }

 private:
  Window(UniqueFd fd, std::byte* p, size_t size) : fd_(std::move(fd)), p_(p), size_(size) {}
  UniqueFd fd_;
  std::byte* p_ = nullptr;
  size_t size_ = 0;
};

}  // namespace sluice::node
