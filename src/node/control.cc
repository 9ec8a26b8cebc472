// The daemon's cache as a cache::Control (sluice/node/client.h), over a NodeClient.
#include <utility>

#include "node/wire.h"
#include "sluice/cache/json.h"
#include "sluice/node/client.h"
#include "sluice/node/stats.h"

namespace sluice::node {

DaemonControl::DaemonControl(std::unique_ptr<NodeClient> client, std::string socket)
    : client_(std::move(client)), socket_(std::move(socket)) {}

DaemonControl::~DaemonControl() = default;

Result<cache::ControlStatus> DaemonControl::status() {
  SLUICE_ASSIGN_OR_RETURN(std::string body, client_->cache_stat());
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kCorruption, "sluiced sent a stat reply that is not a JSON object");
  SLUICE_ASSIGN_OR_RETURN(DaemonStats stats, daemon_stats_from_json(j));
  const DaemonInfo& d = client_->daemon();
  cache::CacheStats cache = stats.cache;
  return cache::ControlStatus{std::move(cache),
                              cache::DaemonStatus{socket_, d.team, d.pid, std::move(stats)}};
}

Result<cache::ChunkListing> DaemonControl::chunks(std::string_view store_uri,
                                                  std::string_view prefix) {
  return client_->chunks(std::string(store_uri), std::string(prefix));
}

Result<cache::Warmed> DaemonControl::warm(std::string_view store_uri, std::string_view key,
                                          uint64_t offset, uint64_t length) {
  return client_->warm(std::string(store_uri), std::string(key), offset, length);
}

Result<uint64_t> DaemonControl::evict(std::string_view store_uri, std::string_view prefix) {
  return client_->evict(std::string(store_uri), std::string(prefix));
}

Result<uint64_t> DaemonControl::pin(std::string_view store_uri, std::string_view prefix,
                                    bool pinned) {
  return client_->pin(std::string(store_uri), std::string(prefix), pinned);
}

Result<cache::VerifyReport> DaemonControl::verify() {
  const DaemonInfo& d = client_->daemon();
  return fail(Code::kUnavailable, "sluiced (pid " + std::to_string(d.pid) + ") owns " +
                                      d.directory +
                                      " and checks every chunk it reads from NVMe; stop it to "
                                      "re-check the whole directory");
}

Result<std::shared_ptr<store::Store>> DaemonControl::store(std::string_view store_uri) {
  NodeOptions o;
  o.socket = socket_;
  o.fallback = false;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<NodeStore> s, NodeStore::open(std::string(store_uri), o));
  return std::shared_ptr<store::Store>(std::move(s));
}

}  // namespace sluice::node
