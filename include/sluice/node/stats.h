// sluice/node/stats.h: what the node daemon reports about itself (its CACHE_STAT reply),
// as a type: the cache's figures, what its server did, what it charged, its peers and where
// its bytes came from. The CLI (`sluice cache stat`), the control API, the page and the
// Kubernetes driver read it through to_json / daemon_stats_from_json; the JSON's fields are
// documented in docs/formats/daemon-stats.md. Plain data, no link dependency: the cache's
// Control carries it (cache::DaemonStatus).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/cache/tiered_cache.h"
#include "sluice/core/status.h"

namespace sluice::node {

// What the daemon's socket server did since it started.
struct ServerStats {
  uint64_t connections = 0, connections_refused = 0, requests = 0, request_errors = 0;
  uint64_t handoff_chunks = 0, handoff_bytes = 0, inline_bytes = 0;
  uint64_t window_bytes = 0;   // of inline_bytes, those written into a reply window
  uint64_t windows_bytes = 0;  // reply windows made, all connections together
};

// Charging of the NVMe tier's chunks to teams (ledger::CacheChargerStats), with a ledger.
struct ChargingStats {
  std::string ledger;  // which (Ledger::describe)
  uint64_t admitted_chunks = 0, admitted_bytes = 0, refused_chunks = 0, refused_bytes = 0;
  uint64_t freed_bytes = 0, uncharged_chunks = 0, flush_errors = 0;
};

// One member of the job's daemons, as this daemon sees it (peer::PeerState).
struct PeerStatus {
  std::string name, address;
  bool self = false, up = true;
  std::string state;  // "self", "down", "untried" or "up"
  uint64_t fetched_chunks = 0, fetched_bytes = 0, errors = 0;
  std::string last_error;
};

struct DaemonStats {
  cache::CacheStats cache;
  uint64_t chunk_size = 0;
  ServerStats server;
  std::optional<ChargingStats> charging;       // none: no ledger
  std::vector<PeerStatus> peers;               // empty: no peers
  uint64_t backing_bytes = 0, peer_bytes = 0;  // bytes fetched from the sources, from peers
};

// The cache's fields at the top level (sluice/cache/json.h), then "chunk_size", "server",
// "charging" (null without a ledger), "peers" and "bytes_from": {"backing", "peer"}.
void to_json(nlohmann::json& j, const DaemonStats& s);
// The other way. A field missing (a daemon older than this reader) reads as 0, "" or empty;
// one of the wrong type, or a reply that is not an object, is Corruption naming it.
Result<DaemonStats> daemon_stats_from_json(const nlohmann::json& j);

}  // namespace sluice::node
