// The ledger's URI (Ledger::open): which database, and how to name it without a password.
// Parsing only, no connection, so it is tested and fuzzed alone (fuzz/ledger_uri_fuzz.cc).
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice::ledger {

struct LedgerUri {
  enum class Kind { kSqlite, kPostgres } kind = Kind::kSqlite;
  // The SQLite file's path, or the libpq connection URI (with connect_timeout=10 added
  // where the URI sets none, so a server that does not answer is an error, not a hang).
  std::string target;
};

//   sqlite:///abs/path/ledger.db, or a plain path (no "://")   SQLite file
//   postgresql://user[:password]@host[:port]/db[?...]          PostgreSQL (also postgres://)
//   host=... dbname=... [password=...]                          PostgreSQL (libpq's key=value)
// InvalidArgument for anything else, quoting the URI unless it holds '=' (a connection
// string libpq refused may still hold a password).
Result<LedgerUri> parse_ledger_uri(std::string_view uri);

// A PostgreSQL URI (or libpq connection string) for messages, without its password:
// "postgresql://USER@HOST:PORT/DBNAME" rebuilt from what libpq parses of it (other
// parameters are left out: some, like sslpassword, are secret too). A URI libpq cannot
// parse is not shown.
std::string redact_ledger_uri(const std::string& uri);

}  // namespace sluice::ledger
