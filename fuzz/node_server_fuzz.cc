// Node-protocol requests as sluiced serves them (the JSON bodies of docs/formats/
// node-protocol.md). One NodeServer runs in the process: its cache in /dev/shm, one team
// (this process's uid) granted only two fuzz:// roots, and behind every fuzz:// root the same
// memory store holding a few objects, so nothing leaves the process. Each input is one
// connection's requests, a line each: "TYPE JSON" (TYPE the request type's number). The
// harness frames each with a valid header and checksum (node_frame_fuzz covers broken
// frames), sends it and waits for its reply. A request may fail; the daemon must answer
// every one with its request id, and stay up.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <thread>

#include "fuzz_util.h"
#include "node/frame.h"
#include "sluice/node/server.h"
#include "sluice/store/wrapper.h"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

struct Daemon {
  std::string dir;
  std::unique_ptr<node::NodeServer> server;
  std::thread serving;
};
Daemon* daemon_ = nullptr;

std::shared_ptr<store::Store> backing() {
  static const std::shared_ptr<store::Store> s = [] {
    std::shared_ptr<store::Store> m = store::make_memory_store("fuzz");
    auto put = [&](const std::string& key, size_t n) {
      std::vector<std::byte> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = std::byte(i * 31 + key.size());
      auto w = m->create(key, {});
      if (!w || !(*w)->append(b) || !(*w)->commit()) std::abort();
    };
    put("a/small.bin", 10);
    put("a/chunked.bin", 300 << 10);  // several 64 KiB chunks, a whole chunk handed off
    put("train/shard-000000.tar", 4096);
    put("empty", 0);
    return m;
  }();
  return s;
}

UniqueFd connect_to(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), std::min(path.size(), sizeof a.sun_path - 1));
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return {};
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  store::register_scheme(
      "fuzz",
      [](std::string_view, const store::StoreOptions&) -> Result<std::unique_ptr<store::Store>> {
        return std::unique_ptr<store::Store>(std::make_unique<store::StoreWrapper>(backing()));
      });
  daemon_ = new Daemon;
  daemon_->dir = "/dev/shm/sluice-fuzz-node-" + std::to_string(::getpid());
  std::filesystem::remove_all(daemon_->dir);
  std::filesystem::create_directories(daemon_->dir);
  node::ServerOptions o;
  o.socket_path = daemon_->dir + "/sluiced.sock";
  o.cache.directory = daemon_->dir + "/cache";
  o.cache.ram_bytes = 8 << 20;
  o.cache.disk_bytes = 32 << 20;
  o.cache.chunk_size = 64 << 10;
  o.cache.prefetch_threads = 1;
  o.teams = {{.name = "fuzz", .uids = {::getuid()}, .roots = {"fuzz://b", "fuzz://c/data"}}};
  // Each input's connection ends as the next one begins: never refused for their number.
  o.max_connections = 4096;
  o.max_connections_per_uid = 4096;
  o.frame_timeout = 2s;
  o.idle_timeout = 5s;
  o.handoff_min_bytes = 64 << 10;
  o.max_inline_bytes = 1 << 20;
  o.max_window_bytes = 16 << 20;
  auto s = node::NodeServer::open(std::move(o));
  if (!s) {
    std::fprintf(stderr, "node_server_fuzz: %s\n", s.error().to_string().c_str());
    std::abort();
  }
  daemon_->server = std::move(*s);
  daemon_->serving = std::thread([] { (void)daemon_->server->serve(); });
  std::atexit([] {
    daemon_->server->stop();
    daemon_->serving.join();
    daemon_->server.reset();
    std::filesystem::remove_all(daemon_->dir);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = fuzz::text_of(data, size);
  UniqueFd fd = connect_to(daemon_->dir + "/sluiced.sock");
  SLUICE_FUZZ_CHECK(fd.valid(), "the daemon accepts a connection");
  node::FrameChannel ch(std::move(fd));
  for (uint64_t id = 1; !text.empty() && id <= 64; ++id) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    uint16_t type = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), type);
    if (ec != std::errc()) continue;
    node::Frame req;
    req.type = type;
    req.request_id = id;
    req.json = std::string(line.substr(static_cast<size_t>(p - line.data())));
    if (req.json.size() > node::kMaxJsonBytes) continue;
    if (!ch.send(req, 5s)) break;  // the daemon closed the connection
    auto reply = ch.receive(8s, 8s);
    SLUICE_FUZZ_CHECK(reply.has_value() && reply->has_value(),
                      "the daemon answers a well-framed request");
    const node::Frame& r = **reply;
    SLUICE_FUZZ_CHECK(r.request_id == id, "a reply carries its request's id");
    SLUICE_FUZZ_CHECK(r.type == node::response_type(static_cast<node::FrameType>(type)) ||
                          r.type == static_cast<uint16_t>(node::FrameType::kError),
                      "a reply is the request's response or an error");
  }
  return 0;
}
