// src/ledger/db.h: the little SQL the ledger needs, over SQLite or PostgreSQL.
//
// Statements are written once, with PostgreSQL's $1..$N placeholders; the SQLite backend
// binds them by name ("$1" is a valid SQLite parameter name), so a statement may use a
// parameter twice or out of order on both. Values are NULL, 64-bit integers or text: the
// ledger stores nothing else. Where the two dialects differ (data-modifying WITH, which
// only PostgreSQL has), the caller asks `dialect()` and sends its own statement.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::ledger {

using Value = std::variant<std::monostate, int64_t, std::string>;

struct Row {
  std::vector<Value> cols;
  bool is_null(size_t i) const { return std::holds_alternative<std::monostate>(cols.at(i)); }
  int64_t i64(size_t i) const;
  std::optional<int64_t> opt_i64(size_t i) const;
  std::string text(size_t i) const;
};
using Rows = std::vector<Row>;

enum class Dialect { kSqlite, kPostgres };

// A statement of a pipeline, and what it returned.
struct Stmt {
  std::string_view sql;
  std::vector<Value> params;
  Result<Rows> rows = Rows{};
  int64_t changes = 0;
};

// One connection's worth of statements, inside or outside a transaction.
class Conn {
 public:
  virtual ~Conn() = default;
  virtual Dialect dialect() const = 0;
  // Runs one statement; returns the rows it produced (SELECT, or RETURNING).
  virtual Result<Rows> query(std::string_view sql, std::span<const Value> params = {}) = 0;
  // Rows changed by the last statement (UPDATE/INSERT/DELETE without RETURNING).
  virtual int64_t changes() const = 0;
  // Runs statements separated by ';', without parameters (the schema).
  virtual Status script(std::string_view sql) = 0;
  // Runs statements in order, each with its result in place. PostgreSQL sends them all
  // before reading any answer (libpq's pipeline mode: one round trip); others run them one
  // by one. After a failed statement the rest are not run. Returns the first error.
  virtual Status pipeline(std::span<Stmt> stmts);
};

class Db {
 public:
  virtual ~Db() = default;
  virtual Dialect dialect() const = 0;
  // Runs `fn` on a connection inside one transaction that writers take in turn (SQLite:
  // BEGIN IMMEDIATE; PostgreSQL: READ COMMITTED, the statements lock the rows they
  // change). Commits when `fn` returns OK, rolls back otherwise. A transaction the server
  // aborts for a lost race (serialization failure, deadlock, busy) is run again, a few times.
  virtual Status transaction(const std::function<Status(Conn&)>& fn) = 0;
  // Runs `fn` on a connection with each statement its own transaction (autocommit).
  virtual Status with_conn(const std::function<Status(Conn&)>& fn) = 0;
  // Where it is: "sqlite:///abs/path" or "postgresql://host:port/db" (no password).
  virtual std::string describe() const = 0;
};

// path: a SQLite database file, created if missing (its folder must exist).
Result<std::unique_ptr<Db>> open_sqlite(const std::string& path);
// uri: a libpq connection URI (postgresql://user@host:port/db?options). Connects once now,
// so an unreachable server is an error here, not at the first write.
Result<std::unique_ptr<Db>> open_postgres(const std::string& uri, size_t max_connections);

}  // namespace sluice::ledger
