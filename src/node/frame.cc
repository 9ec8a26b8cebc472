#include "node/frame.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sluice/core/hash.h"

namespace sluice::node {

namespace {

constexpr char kMagic[4] = {'S', 'L', 'N', 'D'};
using Clock = std::chrono::steady_clock;

void put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
void put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
uint64_t get(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

uint64_t frame_checksum(const std::byte* head24, std::string_view json,
                        std::span<const std::byte> data) {
  // The vector path (a reply's inline data is up to 16 MiB). A state of its own per frame,
  // not one per thread: a thread_local outlived by its thread's exit showed as a leak to
  // LeakSanitizer (fuzz/node_server_fuzz), and one allocation is nothing beside the frame's
  // system calls.
  Xxh3Stream st;
  st.update(head24, 24);
  st.update(json.data(), json.size());
  st.update(data.data(), data.size());
  return st.digest();
}

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status wait_ready(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return ok();
    if (n == 0) return fail(Code::kTimedOut, std::string(what) + ": peer too slow");
    if (errno != EINTR) return fail_errno(errno, what);
  }
}

}  // namespace

std::array<std::byte, kHeaderBytes> encode_header(const Frame& f) {
  std::array<std::byte, kHeaderBytes> h{};
  std::memcpy(h.data(), kMagic, 4);
  put16(h.data() + 4, kProtocolVersion);
  put16(h.data() + 6, f.type);
  put32(h.data() + 8, static_cast<uint32_t>(f.json.size()));
  put32(h.data() + 12, static_cast<uint32_t>(f.data.size()));
  put64(h.data() + 16, f.request_id);
  put64(h.data() + 24, frame_checksum(h.data(), f.json, f.data));
  return h;
}

Result<Header> decode_header(std::span<const std::byte, kHeaderBytes> b) {
  if (std::memcmp(b.data(), kMagic, 4) != 0)
    return fail(Code::kInvalidArgument, "frame: bad magic (not the sluice node protocol)");
  Header h;
  h.version = static_cast<uint16_t>(get(b.data() + 4, 2));
  h.type = static_cast<uint16_t>(get(b.data() + 6, 2));
  h.json_bytes = static_cast<uint32_t>(get(b.data() + 8, 4));
  h.data_bytes = static_cast<uint32_t>(get(b.data() + 12, 4));
  h.request_id = get(b.data() + 16, 8);
  h.checksum = get(b.data() + 24, 8);
  if (h.version != kProtocolVersion)
    return fail(Code::kInvalidArgument, "frame: protocol version " + std::to_string(h.version) +
                                            ", this side speaks " +
                                            std::to_string(kProtocolVersion));
  if (h.json_bytes > kMaxJsonBytes)
    return fail(Code::kInvalidArgument,
                "frame: JSON of " + std::to_string(h.json_bytes) + " bytes is over the limit");
  if (h.data_bytes > kMaxDataBytes)
    return fail(Code::kInvalidArgument,
                "frame: data of " + std::to_string(h.data_bytes) + " bytes is over the limit");
  return h;
}

bool verify(const Header& h, std::span<const std::byte, kHeaderBytes> raw, const Frame& f) {
  return frame_checksum(raw.data(), f.json, f.data) == h.checksum;
}

Status FrameChannel::send(const Frame& f, std::chrono::milliseconds timeout) {
  if (f.json.size() > kMaxJsonBytes || f.data.size() > kMaxDataBytes || f.fds.size() > kMaxFds)
    return fail(Code::kInternal, "frame: too large to send");
  const Clock::time_point deadline = Clock::now() + timeout;
  auto header = encode_header(f);
  iovec iov[3] = {{header.data(), header.size()},
                  {const_cast<char*>(f.json.data()), f.json.size()},
                  {const_cast<std::byte*>(f.data.data()), f.data.size()}};
  size_t first = 0;
  // The descriptors go with the first bytes sent, so the receiver finds them with the header.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  bool fds_pending = !f.fds.empty();
  while (first < 3) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = 3 - first;
    if (fds_pending) {
      size_t n = f.fds.size();
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
      std::memset(control, 0, msg.msg_controllen);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * n);
      int* out = reinterpret_cast<int*>(CMSG_DATA(c));
      for (size_t i = 0; i < n; ++i) out[i] = f.fds[i].get();
    }
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SLUICE_RETURN_IF_ERROR(wait_ready(fd_.get(), POLLOUT, deadline, "send frame"));
        continue;
      }
      return fail_errno(errno, "send frame");
    }
    fds_pending = false;
    auto left = static_cast<size_t>(n);
    while (first < 3 && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return ok();
}

Status FrameChannel::read_exact(std::span<std::byte> dst, Clock::time_point deadline,
                                std::vector<UniqueFd>* fds, bool* closed_at_start) {
  size_t got = 0;
  while (got < dst.size()) {
    iovec iov{dst.data() + got, dst.size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (fds) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SLUICE_RETURN_IF_ERROR(wait_ready(fd_.get(), POLLIN, deadline, "receive frame"));
        continue;
      }
      return fail_errno(errno, "receive frame");
    }
    if (fds) {
      // Take every descriptor that arrived, even a surplus, so none leaks.
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) fds->emplace_back(in[i]);
      }
      if (msg.msg_flags & MSG_CTRUNC)
        return fail(Code::kInvalidArgument, "frame: more descriptors than a frame may carry");
    }
    if (n == 0) {
      if (got == 0 && closed_at_start) {
        *closed_at_start = true;
        return ok();
      }
      return fail(Code::kUnavailable, "receive frame: the peer closed the connection mid-frame");
    }
    got += static_cast<size_t>(n);
  }
  return ok();
}

Result<std::optional<Frame>> FrameChannel::receive(std::chrono::milliseconds idle,
                                                   std::chrono::milliseconds timeout,
                                                   uint32_t max_data) {
  SLUICE_RETURN_IF_ERROR(wait_ready(fd_.get(), POLLIN, Clock::now() + idle, "wait for a frame"));
  const Clock::time_point deadline = Clock::now() + timeout;
  std::array<std::byte, kHeaderBytes> raw;
  Frame f;
  bool closed = false;
  SLUICE_RETURN_IF_ERROR(read_exact(raw, deadline, &f.fds, &closed));
  if (closed) return std::optional<Frame>();
  SLUICE_ASSIGN_OR_RETURN(Header h, decode_header(raw));
  if (h.data_bytes > max_data)
    return fail(Code::kInvalidArgument, "frame: " + std::to_string(h.data_bytes) +
                                            " data bytes where at most " +
                                            std::to_string(max_data) + " are allowed");
  f.type = h.type;
  f.request_id = h.request_id;
  f.json.resize(h.json_bytes);
  f.data.resize(h.data_bytes);
  SLUICE_RETURN_IF_ERROR(
      read_exact(std::span<std::byte>(reinterpret_cast<std::byte*>(f.json.data()), f.json.size()),
                 deadline, &f.fds, nullptr));
  SLUICE_RETURN_IF_ERROR(read_exact(f.data, deadline, &f.fds, nullptr));
  if (f.fds.size() > kMaxFds)
    return fail(Code::kInvalidArgument, "frame: more descriptors than a frame may carry");
  if (!verify(h, raw, f)) return fail(Code::kCorruption, "frame: checksum mismatch");
  return std::optional<Frame>(std::move(f));
}

Result<Window> Window::create(size_t bytes) {
  if (bytes == 0 || bytes % 4096 != 0)
    return fail(Code::kInvalidArgument, "a window is a whole number of pages");
  if (bytes <= kHeaderBytes)
    return fail(Code::kInvalidArgument, "a window holds a header page and at least one more");
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
#ifdef MFD_NOEXEC_SEAL
  flags |= MFD_NOEXEC_SEAL;  // what vm.memfd_noexec=2 requires; older kernels say EINVAL
#endif
  UniqueFd fd(::memfd_create("sluiced-window", flags));
  if (!fd.valid() && errno == EINVAL)
    fd.reset(::memfd_create("sluiced-window", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return fail_errno(errno, "memfd_create for a reply window");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return fail_errno(errno, "sizing a reply window");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return fail_errno(errno, "mapping a reply window");
  Window w(std::move(fd), static_cast<std::byte*>(p), bytes);
  // After the writable mapping above: F_SEAL_FUTURE_WRITE refuses every later one.
  if (::fcntl(w.fd_.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
    return fail_errno(errno, "sealing a reply window");
  return w;
}

Result<Window> Window::map(UniqueFd fd, size_t bytes) {
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return fail_errno(errno, "the daemon's reply window");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "the daemon's reply window");
  // tmpfs (shmem): a hugetlbfs memfd could fault when its pool runs dry.
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) != 0) return fail_errno(errno, "the daemon's reply window");
  if (!(seals & F_SEAL_SHRINK) || fs.f_type != TMPFS_MAGIC || bytes <= kHeaderBytes ||
      static_cast<uint64_t>(st.st_size) < bytes)
    return fail(Code::kCorruption,
                "sluiced: a reply window that is not sealed shmem, or too small");
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return fail_errno(errno, "mapping the daemon's reply window");
  return Window(std::move(fd), static_cast<std::byte*>(p), bytes);
}

uint64_t Window::generation() const {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p_), __ATOMIC_ACQUIRE);
}

void Window::set_generation(uint64_t g) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p_), g, __ATOMIC_RELEASE);
}

Window& Window::operator=(Window&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, size_);
    fd_ = std::move(o.fd_);
    p_ = std::exchange(o.p_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Window::~Window() {
  if (p_) ::munmap(p_, size_);
}

}  // namespace sluice::node
