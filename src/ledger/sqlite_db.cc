// The ledger's SQLite backend: one connection per Db, statements prepared once and kept.
//
// A process's threads take the connection in turn (SQLite runs one writer at a time
// anyway, and an in-process mutex is far cheaper than SQLite's busy-wait); other processes
// on the same file wait on SQLite's own lock, up to a busy timeout. WAL journal with
// synchronous=NORMAL: a committed change survives the process being killed; a power cut
// may lose the last few, which `sluice usage reconcile` recounts.
#include <sqlite3.h>

#include <charconv>
#include <map>

#include "ledger/db.h"
#include "sluice/core/thread_annotations.h"

namespace sluice::ledger {

namespace {

constexpr int kBusyTimeoutMs = 30'000;

struct Statement {
  sqlite3_stmt* stmt = nullptr;
  std::vector<int> param_of_slot;  // slot i (1-based, minus one) binds params[param_of_slot[i]]
};

class SqliteConn final : public Conn {
 public:
  explicit SqliteConn(sqlite3* db) : db_(db) {}
  ~SqliteConn() override {
    for (auto& [sql, st] : cache_) sqlite3_finalize(st.stmt);
    sqlite3_close_v2(db_);
  }

  Dialect dialect() const override { return Dialect::kSqlite; }
  int64_t changes() const override { return sqlite3_changes64(db_); }

  Result<Rows> query(std::string_view sql, std::span<const Value> params) override {
    auto st = prepare(sql);
    if (!st) return std::unexpected(st.error());
    sqlite3_stmt* s = (*st)->stmt;
    const auto& slots = (*st)->param_of_slot;
    for (size_t i = 0; i < slots.size(); ++i) {
      int slot = static_cast<int>(i) + 1;
      if (slots[i] < 0 || static_cast<size_t>(slots[i]) >= params.size()) {
        sqlite3_reset(s);
        return std::unexpected(Error(Code::kInternal, "ledger: statement parameter " +
                                                          std::to_string(slot) + " has no value"));
      }
      const Value& v = params[slots[i]];
      if (const auto* n = std::get_if<int64_t>(&v)) {
        sqlite3_bind_int64(s, slot, *n);
      } else if (const auto* t = std::get_if<std::string>(&v)) {
        sqlite3_bind_text(s, slot, t->data(), static_cast<int>(t->size()), SQLITE_TRANSIENT);
      } else {
        sqlite3_bind_null(s, slot);
      }
    }
    Rows rows;
    for (;;) {
      int rc = sqlite3_step(s);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) {
        Error e = error("ledger: " + std::string(sql.substr(0, 60)), rc);
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
        return std::unexpected(std::move(e));
      }
      Row row;
      int n = sqlite3_column_count(s);
      row.cols.reserve(n);
      for (int c = 0; c < n; ++c) {
        switch (sqlite3_column_type(s, c)) {
          case SQLITE_NULL:
            row.cols.emplace_back(std::monostate{});
            break;
          case SQLITE_INTEGER:
            row.cols.emplace_back(static_cast<int64_t>(sqlite3_column_int64(s, c)));
            break;
          default: {
            const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, c));
            row.cols.emplace_back(std::string(p ? p : "", sqlite3_column_bytes(s, c)));
          }
        }
      }
      rows.push_back(std::move(row));
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rows;
  }

  Status script(std::string_view sql) override {
    std::string text(sql);
    char* msg = nullptr;
    int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &msg);
    if (rc != SQLITE_OK) {
      std::string m = msg ? msg : sqlite3_errstr(rc);
      sqlite3_free(msg);
      return std::unexpected(error_from_rc("ledger: " + m, rc));
    }
    return {};
  }

  // SQLITE_BUSY and SQLITE_LOCKED are a lost race for the lock: Conflict, so the
  // transaction runs again; everything else is not.
  static Error error_from_rc(std::string what, int rc) {
    int primary = rc & 0xff;
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
      return Error(Code::kConflict, what + " (database busy)");
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE)
      return Error(Code::kAlreadyExists, what);
    if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) return Error(Code::kNotFound, what);
    if (primary == SQLITE_FULL) return Error(Code::kNoSpace, what);
    if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
      return Error(Code::kCorruption, what);
    if (primary == SQLITE_READONLY || primary == SQLITE_PERM || primary == SQLITE_AUTH)
      return Error(Code::kPermissionDenied, what);
    if (primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN) return Error(Code::kIoError, what);
    return Error(Code::kInternal, what);
  }

 private:
  Error error(std::string what, int rc) {
    return error_from_rc(what + ": " + sqlite3_errmsg(db_), rc);
  }

  Result<Statement*> prepare(std::string_view sql) {
    auto it = cache_.find(sql);
    if (it != cache_.end()) return &it->second;
    Statement st;
    int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &st.stmt, nullptr);
    if (rc != SQLITE_OK) return std::unexpected(error("ledger: prepare", rc));
    int n = sqlite3_bind_parameter_count(st.stmt);
    for (int slot = 1; slot <= n; ++slot) {
      const char* name = sqlite3_bind_parameter_name(st.stmt, slot);
      int index = -1;
      if (name && name[0] == '$') {
        std::string_view digits(name + 1);
        int v = 0;
        auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        if (ec == std::errc() && p == digits.data() + digits.size() && v >= 1) index = v - 1;
      }
      st.param_of_slot.push_back(index);
    }
    return &cache_.emplace(std::string(sql), std::move(st)).first->second;
  }

  sqlite3* db_;
  std::map<std::string, Statement, std::less<>> cache_;
};

class SqliteDb final : public Db {
 public:
  SqliteDb(std::unique_ptr<SqliteConn> conn, std::string path)
      : conn_(std::move(conn)), path_(std::move(path)) {}

  Dialect dialect() const override { return Dialect::kSqlite; }
  std::string describe() const override { return "sqlite://" + path_; }

  Status with_conn(const std::function<Status(Conn&)>& fn) override {
    MutexLock lock(mu_);
    return fn(*conn_);
  }

  Status transaction(const std::function<Status(Conn&)>& fn) override {
    MutexLock lock(mu_);
    Status last;
    for (int attempt = 0; attempt < 5; ++attempt) {
      // The busy timeout waits for another process's write lock here.
      if (auto b = conn_->script("BEGIN IMMEDIATE"); !b) {
        last = b;
        if (b.error().code() == Code::kConflict) continue;
        return b;
      }
      Status s = fn(*conn_);
      if (s) s = conn_->script("COMMIT");
      if (s) return s;
      (void)conn_->script("ROLLBACK");
      last = s;
      if (s.error().code() != Code::kConflict) return s;
    }
    return last;
  }

 private:
  Mutex mu_;
  std::unique_ptr<SqliteConn> conn_
      SLUICE_PT_GUARDED_BY(mu_);  // one connection, one user at a time
  std::string path_;
};

}  // namespace

Result<std::unique_ptr<Db>> open_sqlite(const std::string& path) {
  sqlite3* raw = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string m = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close_v2(raw);
    return std::unexpected(SqliteConn::error_from_rc("ledger: open " + path + ": " + m, rc));
  }
  auto conn = std::make_unique<SqliteConn>(raw);
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);
  sqlite3_extended_result_codes(raw, 1);
  // WAL lets readers run beside the writer; a read-only file keeps its rollback journal.
  (void)conn->script("PRAGMA journal_mode=WAL");
  if (auto s = conn->script("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;"); !s) {
    // The message already starts "ledger: ".
    return std::unexpected(s.error().with_context(path));
  }
  return std::make_unique<SqliteDb>(std::move(conn), path);
}

}  // namespace sluice::ledger
