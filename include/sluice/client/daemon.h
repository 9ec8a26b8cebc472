// sluice/client/daemon.h: the node daemon's service opened the way sluiced opens it, from a
// Session (client::Profile::kDaemon): its socket, the node's cache, how roots are opened,
// the S3 endpoint it serves, the ledger it charges. A separate layer (sluice_client_daemon)
// so that a program that only reads through the cache links no server.
//
//   client::SessionOverrides given;  given.daemon_socket = "/run/sluice/sluiced.sock";
//   client::Session session(client::session_options_from_environment(
//       given, client::Profile::kDaemon).value());
//   node::ServerOptions o = client::daemon_options(session).value();
//   o.teams = ...;  o.peer = ...;    // what only a daemon's own configuration says
//   auto server = node::NodeServer::open(std::move(o)).value();
#pragma once

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/node/server.h"

namespace sluice::client {

// The server options a session composes. The cache's store id names the S3 endpoint
// ("sluiced at ENDPOINT": chunks of one server's bucket are never served for another's of
// the same name). The daemon charges only through a ledger it was given (the session's
// LedgerChoice uri: --ledger or $SLUICE_LEDGER): a node's shared daemon never adopts
// HOME/ledger.db. An error when that ledger cannot be opened.
Result<node::ServerOptions> daemon_options(const Session& session);

}  // namespace sluice::client
