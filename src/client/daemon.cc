// The node daemon's options from a session (sluice/client/daemon.h).
#include "sluice/client/daemon.h"

namespace sluice::client {

Result<node::ServerOptions> daemon_options(const Session& session) {
  node::ServerOptions o;
  o.socket_path = session.daemon_socket();
  o.cache = session.cache_options();
  o.stores = session.store_options();
  o.s3_endpoint = s3::endpoint_url(session.options().s3);
  o.cache.store_id = "sluiced at " + o.s3_endpoint;
  if (!session.options().ledger.uri.empty()) {
    auto l = ledger::Ledger::open(session.options().ledger.uri);
    if (!l) return std::unexpected(l.error().with_context(session.options().ledger.source));
    o.ledger = std::move(*l);
  }
  return o;
}

}  // namespace sluice::client
