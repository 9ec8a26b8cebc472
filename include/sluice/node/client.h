// sluice/node/client.h: reading through the node daemon (sluiced) from any process.
//
//   node::NodeOptions o;  o.socket = "/run/sluice/sluiced.sock";
//   auto s = node::NodeStore::open("s3://bucket/data", o).value();
//   s->read("shard-0001.tar", offset, buffer);   // the node's cache, shared by every process
//
// or by URI, once node::register_scheme() has run: open_store("node+s3://bucket/data", so)
// with NodeOptions in so.backend. A NodeStore is a read-only Store over one root (a backing
// store's URI) of the daemon's cache. Whole chunks the daemon has on NVMe arrive as file
// descriptors and are read here with io::FileHandle (O_DIRECT, io_uring), then checked
// against their XXH3 checksum; a mismatch is asked for again as bytes, which makes the
// daemon verify, drop and refetch the chunk. Everything else arrives inline.
//
// Contract:
// - Reads of one call come from one version of the object (pinned by etag); if it changes
//   midway the read starts over once, then fails Conflict. Writes and removals are
//   Unsupported: write to the backing store.
// - Connections are pooled; a connection the daemon closed is replaced once per call. A
//   daemon that is gone is Unavailable.
// - Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sluice/cache/control.h"
#include "sluice/cache/read_ahead.h"
#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::io {
class Context;
struct Buffer;
}  // namespace sluice::io

namespace sluice::node {

struct NodeOptions {
  std::string socket;                                           // the daemon's Unix socket
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // per request
  // The data path for handed-off chunks; null: one opened on first use. handoff_parallel
  // threads of the store read and check handed-off chunks at once (a reply carries up to 64).
  std::shared_ptr<io::Context> io;
  unsigned handoff_parallel = 4;
  // Bytes of the shared-memory reply window each connection asks the daemon for: inline
  // read bytes are then written there by the daemon and copied out by the reader, instead
  // of crossing the socket. 0: no window (the bytes come in the reply frames).
  uint64_t window_bytes = 8 << 20;
  // For node+ URIs: where no daemon listens on the socket (no_daemon_listens), open the
  // embedded cache (cache+<uri>, with the CacheOptions of the store options) and call
  // on_fallback with the reason. false: Unavailable. A daemon that is there but refuses
  // (too many connections), times out or fails is never bypassed: the embedded cache
  // would read s3:// from this process's own endpoint (the default AWS one when it was
  // given none), another server than the daemon's, with this process's credentials.
  bool fallback = true;
  std::function<void(const std::string&)> on_fallback;
  // The S3 endpoint this process was told to read s3:// from (empty: none given, the
  // daemon's serves). Opening an s3:// root through a daemon that reads another endpoint is
  // refused (InvalidArgument), never served from the other server.
  std::string s3_endpoint;
};

struct NodeReadStats {
  uint64_t handoff_chunks = 0, handoff_bytes = 0;  // read from descriptors
  uint64_t inline_bytes = 0;                       // sent by the daemon
  uint64_t checksum_retries = 0;                   // handed-off chunks that failed their check
};

// What the daemon said when a connection opened.
struct DaemonInfo {
  std::string team, directory;
  uint64_t chunk_size = 0;
  int64_t pid = 0;
  bool windows = false;     // it maps reply windows (WINDOW)
  std::string s3_endpoint;  // where it reads s3:// roots from (empty: it did not say)
};

class NodeClient;

class NodeStore final : public store::Store, public cache::ReadAhead {
 public:
  static Result<std::unique_ptr<NodeStore>> open(std::string root_uri, NodeOptions options);
  ~NodeStore() override;

  Result<store::ObjectInfo> stat(std::string_view key) override;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options = {}) override;
  // As read, into host memory or memory of a device target (io::Buffer::on a CUDA or
  // emulated-device allocation): a handed-off chunk is read with O_DIRECT into one of the
  // target's staging buffers (page-locked for CUDA), checked against its XXH3 there, then
  // copied to the device; inline bytes are copied from the reply. Never through cuFile,
  // which would leave the bytes unchecked. Returns the bytes read (fewer only at the end
  // of the object); every copy is complete when it returns.
  Result<size_t> read_into(std::string_view key, uint64_t offset, const io::Buffer& dst,
                           const store::ReadOptions& options = {});
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override;
  Result<store::ListPage> list(const store::ListOptions& options) override;
  Status remove(std::string_view key) override;
  std::string uri() const override;

  // The reads to come, for the daemon's cache to fetch ahead (sent in frames of at most
  // kMaxDeclareReads reads; keys under this store's root).
  // ReadAhead and NodeStore (read_stats) through any decorator.
  void* find_capability(const std::type_info& type) override;
  Status declare(std::span<const cache::PlannedRead> order) override;
  uint64_t chunk_size() const override;
  // true: sluiced keeps chunks in its RAM tier (1 GiB by default). The daemon does not say
  // its --cache-ram, so one run with none is taken to have it too.
  bool keeps_chunks() const override;

  const DaemonInfo& daemon() const;
  NodeReadStats read_stats() const;
  NodeClient& client();

  struct Impl;

 private:
  explicit NodeStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A connection pool to one daemon, for requests by type and JSON body (the CLI's cache
// commands). Thread-safe.
class NodeClient {
 public:
  // Connects and says hello: Unavailable where no daemon answers, PermissionDenied where
  // it refuses this uid.
  static Result<std::unique_ptr<NodeClient>> connect(std::string socket,
                                                     std::chrono::milliseconds timeout);
  ~NodeClient();

  struct Reply;
  // Sends a request (a FrameType of the protocol) and waits for its reply's JSON body;
  // an error reply is returned as its error.
  Result<std::string> call(uint16_t type, const std::string& json);

  // The daemon's cache and server counters, as the JSON body of its CACHE_STAT reply
  // (docs/formats/node-protocol.md).
  Result<std::string> cache_stat();

  // Makes bytes [offset, offset + length) of `key` in `root` resident in the daemon's
  // cache (whole chunks; the tiers decide what they keep) without carrying any of them
  // here: one WARM request per 64 MiB.
  Result<cache::Warmed> warm(const std::string& root, const std::string& key, uint64_t offset,
                             uint64_t length);

  // Drops (evict) or pins / unpins (pin) every cached chunk under `prefix` of `root`, as
  // the caller's team may: the number of chunks.
  Result<uint64_t> evict(const std::string& root, const std::string& prefix);
  Result<uint64_t> pin(const std::string& root, const std::string& prefix, bool pinned);
  // The cached chunks under `prefix` of `root` (root empty: of every root the team may
  // read); each chunk's `store` is its root.
  Result<cache::ChunkListing> chunks(const std::string& root, const std::string& prefix);

  const DaemonInfo& daemon() const;

  struct Impl;
  Impl& impl();

 private:
  explicit NodeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The daemon's cache as a cache::Control (sluice cache ... through sluiced). verify() is
// Unavailable: the daemon checks every chunk it reads, and only it may open the directory.
class DaemonControl final : public cache::Control {
 public:
  DaemonControl(std::unique_ptr<NodeClient> client, std::string socket);
  ~DaemonControl() override;

  Result<cache::ControlStatus> status() override;
  Result<cache::ChunkListing> chunks(std::string_view store_uri, std::string_view prefix) override;
  Result<cache::Warmed> warm(std::string_view store_uri, std::string_view key, uint64_t offset,
                             uint64_t length) override;
  Result<uint64_t> evict(std::string_view store_uri, std::string_view prefix) override;
  Result<uint64_t> pin(std::string_view store_uri, std::string_view prefix, bool pinned) override;
  Result<cache::VerifyReport> verify() override;
  Result<std::shared_ptr<store::Store>> store(std::string_view store_uri) override;

  NodeClient& client() { return *client_; }

 private:
  std::unique_ptr<NodeClient> client_;
  std::string socket_;
};

// Whether `error` (of NodeClient::connect or a node+ open) says that nothing listens on
// the socket: no socket file, or nobody accepting on it. Only then does a node+ open fall
// back to the embedded cache; a daemon that answered and refused, or hung, is an error.
bool no_daemon_listens(const Error& error);

// Registers "node+<scheme>://" for every scheme open_store knows now.
void register_scheme();

}  // namespace sluice::node
