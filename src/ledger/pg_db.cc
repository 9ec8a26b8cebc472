// The ledger's PostgreSQL backend (libpq): a pool of connections, each statement prepared
// once per connection, parameters and results as text.
//
// Transactions run at READ COMMITTED: the ledger's writes are single UPDATEs whose WHERE
// clause carries the check (a quota), and PostgreSQL re-evaluates that clause on the
// newest row version after waiting for the row's lock, so two writers can never both pass
// a check that only one of them fits. Serialization failures and deadlocks (SQLSTATE 40001,
// 40P01) come back as Conflict, and `transaction` runs the function again.
#include <libpq-fe.h>

#include <map>
#include <thread>

#include "ledger/db.h"
#include "ledger/uri.h"
#include "sluice/core/thread_annotations.h"

namespace sluice::ledger {
namespace {

constexpr Oid kInt8Oid = 20;
constexpr Oid kInt2Oid = 21;
constexpr Oid kInt4Oid = 23;

// The URI without a password, for messages.
std::string redact(const std::string& uri) {
  return redact_ledger_uri(uri);
}

// libpq's messages span lines ("...\n\tIs the server running...?"): one line here.
std::string one_line(std::string m) {
  for (char& c : m)
    if (c == '\n' || c == '\t') c = ' ';
  while (!m.empty() && m.back() == ' ') m.pop_back();
  return m;
}

// Parameters as libpq wants them: text, NULL as a null pointer.
struct TextParams {
  std::vector<std::string> text;
  std::vector<const char*> values;
};

TextParams text_params(std::span<const Value> params) {
  TextParams p;
  p.text.resize(params.size());
  p.values.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (const auto* n = std::get_if<int64_t>(&params[i])) {
      p.text[i] = std::to_string(*n);
      p.values[i] = p.text[i].c_str();
    } else if (const auto* s = std::get_if<std::string>(&params[i])) {
      p.values[i] = s->c_str();
    } else {
      p.values[i] = nullptr;
    }
  }
  return p;
}

class PgConn final : public Conn {
 public:
  explicit PgConn(PGconn* c) : conn_(c) {}
  ~PgConn() override { PQfinish(conn_); }

  Dialect dialect() const override { return Dialect::kPostgres; }
  int64_t changes() const override { return changes_; }
  // A connection that failed or was left mid-pipeline goes back to no pool.
  bool broken() const { return bad_ || PQstatus(conn_) != CONNECTION_OK; }

  Result<Rows> query(std::string_view sql, std::span<const Value> params) override {
    auto name = prepare(sql);
    if (!name) return std::unexpected(name.error());
    auto args = text_params(params);
    PGresult* r = PQexecPrepared(conn_, name->c_str(), static_cast<int>(args.values.size()),
                                 args.values.data(), nullptr, nullptr, 0);
    return take(r, sql);
  }

  Status pipeline(std::span<Stmt> stmts) override {
    std::vector<std::string> names;
    for (const Stmt& st : stmts) {
      SLUICE_ASSIGN_OR_RETURN(auto name, prepare(st.sql));
      names.push_back(std::move(name));
    }
    if (PQenterPipelineMode(conn_) != 1)
      return fail(Code::kInternal, "ledger (postgresql): cannot enter pipeline mode");
    Status first;
    size_t sent = 0;
    for (Stmt& st : stmts) st.rows = fail(Code::kCancelled, "not run: an earlier statement failed");
    for (; sent < stmts.size(); ++sent) {
      auto args = text_params(stmts[sent].params);
      if (PQsendQueryPrepared(conn_, names[sent].c_str(), static_cast<int>(args.values.size()),
                              args.values.data(), nullptr, nullptr, 0) != 1) {
        first = fail(Code::kUnavailable,
                     std::string("ledger (postgresql): send failed: ") + PQerrorMessage(conn_));
        break;
      }
    }
    if (PQpipelineSync(conn_) != 1) {
      // No sync point will come: the connection is in an unknown state; drop it.
      bad_ = true;
      (void)PQexitPipelineMode(conn_);
      return fail(Code::kUnavailable,
                  std::string("ledger (postgresql): sync failed: ") + PQerrorMessage(conn_));
    }
    // One result (and a null) per statement sent, then the sync point.
    for (size_t i = 0; i < sent; ++i) {
      Stmt& st = stmts[i];
      PGresult* r = PQgetResult(conn_);
      if (!r) break;
      st.rows = take(r, st.sql);
      st.changes = changes_;
      while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);
      if (!st.rows && first) first = std::unexpected(st.rows.error());
    }
    for (;;) {
      PGresult* r = PQgetResult(conn_);
      if (!r) {
        if (broken()) break;
        continue;  // between a statement's results and the sync point
      }
      bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
      PQclear(r);
      if (sync || broken()) break;
    }
    if (PQexitPipelineMode(conn_) != 1) bad_ = true;  // results left over: not reusable
    return first;
  }

  Status script(std::string_view sql) override {
    std::string text(sql);
    auto r = take(PQexec(conn_, text.c_str()), sql);
    if (!r) return std::unexpected(r.error());
    return {};
  }

 private:
  Result<std::string> prepare(std::string_view sql) {
    auto it = prepared_.find(sql);
    if (it != prepared_.end()) return it->second;
    std::string name = "s" + std::to_string(prepared_.size());
    std::string text(sql);
    auto r = take(PQprepare(conn_, name.c_str(), text.c_str(), 0, nullptr), sql);
    if (!r) return std::unexpected(r.error());
    prepared_.emplace(text, name);
    return name;
  }

  // Turns a PGresult into rows or an Error, and frees it.
  Result<Rows> take(PGresult* r, std::string_view sql) {
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
      Rows rows;
      const char* tuples = PQcmdTuples(r);
      changes_ = (tuples && *tuples) ? std::strtoll(tuples, nullptr, 10) : 0;
      int nrows = PQntuples(r), ncols = PQnfields(r);
      rows.reserve(nrows);
      for (int i = 0; i < nrows; ++i) {
        Row row;
        row.cols.reserve(ncols);
        for (int c = 0; c < ncols; ++c) {
          if (PQgetisnull(r, i, c)) {
            row.cols.emplace_back(std::monostate{});
            continue;
          }
          const char* v = PQgetvalue(r, i, c);
          Oid t = PQftype(r, c);
          if (t == kInt8Oid || t == kInt4Oid || t == kInt2Oid)
            row.cols.emplace_back(static_cast<int64_t>(std::strtoll(v, nullptr, 10)));
          else
            row.cols.emplace_back(std::string(v, PQgetlength(r, i, c)));
        }
        rows.push_back(std::move(row));
      }
      PQclear(r);
      return rows;
    }
    changes_ = 0;
    std::string state =
        r && PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "";
    std::string msg = one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(conn_));
    PQclear(r);
    std::string what = "ledger (postgresql): " + msg + " [" + std::string(sql.substr(0, 60)) + "]";
    if (broken()) return std::unexpected(Error(Code::kUnavailable, what));
    if (state == "40001" || state == "40P01") return std::unexpected(Error(Code::kConflict, what));
    if (state == "23505") return std::unexpected(Error(Code::kAlreadyExists, what));
    if (state == "23503") return std::unexpected(Error(Code::kNotFound, what));
    if (state == "53100") return std::unexpected(Error(Code::kNoSpace, what));
    if (state.starts_with("08") || state.starts_with("57"))
      return std::unexpected(Error(Code::kUnavailable, what));
    if (state.starts_with("28") || state == "42501")
      return std::unexpected(Error(Code::kPermissionDenied, what));
    return std::unexpected(Error(Code::kInternal, what));
  }

  PGconn* conn_;
  bool bad_ = false;
  int64_t changes_ = 0;
  std::map<std::string, std::string, std::less<>> prepared_;
};

class PgDb final : public Db {
 public:
  PgDb(std::string uri, size_t max) : uri_(std::move(uri)), max_(max ? max : 1) {}

  Dialect dialect() const override { return Dialect::kPostgres; }
  std::string describe() const override { return redact(uri_); }

  Result<std::unique_ptr<PgConn>> connect() {
    PGconn* c = PQconnectdb(uri_.c_str());
    if (!c || PQstatus(c) != CONNECTION_OK) {
      std::string m = one_line(c ? PQerrorMessage(c) : "out of memory");
      PQfinish(c);
      return std::unexpected(Error(
          Code::kUnavailable, "ledger: cannot reach PostgreSQL at " + redact(uri_) + ": " + m));
    }
    auto conn = std::make_unique<PgConn>(c);
    // Quiet notices ("relation already exists, skipping") instead of libpq's stderr print.
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);
    return conn;
  }

  void put_back(std::unique_ptr<PgConn> c) {
    MutexLock lock(mu_);
    if (c->broken()) {
      --open_;
    } else {
      idle_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

  Result<std::unique_ptr<PgConn>> borrow() {
    UniqueLock lock(mu_);
    cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return !idle_.empty() || open_ < max_; });
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
    lock.unlock();
    auto c = connect();
    if (!c) {
      MutexLock again(mu_);
      --open_;
      cv_.notify_one();
    }
    return c;
  }

  Status with_conn(const std::function<Status(Conn&)>& fn) override {
    auto c = borrow();
    if (!c) return std::unexpected(c.error());
    Status s = fn(**c);
    put_back(std::move(*c));
    return s;
  }

  Status transaction(const std::function<Status(Conn&)>& fn) override {
    auto c = borrow();
    if (!c) return std::unexpected(c.error());
    Status last;
    for (int attempt = 0; attempt < 8; ++attempt) {
      Status s = (*c)->script("BEGIN");
      if (s) s = fn(**c);
      if (s) s = (*c)->script("COMMIT");
      if (s) {
        put_back(std::move(*c));
        return s;
      }
      if (!(*c)->broken()) (void)(*c)->script("ROLLBACK");
      last = s;
      if (s.error().code() != Code::kConflict) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200 << attempt));
    }
    put_back(std::move(*c));
    return last;
  }

 private:
  std::string uri_;
  size_t max_;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<PgConn>> idle_ SLUICE_GUARDED_BY(mu_);
  size_t open_ SLUICE_GUARDED_BY(mu_) = 0;
};

}  // namespace

Result<std::unique_ptr<Db>> open_postgres(const std::string& uri, size_t max_connections) {
  auto db = std::make_unique<PgDb>(uri, max_connections);
  // One connection now: an unreachable server or a bad URI is an error at open.
  auto c = db->borrow();
  if (!c) return std::unexpected(c.error());
  db->put_back(std::move(*c));
  return db;
}

}  // namespace sluice::ledger
