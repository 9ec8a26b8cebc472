// sluice/client/ledger.h: the ledger as a session opens it, and writes charged through it.
// In sluice::client (with SQLite and libpq); sluice::client_core reads and copies without it
// (Session's charging is an interface, session.h).
//
//   client::SessionOptions o = ...;
//   o.charging = client::ledger_charging();
//   client::Session session(std::move(o));
//   auto l = client::open_ledger(session).value();   // for the ledger's own commands
#pragma once

#include <memory>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/ledger/ledger.h"

namespace sluice::client {

// Opens the session's ledger for its own commands; the embedded one (HOME/ledger.db,
// however it was named) is made on first use. Any other path gets no directory made: a
// mistyped path is an error, not a new, empty ledger somewhere else.
Result<std::unique_ptr<ledger::Ledger>> open_ledger(const Session& session);

// The ledger writes are charged through: the chosen one, else the embedded one when it
// exists; null when there is none, or it holds no project (nothing to charge). An error
// when one is chosen or exists but cannot be opened: a write is never let through
// uncounted because the ledger was down.
Result<std::shared_ptr<ledger::Ledger>> ledger_for_writes(const Session& session);

// Charging through ledger_for_writes (ledger::with_charging): SessionOptions::charging for
// every program that writes where a ledger may charge (the CLI, the Python module).
std::shared_ptr<const Charging> ledger_charging();

}  // namespace sluice::client
