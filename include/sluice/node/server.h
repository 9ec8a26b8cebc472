// sluice/node/server.h: the node daemon's service: one TieredCache for every process on
// the node, served over a Unix domain socket (docs/formats/node-protocol.md).
//
//   node::ServerOptions o;
//   o.socket_path = "/run/sluice/sluiced.sock";  o.cache.directory = "/nvme/sluice";
//   auto server = node::NodeServer::open(std::move(o)).value();
//   std::thread t([&] { (void)server->serve(); });   ... server->stop(); t.join();
//
// Clients name a root (the backing store's URI, "s3://bucket/prefix") and a key under it.
// The daemon opens each root once, with its own credentials, behind one cache: chunks of
// every root share the cache's budget and single-flight, so eight processes reading one
// chunk cause one backing read. A read of a whole chunk that lies on NVMe is answered
// with the chunk file's descriptor (SCM_RIGHTS) and extent, which the client reads with
// its own data path; everything else is sent inline.
//
// Contract:
// - Callers are authenticated by their uid (SO_PEERCRED) and mapped to a team; a uid in no
//   team is refused at connect. A team reads only the roots granted to it. With no teams
//   configured, the daemon's own uid is the one team ("default") with every root.
// - Every request is checked before it is acted on: frame lengths and checksum, JSON
//   types, keys (store::validate_key), roots (no "." or ".." components). A bad request
//   gets an error reply naming the cause; a malformed frame closes that connection. None
//   stops the daemon.
// - Bounded: at most max_connections at once (max_connections_per_uid for one uid), a frame
//   must arrive within frame_timeout once begun, an idle connection is closed after
//   idle_timeout, and at most max_inline_reads inline replies are buffered at once.
// - One daemon per socket and per cache directory: open() fails Unavailable where another
//   answers on the socket or holds the directory. A socket left by a dead daemon is
//   replaced.
// - stop() may be called from any thread; serve() then returns after every connection
//   has closed, and the cache's queued NVMe writes are finished when the server is
//   destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/tiered_cache.h"
#include "sluice/store/store.h"

namespace sluice::node {

struct TeamGrant {
  std::string name;
  std::vector<uint32_t> uids;
  // Root URI prefixes this team may read ("s3://bucket/", "file:///data/"); "*": any.
  std::vector<std::string> roots;
};

struct ServerOptions {
  std::string socket_path;
  // The node's cache; its store_id is set to "sluiced". A directory is required.
  cache::CacheOptions cache;
  // How roots are opened (S3 credentials and endpoint in backend options).
  store::StoreOptions stores;
  std::vector<TeamGrant> teams;  // empty: the daemon's own uid, every root
  unsigned max_connections = 256;
  unsigned max_connections_per_uid = 64;
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds frame_timeout{std::chrono::seconds(10)};
  // Whole chunks at least this long are handed off as descriptors when on NVMe.
  uint64_t handoff_min_bytes = 256 << 10;
  uint64_t max_inline_bytes = 8 << 20;  // inline bytes in one reply (at most 16 MiB)
  unsigned max_inline_reads = 32;
  // One line per refused caller and failed request; null: silent.
  std::function<void(std::string_view)> log;
};

struct ServerStats {
  uint64_t connections = 0, connections_refused = 0, requests = 0, request_errors = 0;
  uint64_t handoff_chunks = 0, handoff_bytes = 0, inline_bytes = 0;
};

class NodeServer {
 public:
  static Result<std::unique_ptr<NodeServer>> open(ServerOptions options);
  ~NodeServer();

  // Accepts and serves connections until stop().
  Status serve();
  void stop();

  ServerStats stats() const;
  cache::TieredCache& cache();

  struct Impl;

 private:
  explicit NodeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks and normalises a root URI: "scheme://rest" with no empty, "." or ".." component
// in rest, no trailing '/'. InvalidArgument otherwise.
Result<std::string> normalize_root(std::string_view uri);
// Whether `root` (normalised) is under `grant` ("*", or a prefix ending at a component).
bool root_granted(std::string_view root, std::string_view grant);

}  // namespace sluice::node
