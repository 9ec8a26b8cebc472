// NodeStore and NodeClient: the library's side of the node protocol; see client.h.
#include "sluice/node/client.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include "core/executor.h"
#include "node/frame.h"
#include "node/wire.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/core/endpoint.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/io/file_handle.h"

namespace sluice::node {

struct NodeClient::Impl {
  std::string socket;
  std::chrono::milliseconds timeout;
  DaemonInfo info;
  std::atomic<uint64_t> next_id{1};  // relaxed: only has to be unique; it orders nothing

  // Connections open at once, at most: a caller past it waits for one to come back. The
  // daemon limits the connections of a uid (64 by default), and a node runs many processes
  // of one uid (ranks, their DataLoader workers): a loader's 32 reads in flight took a
  // connection each, and 4 workers' reads were refused and retried after a back-off (their
  // warm epoch took 3.0 s, 1.55 s with this bound). A read's bytes do not cross the
  // connection (the chunk's descriptor, or the connection's reply window, carries them), so
  // a few suffice.
  static constexpr size_t kMaxOpen = 4;

  // Counts an open connection until destroyed (then wakes a caller waiting for one).
  class OpenSlot {
   public:
    OpenSlot() = default;
    explicit OpenSlot(Impl* owner) : owner_(owner) {}
    OpenSlot(OpenSlot&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)) {}
    OpenSlot& operator=(OpenSlot&& o) noexcept {
      std::swap(owner_, o.owner_);
      return *this;
    }
    ~OpenSlot() {
      if (owner_) owner_->closed();
    }

   private:
    Impl* owner_ = nullptr;
  };

  // A connection, and the reply window the daemon mapped for it (reads only).
  struct Conn {
    std::unique_ptr<FrameChannel> ch;
    std::optional<Window> window;
    bool window_asked = false;  // once per connection: a refusal is not asked again
    OpenSlot slot;
  };
  Mutex mu;
  CondVar returned;  // a connection came back to `idle`, or closed
  size_t open SLUICE_GUARDED_BY(mu) = 0;
  std::vector<Conn> idle SLUICE_GUARDED_BY(mu);

  // A reply that still holds its connection: the pieces of a read reply may name bytes of
  // the connection's window, which the next request on it overwrites. The connection goes
  // back to the pool when this is destroyed.
  class Held {
   public:
    Held(Impl* owner, Conn c, Frame f) : frame(std::move(f)), owner_(owner), c_(std::move(c)) {}
    Held(Held&& o) noexcept
        : frame(std::move(o.frame)),
          owner_(std::exchange(o.owner_, nullptr)),
          c_(std::move(o.c_)) {}
    Held(const Held&) = delete;
    Held& operator=(Held&&) = delete;
    ~Held() {
      if (owner_) owner_->release(std::move(c_));
    }
    std::span<const std::byte> window() const {
      return c_.window ? c_.window->bytes() : std::span<const std::byte>();
    }
    // The window's generation now (0 without one): compared, after the bytes are copied
    // out, with the one the reply named.
    uint64_t window_generation() const { return c_.window ? c_.window->generation() : 0; }
    Frame frame;

   private:
    Impl* owner_;
    Conn c_;
  };

  void release(Conn c) {
    {
      MutexLock lock(mu);
      idle.push_back(std::move(c));
    }
    returned.notify_one();
  }

  void closed() {
    {
      MutexLock lock(mu);
      --open;
    }
    returned.notify_one();
  }

  // A pooled connection (first attempt only), else a new one; `pooled` says which. Waits
  // while kMaxOpen connections are out (Unavailable after the request timeout).
  Result<Conn> take(bool reuse, bool& pooled) {
    OpenSlot slot;
    {
      UniqueLock lock(mu);
      if (!returned.wait_for(lock, timeout, [&]() SLUICE_REQUIRES(mu) {
            return !idle.empty() || open < kMaxOpen;
          }))
        return fail(Code::kUnavailable, "sluiced at " + socket + ": all " +
                                            std::to_string(kMaxOpen) +
                                            " connections this client keeps busy for " +
                                            std::to_string(timeout.count()) + " ms");
      if (!idle.empty()) {
        Conn c = std::move(idle.back());
        idle.pop_back();
        if (reuse) {
          pooled = true;
          return c;
        }
        slot = std::move(c.slot);  // a new connection in the place of this one
      } else {
        ++open;
        slot = OpenSlot(this);
      }
    }
    pooled = false;
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<FrameChannel> ch, dial());
    return Conn{std::move(ch), std::nullopt, false, std::move(slot)};
  }

  Result<std::unique_ptr<FrameChannel>> dial() const {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return fail_errno(errno, "socket");
    sockaddr_un addr{};
    if (socket.size() >= sizeof addr.sun_path)
      return fail(Code::kInvalidArgument, "daemon socket path '" + socket + "' is too long");
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
    // A daemon whose accept backlog is full would block connect() for good: bounded by the
    // request timeout (AF_UNIX connect honours SO_SNDTIMEO and then fails with EAGAIN).
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      int err = errno;
      if (err == ENOENT || err == ECONNREFUSED)  // errno kept: no_daemon_listens reads it
        return std::unexpected(Error(Code::kUnavailable, "no sluiced answers on " + socket, err));
      if (err == EAGAIN || err == EWOULDBLOCK)
        return fail(Code::kUnavailable, "sluiced at " + socket + " accepts no connection for " +
                                            std::to_string(timeout.count()) + " ms");
      return fail_errno(err, "connect to sluiced at " + socket);
    }
    return std::make_unique<FrameChannel>(std::move(fd));
  }

  // One request and its reply on `ch`. A reply that is not for this request is Corruption.
  Result<Frame> exchange_on(FrameChannel& ch, Frame& req) const {
    if (Status sent = ch.send(req, timeout); !sent) {
      // A daemon that refused this connection said why before it closed: report that.
      auto why = ch.receive(std::chrono::milliseconds(100), std::chrono::milliseconds(100));
      if (why && *why && (*why)->type == static_cast<uint16_t>(FrameType::kError))
        return std::unexpected(error_of(**why, "sluiced at " + socket));
      return std::unexpected(sent.error().with_context("sluiced at " + socket));
    }
    SLUICE_ASSIGN_OR_RETURN(std::optional<Frame> resp, ch.receive(timeout, timeout));
    if (!resp) return fail(Code::kUnavailable, "sluiced at " + socket + " closed the connection");
    // An error frame with id 0 is about the connection itself (refused, malformed).
    if (resp->type == static_cast<uint16_t>(FrameType::kError) && resp->request_id == 0)
      return std::unexpected(error_of(*resp, "sluiced at " + socket));
    if (resp->request_id != req.request_id ||
        (resp->type != (req.type | static_cast<uint16_t>(FrameType::kResponse)) &&
         resp->type != static_cast<uint16_t>(FrameType::kError)))
      return fail(Code::kCorruption, "sluiced at " + socket + ": reply for another request");
    return std::move(*resp);
  }

  // Sends on a pooled connection (or a new one); a pooled connection the daemon closed
  // meanwhile is replaced once. With window_bytes, a READ asks the connection's reply
  // window first (once per connection) and, where the daemon mapped one, has its inline
  // bytes written there ("window": true) instead of into the reply.
  Result<Held> exchange_held(uint16_t type, const std::function<std::string(bool window)>& json,
                             uint64_t window_bytes = 0) {
    Frame req;
    req.type = type;
    for (int attempt = 0;; ++attempt) {
      bool pooled = false;
      SLUICE_ASSIGN_OR_RETURN(Conn c, take(attempt == 0, pooled));
      Result<Frame> r = send_on(c, req, json, window_bytes);
      if (!r) {
        if (pooled) continue;  // every request is idempotent: retry on a new connection
        return std::unexpected(r.error());
      }
      return Held(this, std::move(c), std::move(*r));
    }
  }

  Result<Frame> send_on(Conn& c, Frame& req, const std::function<std::string(bool window)>& json,
                        uint64_t window_bytes) {
    // Asked only of a daemon that said it maps windows: an older one would log each refusal.
    if (window_bytes > 0 && info.windows && !c.window_asked)
      SLUICE_RETURN_IF_ERROR(ask_window(c, window_bytes));
    req.request_id = next_id.fetch_add(1, std::memory_order_relaxed);
    req.json = json(c.window.has_value());
    return exchange_on(*c.ch, req);
  }

  Result<Frame> exchange(uint16_t type, std::string json) {
    SLUICE_ASSIGN_OR_RETURN(Held h, exchange_held(type, [&](bool) { return json; }));
    return std::move(h.frame);
  }

  // Asks the daemon to map a reply window for `c`. A refusal (a daemon before windows, or
  // one whose window memory is taken) or a window that fails its checks leaves `c` without
  // one; only a broken connection is an error.
  Status ask_window(Conn& c, uint64_t bytes) {
    c.window_asked = true;
    Frame req;
    req.type = static_cast<uint16_t>(FrameType::kWindow);
    req.request_id = next_id.fetch_add(1, std::memory_order_relaxed);
    req.json = Json{{"bytes", bytes}}.dump();
    SLUICE_ASSIGN_OR_RETURN(Frame f, exchange_on(*c.ch, req));
    if (f.type == static_cast<uint16_t>(FrameType::kError) || f.fds.size() != 1) return ok();
    auto j = parse_body(f.json);
    if (!j) return ok();
    auto mapped = get_u64(*j, "bytes");
    if (!mapped || *mapped == 0 || *mapped > kMaxDataBytes) return ok();
    auto w = Window::map(std::move(f.fds[0]), *mapped);
    if (w) c.window = std::move(*w);
    return ok();
  }

  Result<Frame> call_frame(FrameType type, const Json& body) {
    SLUICE_ASSIGN_OR_RETURN(Frame f,
                            exchange(static_cast<uint16_t>(type),
                                     body.dump(-1, ' ', false, Json::error_handler_t::replace)));
    if (f.type == static_cast<uint16_t>(FrameType::kError))
      return std::unexpected(error_of(f, "sluiced"));
    return f;
  }
};

NodeClient::NodeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeClient::~NodeClient() = default;
NodeClient::Impl& NodeClient::impl() {
  return *impl_;
}
const DaemonInfo& NodeClient::daemon() const {
  return impl_->info;
}

Result<std::unique_ptr<NodeClient>> NodeClient::connect(std::string socket,
                                                        std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->socket = std::move(socket);
  impl->timeout = timeout;
  SLUICE_ASSIGN_OR_RETURN(Frame f,
                          impl->call_frame(FrameType::kHello, Json{{"version", kProtocolVersion}}));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  DaemonInfo& d = impl->info;
  SLUICE_ASSIGN_OR_RETURN(d.team, get_string(j, "team"));
  SLUICE_ASSIGN_OR_RETURN(d.directory, get_string_or(j, "directory", ""));
  SLUICE_ASSIGN_OR_RETURN(d.chunk_size, get_u64(j, "chunk_size"));
  SLUICE_ASSIGN_OR_RETURN(uint64_t pid, get_u64_or(j, "pid", 0));
  d.pid = static_cast<int64_t>(pid);
  SLUICE_ASSIGN_OR_RETURN(d.windows, get_bool_or(j, "windows", false));
  SLUICE_ASSIGN_OR_RETURN(d.s3_endpoint, get_string_or(j, "s3_endpoint", ""));
  return std::unique_ptr<NodeClient>(new NodeClient(std::move(impl)));
}

Result<std::string> NodeClient::cache_stat() {
  return call(static_cast<uint16_t>(FrameType::kCacheStat), "{}");
}

Result<uint64_t> NodeClient::evict(const std::string& root, const std::string& prefix) {
  SLUICE_ASSIGN_OR_RETURN(
      Frame f, impl_->call_frame(FrameType::kEvict, Json{{"root", root}, {"prefix", prefix}}));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  return get_u64(j, "chunks");
}

Result<cache::Warmed> NodeClient::warm(const std::string& root, const std::string& key,
                                       uint64_t offset, uint64_t length) {
  cache::Warmed w;
  w.end = offset;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(
        Frame f, impl_->call_frame(
                     FrameType::kWarm,
                     Json{{"root", root}, {"key", key}, {"offset", w.end}, {"length", length}}));
    SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
    SLUICE_ASSIGN_OR_RETURN(w.size, get_u64(j, "size"));
    SLUICE_ASSIGN_OR_RETURN(w.etag, get_string(j, "etag"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t end, get_u64(j, "end"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t fetched, get_u64(j, "fetched"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t not_kept, get_u64_or(j, "not_kept", 0));
    w.fetched += fetched;
    w.not_kept += not_kept;
    if (end <= w.end) break;  // the object ends here
    const uint64_t done = end - w.end;
    w.end = end;
    if (done >= length || end >= w.size) break;
    length -= done;
  }
  return w;
}

Result<uint64_t> NodeClient::pin(const std::string& root, const std::string& prefix, bool pinned) {
  SLUICE_ASSIGN_OR_RETURN(
      Frame f, impl_->call_frame(FrameType::kPin,
                                 Json{{"root", root}, {"prefix", prefix}, {"pinned", pinned}}));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  return get_u64(j, "chunks");
}

Result<cache::ChunkListing> NodeClient::chunks(const std::string& root, const std::string& prefix) {
  Json body = Json{{"prefix", prefix}};
  if (!root.empty()) body["root"] = root;
  SLUICE_ASSIGN_OR_RETURN(Frame f, impl_->call_frame(FrameType::kChunks, body));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  auto list = j.find("chunks");
  if (list == j.end() || !list->is_array())
    return fail(Code::kCorruption, "sluiced sent a CHUNKS reply without a chunk list");
  cache::ChunkListing out;
  SLUICE_ASSIGN_OR_RETURN(out.truncated, get_bool_or(j, "truncated", false));
  for (const Json& c : *list) {
    if (!c.is_object())
      return fail(Code::kCorruption, "sluiced sent a chunk that is not an object");
    cache::CachedChunk ch;
    SLUICE_ASSIGN_OR_RETURN(ch.store, get_string(c, "root"));
    SLUICE_ASSIGN_OR_RETURN(ch.key, get_string(c, "key"));
    SLUICE_ASSIGN_OR_RETURN(ch.etag, get_string_or(c, "etag", ""));
    SLUICE_ASSIGN_OR_RETURN(ch.index, get_u64(c, "index"));
    SLUICE_ASSIGN_OR_RETURN(ch.length, get_u64(c, "length"));
    SLUICE_ASSIGN_OR_RETURN(ch.in_ram, get_bool_or(c, "in_ram", false));
    SLUICE_ASSIGN_OR_RETURN(ch.on_disk, get_bool_or(c, "on_disk", false));
    SLUICE_ASSIGN_OR_RETURN(ch.pinned, get_bool_or(c, "pinned", false));
    out.chunks.push_back(std::move(ch));
  }
  return out;
}

Result<std::string> NodeClient::call(uint16_t type, const std::string& json) {
  SLUICE_ASSIGN_OR_RETURN(Frame f, impl_->exchange(type, json));
  if (f.type == static_cast<uint16_t>(FrameType::kError))
    return std::unexpected(error_of(f, "sluiced"));
  return std::move(f.json);
}

struct NodeStore::Impl {
  std::string root;
  NodeOptions options;
  std::unique_ptr<NodeClient> client;
  std::once_flag io_once;
  Result<std::shared_ptr<io::Context>> io = std::shared_ptr<io::Context>();
  std::once_flag pool_once;
  std::unique_ptr<Executor> pool;  // opens, reads and checks handed-off chunks
  // Relaxed: statistics, only reported (read_stats); nothing is published through them.
  std::atomic<uint64_t> handoff_chunks{0}, handoff_bytes{0}, inline_bytes{0}, retries{0};

  Result<std::shared_ptr<io::Context>> context() {
    std::call_once(io_once, [&] {
      io = options.io ? Result<std::shared_ptr<io::Context>>(options.io) : io::Context::open({});
    });
    return io;
  }

  // handoff_parallel threads: two reads at once left a RAM-backed device half idle, and
  // each thread checks the chunk it read, so the hashing runs in parallel too.
  Executor& handoff_pool() {
    std::call_once(pool_once, [&] {
      pool = std::make_unique<Executor>(std::max(1u, options.handoff_parallel));
    });
    return *pool;
  }

  Json request(std::string_view key) const { return Json{{"root", root}, {"key", key}}; }

  // Where a read's bytes go: host memory (dst.target null or a host target), or memory of a
  // device target, which no read(2) can fill: there a handed-off chunk is read into one of
  // the target's staging buffers, checked there and copied in, and inline bytes are copied
  // from the reply.
  static bool on_device(const io::Buffer& dst) {
    return dst.target && dst.target->kind() == mem::MemoryKind::kDevice;
  }

  // A handed-off chunk being read into bytes [at, at + len) of the destination through the
  // data path: true once read and matching its checksum, false when the bytes do not match
  // (the caller asks for them inline instead).
  struct HandoffRead {
    std::future<Result<bool>> done;
    uint64_t at = 0, len = 0;
  };

  // Starts reading a handed-off chunk on the hand-off pool; the reads of one reply run
  // together. `fd` stays open (in its reply) until every read of the reply is waited.
  Status start_handoff(const UniqueFd& fd, uint64_t file_offset, uint64_t xxh3,
                       const io::Buffer& dst, uint64_t at, uint64_t len,
                       std::deque<HandoffRead>& handoffs) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<io::Context> ctx, context());
    const uint64_t staging_size = (client->daemon().chunk_size + 4095) / 4096 * 4096;
    auto task = std::make_shared<std::packaged_task<Result<bool>()>>(
        [ctx, raw = fd.get(), file_offset, xxh3, dst, at, len, staging_size]() -> Result<bool> {
          io::OpenOptions oo;
          oo.compat = io::CompatMode::kOn;  // through memory this process checks: no cuFile
          // Reopening through /proc gives this process its own open file (and O_DIRECT) on
          // the chunk the daemon opened; the daemon's descriptor stays as it was.
          SLUICE_ASSIGN_OR_RETURN(
              io::FileHandle fh,
              io::FileHandle::open(ctx, "/proc/self/fd/" + std::to_string(raw), oo));
          if (!on_device(dst)) {
            std::byte* out = static_cast<std::byte*>(dst.ptr) + at;
            SLUICE_ASSIGN_OR_RETURN(size_t n,
                                    fh.read(io::Buffer::host(out, len), len, file_offset));
            return n == len && xxh3_64(out, len) == xxh3;
          }
          // The bytes are checked in host memory before they reach the device: a chunk
          // larger than the daemon's chunk size (a lying reply) never fits the buffer.
          if (len > staging_size) return false;
          SLUICE_ASSIGN_OR_RETURN(PooledBuffer stage, dst.target->staging(staging_size).acquire());
          SLUICE_ASSIGN_OR_RETURN(size_t n,
                                  fh.read(io::Buffer::host(stage.data(), len), len, file_offset));
          if (n != len || xxh3_64(stage.data(), len) != xxh3) return false;
          SLUICE_ASSIGN_OR_RETURN(
              uint64_t ticket,
              dst.target->copy_to_target(static_cast<std::byte*>(dst.ptr) + at, stage.data(), len));
          SLUICE_RETURN_IF_ERROR(dst.target->wait(ticket));  // before the buffer is reused
          return true;
        });
    handoffs.push_back(HandoffRead{task->get_future(), at, len});
    handoff_pool().post([task] { (*task)(); });
    return ok();
  }

  static Result<bool> finish_handoff(HandoffRead& h) { return h.done.get(); }

  // One piece of a read reply at `cursor`: inline bytes are copied into dst now (to a
  // device: enqueued, with the copy's ticket in `last_copy`), a handed-off chunk's read is
  // started (and appended to `handoffs`). Advances `cursor`.
  Status take_piece(std::string_view key, const Json& p, const Frame& f,
                    std::span<const std::byte> window, uint64_t offset, const io::Buffer& dst,
                    uint64_t& cursor, std::deque<HandoffRead>& handoffs,
                    std::optional<uint64_t>& last_copy) {
    SLUICE_ASSIGN_OR_RETURN(uint64_t at, get_u64(p, "offset"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t len, get_u64(p, "length"));
    if (at != cursor || len == 0 || len > offset + dst.size - cursor)
      return fail(Code::kCorruption,
                  "sluiced: a read reply out of order for '" + std::string(key) + "'");
    const uint64_t within = cursor - offset;
    const bool in_window = p.contains("window_offset");
    if (in_window || p.contains("data_offset")) {
      std::span<const std::byte> from_bytes(f.data.data(), f.data.size());
      if (in_window) from_bytes = window;
      SLUICE_ASSIGN_OR_RETURN(uint64_t from,
                              get_u64(p, in_window ? "window_offset" : "data_offset"));
      if (from > from_bytes.size() || len > from_bytes.size() - from)
        return fail(Code::kCorruption, in_window ? "sluiced: a piece past the reply window"
                                                 : "sluiced: a piece past the reply's data");
      std::byte* out = static_cast<std::byte*>(dst.ptr) + within;
      if (on_device(dst)) {
        SLUICE_ASSIGN_OR_RETURN(last_copy,
                                dst.target->copy_to_target(out, from_bytes.data() + from, len));
      } else {
        std::memcpy(out, from_bytes.data() + from, len);
      }
      inline_bytes.fetch_add(len, std::memory_order_relaxed);
    } else {
      SLUICE_ASSIGN_OR_RETURN(uint64_t fd, get_u64(p, "fd"));
      SLUICE_ASSIGN_OR_RETURN(uint64_t file_offset, get_u64(p, "file_offset"));
      SLUICE_ASSIGN_OR_RETURN(uint64_t sum, get_u64(p, "xxh3"));
      if (fd >= f.fds.size())
        return fail(Code::kCorruption, "sluiced: a piece names a descriptor not sent");
      SLUICE_RETURN_IF_ERROR(
          start_handoff(f.fds[fd], file_offset, sum, dst, within, len, handoffs));
    }
    cursor += len;
    return ok();
  }

  // One pass over [offset, offset + dst.size()) pinned to `etag` (learnt from the first
  // reply when empty). Returns the bytes read.
  Result<size_t> read_pinned(std::string_view key, uint64_t offset, const io::Buffer& dst,
                             std::string& etag) {
    bool inline_only = false;
    uint64_t got = 0;
    int reused = 0;  // replies whose window passed to another connection meanwhile
    while (got < dst.size) {
      Json body = request(key);
      body["offset"] = offset + got;
      body["length"] = dst.size - got;
      if (!etag.empty()) body["if_match"] = etag;
      if (inline_only) body["inline_only"] = true;
      // The reply holds its connection until the loop's turn ends: its pieces may lie in
      // the connection's window.
      SLUICE_ASSIGN_OR_RETURN(NodeClient::Impl::Held held,
                              client->impl().exchange_held(
                                  static_cast<uint16_t>(FrameType::kRead),
                                  [&](bool window) {
                                    body["window"] = window;
                                    return body.dump(-1, ' ', false,
                                                     Json::error_handler_t::replace);
                                  },
                                  options.window_bytes));
      const Frame& f = held.frame;
      if (f.type == static_cast<uint16_t>(FrameType::kError))
        return std::unexpected(error_of(f, "sluiced"));
      SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
      SLUICE_ASSIGN_OR_RETURN(std::string version, get_string(j, "etag"));
      if (etag.empty()) etag = version;
      if (version != etag)
        return fail(Code::kConflict, "'" + std::string(key) + "' changed during the read");
      auto pieces = j.find("pieces");
      if (pieces == j.end() || !pieces->is_array())
        return fail(Code::kCorruption, "sluiced: a read reply without pieces");
      if (pieces->empty()) break;  // the object ends here
      uint64_t cursor = offset + got;
      std::deque<HandoffRead> handoffs;
      std::optional<uint64_t> last_copy;  // inline bytes on their way to a device
      Status taken = ok();
      for (const Json& p : *pieces) {
        taken = take_piece(key, p, f, held.window(), offset, dst, cursor, handoffs, last_copy);
        if (!taken) break;
      }
      // Every read started writes into dst and uses a descriptor of `f`, and every copy to a
      // device reads `f`'s data: wait for all of them before anything returns (get() below
      // may throw what a task stored).
      for (HandoffRead& h : handoffs) h.done.wait();
      Status copied = last_copy ? dst.target->wait(*last_copy) : ok();
      std::optional<uint64_t> bad_at;  // where the first chunk that failed its check starts
      Status waited = ok();
      for (HandoffRead& h : handoffs) {
        Result<bool> good = finish_handoff(h);
        if (!good) {
          if (waited) waited = Status(std::unexpected(good.error()));
        } else if (!*good) {
          if (!bad_at) bad_at = offset + h.at;
        } else if (!bad_at) {
          handoff_chunks.fetch_add(1, std::memory_order_relaxed);
          handoff_bytes.fetch_add(h.len, std::memory_order_relaxed);
        }
      }
      SLUICE_RETURN_IF_ERROR(taken);
      SLUICE_RETURN_IF_ERROR(waited);
      SLUICE_RETURN_IF_ERROR(copied);
      // The window passed to another connection while its bytes were copied (this process
      // stalled past its connection's end): the copy may hold that one's bytes. Asked
      // again, on a new connection (the daemon closed this one).
      if (auto g = j.find("window_generation"); g != j.end()) {
        if (!g->is_number_unsigned() || g->get<uint64_t>() != held.window_generation()) {
          if (++reused >= 3)
            return fail(Code::kCorruption, "sluiced: the reply window changed under every read");
          continue;
        }
      }
      if (bad_at) {
        retries.fetch_add(1, std::memory_order_relaxed);
        inline_only = true;  // the daemon's own read checks, drops and refetches it
        cursor = *bad_at;
      }
      got = cursor - offset;
    }
    return static_cast<size_t>(got);
  }
};

NodeStore::NodeStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeStore::~NodeStore() = default;

Result<std::unique_ptr<NodeStore>> NodeStore::open(std::string root_uri, NodeOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->root = std::move(root_uri);
  SLUICE_ASSIGN_OR_RETURN(impl->client, NodeClient::connect(options.socket, options.timeout));
  const std::string& theirs = impl->client->daemon().s3_endpoint;
  if (impl->root.starts_with("s3://") && !options.s3_endpoint.empty() && !theirs.empty() &&
      !same_endpoint(theirs, options.s3_endpoint))
    return fail(Code::kInvalidArgument,
                "sluiced at " + options.socket + " reads s3:// from " + theirs + ", not " +
                    options.s3_endpoint +
                    " as this process asks: start sluiced with that endpoint, or read "
                    "without the daemon");
  impl->options = std::move(options);
  return std::unique_ptr<NodeStore>(new NodeStore(std::move(impl)));
}

Result<store::ObjectInfo> NodeStore::stat(std::string_view key) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  SLUICE_ASSIGN_OR_RETURN(Frame f,
                          impl_->client->impl().call_frame(FrameType::kStat, impl_->request(key)));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  store::ObjectInfo info;
  info.key = std::string(key);
  SLUICE_ASSIGN_OR_RETURN(info.size, get_u64(j, "size"));
  SLUICE_ASSIGN_OR_RETURN(info.etag, get_string(j, "etag"));
  if (j.contains("mtime_ns") && j["mtime_ns"].is_number_integer())
    info.mtime_ns = j["mtime_ns"].get<int64_t>();
  return info;
}

Result<size_t> NodeStore::read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                               const store::ReadOptions& options) {
  return read_into(key, offset, io::Buffer::host(dst.data(), dst.size()), options);
}

Result<size_t> NodeStore::read_into(std::string_view key, uint64_t offset, const io::Buffer& dst,
                                    const store::ReadOptions& options) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  if (dst.size > 0 && !dst.ptr)
    return fail(Code::kInvalidArgument, "read of '" + std::string(key) + "' into a null buffer");
  for (int attempt = 0;; ++attempt) {
    std::string etag = options.if_match;
    Result<size_t> r = impl_->read_pinned(key, offset, dst, etag);
    // The object changed under the read: start over once on the version there now.
    if (!r && r.error().code() == Code::kConflict && options.if_match.empty() && attempt == 0)
      continue;
    return r;
  }
}

Result<std::unique_ptr<store::Writer>> NodeStore::create(std::string_view key,
                                                         const store::WriteOptions&) {
  return fail(Code::kUnsupported,
              "'" + std::string(key) + "': " + uri() + " is read-only; write to " + impl_->root);
}

Status NodeStore::remove(std::string_view key) {
  return fail(Code::kUnsupported,
              "'" + std::string(key) + "': " + uri() + " is read-only; remove from " + impl_->root);
}

Result<store::ListPage> NodeStore::list(const store::ListOptions& options) {
  Json body{{"root", impl_->root},
            {"prefix", options.prefix},
            {"continuation", options.continuation},
            {"max_keys", options.max_keys}};
  SLUICE_ASSIGN_OR_RETURN(Frame f, impl_->client->impl().call_frame(FrameType::kList, body));
  SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(f.json));
  store::ListPage page;
  SLUICE_ASSIGN_OR_RETURN(page.next_token, get_string_or(j, "next", ""));
  auto objects = j.find("objects");
  if (objects == j.end() || !objects->is_array())
    return fail(Code::kCorruption, "sluiced: a listing without objects");
  for (const Json& o : *objects) {
    store::ObjectInfo info;
    SLUICE_ASSIGN_OR_RETURN(info.key, get_string(o, "key"));
    SLUICE_ASSIGN_OR_RETURN(info.size, get_u64(o, "size"));
    SLUICE_ASSIGN_OR_RETURN(info.etag, get_string(o, "etag"));
    if (o.contains("mtime_ns") && o["mtime_ns"].is_number_integer())
      info.mtime_ns = o["mtime_ns"].get<int64_t>();
    if (!info.key.starts_with(options.prefix))
      return fail(Code::kCorruption,
                  "sluiced: listed '" + info.key + "' outside prefix '" + options.prefix + "'");
    page.objects.push_back(std::move(info));
  }
  if (auto skipped = j.find("skipped"); skipped != j.end() && skipped->is_array()) {
    for (const Json& s : *skipped) {
      store::SkippedKey k;
      SLUICE_ASSIGN_OR_RETURN(k.key, get_string(s, "key"));
      SLUICE_ASSIGN_OR_RETURN(k.reason, get_string(s, "reason"));
      if (!k.key.starts_with(options.prefix))
        return fail(Code::kCorruption,
                    "sluiced: skipped '" + k.key + "' outside prefix '" + options.prefix + "'");
      page.skipped.push_back(std::move(k));
    }
  }
  return page;
}

namespace {

// At most the bytes `s` takes as a JSON string: a control byte is written as \u00XX, '"'
// and '\\' with a backslash, and a byte that is not valid UTF-8 may become U+FFFD (3 bytes).
size_t json_string_bytes(std::string_view s) {
  size_t n = 2;
  for (unsigned char c : s) n += c < 0x20 ? 6 : c >= 0x80 ? 3 : (c == '"' || c == '\\') ? 2 : 1;
  return n;
}

}  // namespace

void* NodeStore::find_capability(const std::type_info& type) {
  if (type == typeid(cache::ReadAhead)) return static_cast<cache::ReadAhead*>(this);
  if (type == typeid(NodeStore)) return this;
  return nullptr;
}

Status NodeStore::declare(std::span<const cache::PlannedRead> order) {
  // Frames stay within half of kMaxJsonBytes, escaping counted.
  constexpr size_t kBatchBytes = kMaxJsonBytes / 2;
  while (!order.empty()) {
    Json reads = Json::array();
    size_t bytes = 0, n = 0;
    for (; n < order.size() && n < kMaxDeclareReads && bytes < kBatchBytes; ++n) {
      SLUICE_RETURN_IF_ERROR(store::validate_key(order[n].key));
      reads.push_back(Json::array({order[n].key, order[n].offset, order[n].length}));
      bytes += json_string_bytes(order[n].key) + 48;  // two numbers, brackets, commas
    }
    auto reply = impl_->client->impl().call_frame(
        FrameType::kDeclare, Json{{"root", impl_->root}, {"reads", std::move(reads)}});
    if (!reply) return std::unexpected(reply.error());
    order = order.subspan(n);
  }
  return ok();
}

uint64_t NodeStore::chunk_size() const {
  return impl_->client->daemon().chunk_size;
}

bool NodeStore::keeps_chunks() const {
  return true;
}

std::string NodeStore::uri() const {
  return "node+" + impl_->root;
}
const DaemonInfo& NodeStore::daemon() const {
  return impl_->client->daemon();
}
NodeClient& NodeStore::client() {
  return *impl_->client;
}

NodeReadStats NodeStore::read_stats() const {
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  return NodeReadStats{r(impl_->handoff_chunks), r(impl_->handoff_bytes), r(impl_->inline_bytes),
                       r(impl_->retries)};
}

bool no_daemon_listens(const Error& error) {
  return error.code() == Code::kUnavailable &&
         (error.sys_errno() == ENOENT || error.sys_errno() == ECONNREFUSED);
}

void register_scheme() {
  for (const std::string& scheme : store::registered_schemes()) {
    if (scheme.starts_with("node+") || scheme.starts_with("cache+")) continue;
    store::register_scheme(
        "node+" + scheme,
        [](std::string_view uri,
           const store::StoreOptions& so) -> Result<std::unique_ptr<store::Store>> {
          std::string root(uri.substr(5));
          NodeOptions o;
          if (const auto* given = so.backend.get<NodeOptions>()) o = *given;
          auto s = NodeStore::open(root, o);
          if (s) return std::unique_ptr<store::Store>(std::move(*s));
          if (!o.fallback || s.error().code() != Code::kUnavailable)
            return std::unexpected(s.error());
          if (!no_daemon_listens(s.error()))
            return std::unexpected(
                Error(Code::kUnavailable,
                      s.error().message() +
                          "; not read through the embedded cache instead, which could reach "
                          "another S3 server than the daemon's",
                      s.error().sys_errno()));
          if (o.on_fallback) o.on_fallback(s.error().message() + ": using the embedded cache");
          cache::register_scheme();
          return store::open_store("cache+" + root, so);
        });
  }
}

}  // namespace sluice::node
