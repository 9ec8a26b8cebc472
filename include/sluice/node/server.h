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
// - The cache is filled with the daemon's own credentials. A team with credentials of its
//   own is served a key, cached or not, only after those credentials stat it (a listing:
//   list it), remembered for access_ttl; a refusal is PermissionDenied naming the team.
// - Every request is checked before it is acted on: frame lengths and checksum, JSON
//   types, keys (store::validate_key), roots (no "." or ".." components). A bad request
//   gets an error reply naming the cause; a malformed frame closes that connection. None
//   stops the daemon.
// - Bounded: at most max_connections at once (max_connections_per_uid for one uid), a frame
//   must arrive within frame_timeout once begun, an idle connection is closed after
//   idle_timeout, at most max_inline_reads inline replies are buffered at once, and reply
//   windows hold at most max_window_bytes.
// - One daemon per socket and per cache directory: open() fails Unavailable where another
//   answers on the socket or holds the directory. A socket left by a dead daemon is
//   replaced.
// - Peers (PeerConfig): the chunks of every root are owned by the job's daemons by
//   rendezvous hashing; a miss asks the owner (peer::PeerStore) before the backing store,
//   and this daemon serves the chunks it owns to the others on its HTTP port, after
//   checking the node secret's signature. Peer requests read through this daemon's cache
//   with its own credentials and never go on to a third daemon. A local file is served to
//   peers only under PeerConfig::file_roots (none by default): no caller's rights can be
//   checked for a peer, so a team's grant of a file root never extends to them.
// - A local file is read only as the file the caller's access check opened: its device and
//   inode must be those of the version served (the file store's etag holds them), else the
//   request fails Conflict naming the key, so a file swapped for another (a rename, a
//   symlink) between the check and the read is never read with the daemon's rights.
// - With a ledger (ServerOptions::ledger), every chunk kept on NVMe is charged to the team
//   owning its object's project (tier nvme, kind cache; ledger/cache_charger.h), and a
//   team past its quota gets its reads served without its chunks being kept.
// - stop() may be called from any thread; serve() then returns after every connection
//   has closed, and the cache's queued NVMe writes are finished when the server is
//   destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/tiered_cache.h"
#include "sluice/ledger/ledger.h"
#include "sluice/node/stats.h"
#include "sluice/peer/membership.h"
#include "sluice/peer/peer_store.h"
#include "sluice/store/store.h"

namespace sluice::node {

struct TeamGrant {
  std::string name;
  std::vector<uint32_t> uids;
  // Root URI prefixes this team may read ("s3://bucket/", "file:///data/"); "*": any.
  std::vector<std::string> roots;
  // The team's own credentials (its S3 keys in backend options). When set, the daemon
  // serves the team an object (cached or not) only after a stat with these options proves
  // the team may read it, and a listing only after a list with them succeeds; the answer
  // is remembered for ServerOptions::access_ttl. Unset: the root grants decide alone.
  std::optional<store::StoreOptions> credentials;
};

// The daemon's HTTP port: chunks for the other daemons of the job and /metrics.
struct PeerConfig {
  bool listen = false;             // serve HTTP at all
  std::string host = "127.0.0.1";  // IPv4 literal to listen on
  uint16_t port = 0;               // 0: any free port (NodeServer::peer_port says which)
  // The job's daemons, this one among them; null: no peers (the backing store only).
  std::shared_ptr<const peer::Membership> membership;
  std::string secret;  // the node secret shared by the job's daemons; required with peers
  std::chrono::milliseconds timeout{10000};     // one chunk from a peer
  std::chrono::milliseconds retry_after{5000};  // a failed peer is skipped this long
  unsigned max_connections = 256;               // HTTP connections at once, one thread each
  unsigned max_per_ip = 64;  // from one address (daemons sharing a host share it)
  // The object space the job's members keep on this node (checkpoints' peer tier), served
  // on the HTTP port with peers; empty: none. peer/object_store.h is its client.
  std::string objects_directory;
  // file:// roots whose chunks this daemon serves to its peers and asks them for
  // ("file:///shared/datasets/"), checked as the directories they resolve to; a root a
  // request names must lie within one. Read with the daemon's own rights (no caller's
  // rights can be checked for a peer): grant only files every member's users may read.
  // Empty (the default): no local file is served to a peer, nor asked of one. "*" is refused.
  std::vector<std::string> file_roots;
};

struct ServerOptions {
  std::string socket_path;
  // The node's cache; its store_id, when empty, is set to "sluiced" (sluiced sets "sluiced at
  // ENDPOINT", so chunks cached from one S3 server are never served for another's bucket of
  // the same name after a restart with another endpoint). A directory is required.
  cache::CacheOptions cache;
  // How roots are opened (S3 credentials and endpoint in backend options).
  store::StoreOptions stores;
  // The S3 endpoint s3:// roots are read from, told to every client (HELLO): a client that
  // asks for another is refused, not served another server's bucket of the same name.
  std::string s3_endpoint;
  std::vector<TeamGrant> teams;  // empty: the daemon's own uid, every root
  // How long a team's proven access (or refusal) to an object or prefix is remembered.
  std::chrono::milliseconds access_ttl{std::chrono::seconds(60)};
  unsigned max_connections = 256;
  unsigned max_connections_per_uid = 64;
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds frame_timeout{std::chrono::seconds(10)};
  // Whole chunks at least this long are handed off as descriptors when on NVMe.
  uint64_t handoff_min_bytes = 256 << 10;
  uint64_t max_inline_bytes = 8 << 20;  // inline bytes in one reply (at most 16 MiB)
  unsigned max_inline_reads = 32;
  // Shared-memory reply windows (one per connection that asks, max_inline_bytes each),
  // all connections together; past it a WINDOW request is refused and the client's inline
  // bytes come in the reply frames.
  uint64_t max_window_bytes = 512 << 20;
  PeerConfig peer;
  // Charges the NVMe tier's chunks to teams (see the contract above); null: nothing is
  // charged and every chunk may be kept.
  std::shared_ptr<ledger::Ledger> ledger;
  // One line per refused caller and failed request; null: silent.
  std::function<void(std::string_view)> log;
  // Test hook: runs once a request's access check has opened a local file as its caller
  // (with the file's path), before anything of it is read; tests swap the file here. Null:
  // nothing.
  std::function<void(const std::string& path)> file_checked;
};

// What NodeServer::drop_privileges left the daemon with.
struct Privileges {
  // Capabilities kept, permitted and effective ("cap_setuid"), and those the daemon held at
  // start and gave up.
  std::vector<std::string> kept, dropped;
  std::string why;            // why those kept are needed; empty when none is
  bool no_new_privs = false;  // PR_SET_NO_NEW_PRIVS holds in every thread
  unsigned threads = 0;       // the threads that dropped them
  // One line for the log: "kept cap_setuid, ... (why); dropped 38; ...".
  std::string describe() const;
};

class NodeServer {
 public:
  static Result<std::unique_ptr<NodeServer>> open(ServerOptions options);
  ~NodeServer();

  // Accepts and serves connections until stop().
  Status serve();
  void stop();

  ServerStats stats() const;
  // Everything the daemon reports about itself (its CACHE_STAT reply; node/stats.h).
  DaemonStats daemon_stats() const;
  cache::TieredCache& cache();
  // The HTTP port for peers and /metrics (0 when not listening), and each peer's state.
  uint16_t peer_port() const;
  std::vector<peer::PeerState> peers() const;
  // Prometheus text of the daemon's metrics (what GET /metrics answers).
  std::string metrics_text() const;

  // Gives up, in every thread of the process and for good, each capability serving does not
  // need; call it once open() has bound the socket and opened the cache, before serve().
  // Kept: CAP_SETUID and CAP_SETGID (to open a local file as its caller) and
  // CAP_DAC_READ_SEARCH (to read what a caller proved it may) where some team holding a uid
  // other than the daemon's is granted a file root; CAP_DAC_OVERRIDE where the cache or
  // objects directory is not the daemon's uid's to write. The inheritable and ambient sets
  // are emptied, the bounding set too where the daemon may, and PR_SET_NO_NEW_PRIVS is set,
  // so nothing the daemon runs can regain a capability. Every thread is made to drop them
  // (a signal each; capabilities are per thread) and checked in /proc/self/task (io_uring's
  // kernel workers aside: they only read and write descriptors already open). Internal
  // when the kernel refuses or a thread does not comply: the daemon should not serve then.
  // Changes the whole process, once: not for a process that needs its privileges after.
  Result<Privileges> drop_privileges();

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
