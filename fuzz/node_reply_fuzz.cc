// sluiced's replies as the library's clients read them (docs/formats/node-protocol.md):
// NodeClient's hello, NodeStore's stat, list, read (inline, in the reply window, handed-off
// descriptors) and declare, and DaemonControl's warm, pin, evict, chunks and status. A fake
// daemon in the process listens on a Unix socket under /dev/shm and answers each request it
// gets, in order, with the next reply of the input, framed right (node_frame_fuzz covers
// broken frames) and with the request's id.
//
// The input is sections separated by "\n--\n". Each starts with a line naming what the
// client does when the harness reaches it: open (NodeStore::open of s3://bucket/data,
// whose hello is this reply), stat, list, read, declare, warm, pin, evict, chunks, status,
// or anything else (nothing: the reply only waits its turn); the first section is always
// the hello of the DaemonControl's connection. The rest of a section is its reply: leading
// flags ('!' an error frame, '+' a sealed 8 KiB memfd rides along with the data at 4 KiB
// (a reply window, or a chunk to hand off), '~' another request's id, '0' request id 0, '.'
// the connection closed instead of a reply), the JSON body, and optionally "\n@" and the
// frame's data. Requests beyond the replies find the connection closed.
// Beyond "no crash": what a call returns stays within what it asked for (the key stat'ed,
// the prefix listed, the buffer read into).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "fuzz_util.h"
#include "node/frame.h"
#include "sluice/cache/read_ahead.h"
#include "sluice/io/file_handle.h"
#include "sluice/node/client.h"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

constexpr size_t kMaxInput = 256 << 10;
constexpr size_t kWindowBytes = 8192;

struct Reply {
  bool error = false, fd = false, other_id = false, id_zero = false, hang_up = false;
  std::string json, data;
};

// The fake daemon: one thread polling the listening socket and every connection.
struct FakeDaemon {
  std::string dir, socket;
  UniqueFd listener;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex mu;
  std::deque<Reply> replies;  // guarded by mu

  // Answers one request on `ch`; false: the connection is to be closed.
  bool answer(node::FrameChannel& ch) {
    auto req = ch.receive(100ms, 2s);
    if (!req || !*req) return false;
    Reply r;
    {
      std::lock_guard lock(mu);
      if (replies.empty()) return false;
      r = std::move(replies.front());
      replies.pop_front();
    }
    if (r.hang_up) return false;
    node::Frame out;
    out.type = r.error ? static_cast<uint16_t>(node::FrameType::kError)
                       : node::response_type(static_cast<node::FrameType>((*req)->type));
    out.request_id = r.id_zero ? 0 : (*req)->request_id + (r.other_id ? 1 : 0);
    out.json = std::move(r.json);
    out.data.resize(r.data.size());
    if (!r.data.empty()) std::memcpy(out.data.data(), r.data.data(), r.data.size());
    if (r.fd) {
      auto w = node::Window::create(kWindowBytes);
      if (w) {
        auto bytes = w->writable().subspan(node::Window::kHeaderBytes);
        std::memcpy(bytes.data(), r.data.data(), std::min(bytes.size(), r.data.size()));
        out.fds.emplace_back(::fcntl(w->fd().get(), F_DUPFD_CLOEXEC, 0));
      }
    }
    return ch.send(out, 2s).has_value();
  }

  void serve() {
    std::vector<std::unique_ptr<node::FrameChannel>> conns;
    for (;;) {
      std::vector<pollfd> p = {{listener.get(), POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (const auto& c : conns) p.push_back({c->fd(), POLLIN, 0});
      if (::poll(p.data(), p.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents) return;
      std::vector<std::unique_ptr<node::FrameChannel>> kept;
      for (size_t i = 0; i < conns.size(); ++i)
        if (!p[i + 2].revents || answer(*conns[i])) kept.push_back(std::move(conns[i]));
      conns = std::move(kept);
      if (p[0].revents & POLLIN) {
        int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) conns.push_back(std::make_unique<node::FrameChannel>(UniqueFd(fd)));
      }
    }
  }
};
FakeDaemon* daemon_ = nullptr;

std::shared_ptr<io::Context> io_context() {
  static const std::shared_ptr<io::Context> ctx = [] {
    auto c = io::Context::open({});
    if (!c) std::abort();
    return *c;
  }();
  return ctx;
}

Reply parse_reply(std::string_view text) {
  Reply r;
  for (; !text.empty(); text.remove_prefix(1)) {
    const char c = text.front();
    if (c == '!')
      r.error = true;
    else if (c == '+')
      r.fd = true;
    else if (c == '~')
      r.other_id = true;
    else if (c == '0')
      r.id_zero = true;
    else if (c == '.')
      r.hang_up = true;
    else
      break;
  }
  const size_t at = text.find("\n@");
  r.json = std::string(text.substr(0, at));
  if (at != std::string_view::npos) r.data = std::string(text.substr(at + 2));
  if (r.json.size() > node::kMaxJsonBytes) r.json.resize(node::kMaxJsonBytes);
  return r;
}

struct Section {
  std::string op;
  Reply reply;
};

std::vector<Section> sections_of(std::string_view text) {
  std::vector<Section> out;
  while (out.size() < 64) {
    const size_t sep = text.find("\n--\n");
    std::string_view s = text.substr(0, sep);
    const size_t nl = s.find('\n');
    out.push_back({std::string(s.substr(0, nl)),
                   parse_reply(nl == std::string_view::npos ? "" : s.substr(nl + 1))});
    if (sep == std::string_view::npos) break;
    text.remove_prefix(sep + 4);
  }
  return out;
}

const std::string kRoot = "s3://bucket/data";

void act(const std::string& op, node::DaemonControl& control, std::unique_ptr<node::NodeStore>& s) {
  if (op == "open") {
    node::NodeOptions o;
    o.socket = daemon_->socket;
    o.timeout = 2s;
    o.io = io_context();
    o.handoff_parallel = 2;
    o.window_bytes = kWindowBytes;
    o.fallback = false;
    o.s3_endpoint = "http://127.0.0.1:9000";
    auto opened = node::NodeStore::open(kRoot, o);
    if (opened) s = std::move(*opened);
    return;
  }
  if (op == "warm") {
    if (auto w = control.warm(kRoot, "a/b", 4096, 1 << 20))
      SLUICE_FUZZ_CHECK(w->end >= 4096, "a warm ends no earlier than it began");
  } else if (op == "pin") {
    (void)control.pin(kRoot, "a/", true);
  } else if (op == "evict") {
    (void)control.evict(kRoot, "a/");
  } else if (op == "chunks") {
    (void)control.chunks(kRoot, "a/");
  } else if (op == "status") {
    (void)control.status();
  }
  if (!s) return;
  if (op == "stat") {
    if (auto info = s->stat("a/b")) SLUICE_FUZZ_CHECK(info->key == "a/b", "stat names its key");
  } else if (op == "list") {
    store::ListOptions lo;
    lo.prefix = "a/";
    lo.max_keys = 100;
    if (auto page = s->list(lo)) {
      for (const auto& o : page->objects)
        SLUICE_FUZZ_CHECK(o.key.starts_with("a/"), "a listing stays within its prefix");
      for (const auto& k : page->skipped)
        SLUICE_FUZZ_CHECK(k.key.starts_with("a/"), "a listing's skipped keys are in its prefix");
    }
  } else if (op == "read") {
    std::vector<std::byte> buf(256);
    if (auto n = s->read("a/b", 100, buf)) SLUICE_FUZZ_CHECK(*n <= buf.size(), "a read fits");
  } else if (op == "declare") {
    std::vector<cache::PlannedRead> reads = {{"a/b", 0, 4096}, {"a/c", 65536, 100}};
    (void)s->declare(reads);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  daemon_ = new FakeDaemon;
  daemon_->dir = "/dev/shm/sluice-fuzz-reply-" + std::to_string(::getpid());
  std::filesystem::remove_all(daemon_->dir);
  std::filesystem::create_directories(daemon_->dir);
  daemon_->socket = daemon_->dir + "/sluiced.sock";
  daemon_->listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, daemon_->socket.c_str(), daemon_->socket.size() + 1);
  if (!daemon_->listener.valid() ||
      ::bind(daemon_->listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(daemon_->listener.get(), 64) != 0 || ::pipe2(daemon_->wake, O_CLOEXEC) != 0) {
    std::perror("node_reply_fuzz: the fake daemon's socket");
    std::abort();
  }
  daemon_->thread = std::thread([] { daemon_->serve(); });
  std::atexit([] {
    (void)::write(daemon_->wake[1], "x", 1);
    daemon_->thread.join();
    std::filesystem::remove_all(daemon_->dir);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  std::vector<Section> sections = sections_of(fuzz::text_of(data, size));
  {
    std::lock_guard lock(daemon_->mu);
    daemon_->replies.clear();
    for (Section& s : sections) daemon_->replies.push_back(std::move(s.reply));
  }
  if (auto client = node::NodeClient::connect(daemon_->socket, 2s)) {
    node::DaemonControl control(std::move(*client), daemon_->socket);
    std::unique_ptr<node::NodeStore> store;
    for (size_t i = 1; i < sections.size(); ++i) act(sections[i].op, control, store);
  }
  std::lock_guard lock(daemon_->mu);
  daemon_->replies.clear();
  return 0;
}
