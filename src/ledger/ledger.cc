// The ledger: schema, projects, accounts, reservations and history over ledger/db.h.
// docs/formats/ledger-schema.md documents the tables; docs/ledger.md the behaviour.
#include "sluice/ledger/ledger.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "ledger/batch.h"
#include "ledger/db.h"
#include "ledger/sql.h"
#include "ledger/uri.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/store/store.h"

namespace sluice::ledger {

int64_t Row::i64(size_t i) const {
  const Value& v = cols.at(i);
  if (const auto* n = std::get_if<int64_t>(&v)) return *n;
  if (const auto* s = std::get_if<std::string>(&v)) {
    // PostgreSQL sends SUM(bigint) as numeric text; both send integers we wrote ourselves.
    int64_t n = 0;
    auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), n);
    if (ec == std::errc() && p == s->data() + s->size()) return n;
  }
  return 0;
}

Status Conn::pipeline(std::span<Stmt> stmts) {
  for (Stmt& s : stmts) {
    s.rows = query(s.sql, s.params);
    if (!s.rows) return std::unexpected(s.rows.error());
    s.changes = changes();
  }
  return {};
}

std::optional<int64_t> Row::opt_i64(size_t i) const {
  if (is_null(i)) return std::nullopt;
  return i64(i);
}

std::string Row::text(size_t i) const {
  const Value& v = cols.at(i);
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* n = std::get_if<int64_t>(&v)) return std::to_string(*n);
  return {};
}

namespace {

constexpr int64_t kSchemaVersion = 1;
// Bumped whenever kSchema gains a table or an index (never a change to an existing one:
// that is a new schema version): an older ledger then gets them at its next open.
constexpr int64_t kTableSet = 6;

// A tier's total over every team, sampled into the history under the team name "*" (which
// no team can have): $1 now.
constexpr const char* kSampleTiers =
    "INSERT INTO history (team, tier, t_ns, bytes, objects)"
    " SELECT '*', tier, CAST($1 AS BIGINT), SUM(used_bytes), SUM(used_objects) FROM accounts"
    " WHERE true GROUP BY tier ON CONFLICT (team, tier, t_ns) DO NOTHING";

// Portable DDL: the same text runs on SQLite and PostgreSQL.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS sluice_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS teams (name TEXT PRIMARY KEY, created_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS projects (
  id TEXT PRIMARY KEY,
  team TEXT NOT NULL REFERENCES teams(name),
  location TEXT NOT NULL UNIQUE,
  tier TEXT NOT NULL,
  kind TEXT NOT NULL,
  created_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
  team TEXT NOT NULL REFERENCES teams(name),
  tier TEXT NOT NULL,
  used_bytes BIGINT NOT NULL DEFAULT 0,
  used_objects BIGINT NOT NULL DEFAULT 0,
  reserved_bytes BIGINT NOT NULL DEFAULT 0,
  reserved_objects BIGINT NOT NULL DEFAULT 0,
  soft_bytes BIGINT, hard_bytes BIGINT, soft_objects BIGINT, hard_objects BIGINT,
  grace_ns BIGINT NOT NULL,
  over_soft_since_ns BIGINT,
  updated_ns BIGINT NOT NULL,
  PRIMARY KEY (team, tier));
CREATE TABLE IF NOT EXISTS usage (
  project TEXT NOT NULL REFERENCES projects(id),
  tier TEXT NOT NULL,
  kind TEXT NOT NULL,
  team TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  objects BIGINT NOT NULL,
  updated_ns BIGINT NOT NULL,
  PRIMARY KEY (project, tier, kind));
CREATE TABLE IF NOT EXISTS reservations (
  id TEXT PRIMARY KEY,
  team TEXT NOT NULL,
  tier TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  objects BIGINT NOT NULL,
  expires_ns BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS reservations_by_expiry ON reservations (expires_ns);
CREATE TABLE IF NOT EXISTS capacities (
  tier TEXT PRIMARY KEY,
  bytes BIGINT,
  objects BIGINT,
  updated_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS retention (
  project TEXT NOT NULL REFERENCES projects(id),
  series TEXT NOT NULL,
  keep_last BIGINT, keep_every BIGINT, max_age_ns BIGINT, max_idle_ns BIGINT,
  updated_ns BIGINT NOT NULL,
  PRIMARY KEY (project, series));
CREATE TABLE IF NOT EXISTS pins (
  project TEXT NOT NULL REFERENCES projects(id),
  prefix TEXT NOT NULL,
  created_ns BIGINT NOT NULL,
  PRIMARY KEY (project, prefix));
CREATE TABLE IF NOT EXISTS trash (
  run TEXT NOT NULL,
  project TEXT NOT NULL,
  key TEXT NOT NULL,
  trash_key TEXT NOT NULL,
  reason TEXT NOT NULL,
  kind TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  trashed_ns BIGINT NOT NULL,
  purge_after_ns BIGINT NOT NULL,
  PRIMARY KEY (run, project, key));
CREATE TABLE IF NOT EXISTS tallies (
  source TEXT NOT NULL,
  project TEXT NOT NULL REFERENCES projects(id),
  tier TEXT NOT NULL,
  kind TEXT NOT NULL,
  team TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  updated_ns BIGINT NOT NULL,
  PRIMARY KEY (source, project, tier, kind));
CREATE TABLE IF NOT EXISTS publishing (
  location TEXT PRIMARY KEY,
  holder TEXT NOT NULL,
  expires_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS publish_waiting (
  location TEXT PRIMARY KEY,
  until_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS history (
  team TEXT NOT NULL,
  tier TEXT NOT NULL,
  t_ns BIGINT NOT NULL,
  bytes BIGINT NOT NULL,
  objects BIGINT NOT NULL,
  PRIMARY KEY (team, tier, t_ns));
)sql";

int64_t real_clock() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string human(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024 || v <= -1024) && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%" PRId64 " B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);  // as format_size writes sizes
  return buf;
}

std::string objects_text(int64_t n) {
  return std::to_string(n) + (n == 1 ? " object" : " objects");
}

std::string quote(std::string_view s) {
  return "'" + std::string(s) + "'";
}

}  // namespace

std::string normalise_location(std::string_view location) {
  std::string l(location);
  if (l.find("://") == std::string::npos) l = "file://" + l;
  if (l.starts_with("file://") && l.size() > 7 && l[7] == '/') {
    // One spelling per directory: "..", ".", "//" and symlinks resolved (as far as the
    // path exists), so no alias of a project's directory escapes it.
    std::error_code ec;
    auto canon = std::filesystem::weakly_canonical(std::filesystem::path(l.substr(7)), ec);
    if (!ec) l = "file://" + canon.lexically_normal().string();
  }
  while (l.size() > 1 && l.back() == '/' && !l.ends_with("://")) l.pop_back();
  return l;
}

namespace {

// A fresh, unguessable-enough reservation ID: 64 random bits per process and a counter.
std::string new_reservation_id() {
  static const uint64_t process = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "-%" PRIu64, process, counter.fetch_add(1) + 1);
  return buf;
}

Account account_from_row(const Row& r) {
  // team, tier, used_bytes, used_objects, reserved_bytes, reserved_objects, soft_bytes,
  // hard_bytes, soft_objects, hard_objects, grace_ns, over_soft_since_ns, updated_ns
  Account a;
  a.team = r.text(0);
  a.tier = parse_tier(r.text(1)).value_or(Tier::kNvme);
  a.used_bytes = r.i64(2);
  a.used_objects = r.i64(3);
  a.reserved_bytes = r.i64(4);
  a.reserved_objects = r.i64(5);
  a.limits.soft_bytes = r.opt_i64(6);
  a.limits.hard_bytes = r.opt_i64(7);
  a.limits.soft_objects = r.opt_i64(8);
  a.limits.hard_objects = r.opt_i64(9);
  a.limits.grace = std::chrono::seconds(r.i64(10) / 1'000'000'000);
  a.over_soft_since_ns = r.opt_i64(11);
  a.updated_ns = r.i64(12);
  return a;
}

constexpr const char* kAccountColumns =
    "team, tier, used_bytes, used_objects, reserved_bytes, reserved_objects, soft_bytes,"
    " hard_bytes, soft_objects, hard_objects, grace_ns, over_soft_since_ns, updated_ns";

Value opt_value(const std::optional<int64_t>& v) {
  return v ? Value(*v) : Value(std::monostate{});
}

}  // namespace

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kRam:
      return "ram";
    case Tier::kNvme:
      return "nvme";
    case Tier::kPeer:
      return "peer";
    case Tier::kObject:
      return "object";
  }
  return "?";
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kDataset:
      return "dataset";
    case Kind::kCheckpoint:
      return "checkpoint";
    case Kind::kScratch:
      return "scratch";
    case Kind::kCache:
      return "cache";
  }
  return "?";
}

Result<Tier> parse_tier(std::string_view name) {
  for (Tier t : kAllTiers)
    if (tier_name(t) == name) return t;
  return fail(Code::kInvalidArgument,
              "unknown tier " + quote(name) + ": expected ram, nvme, peer or object");
}

Result<Kind> parse_kind(std::string_view name) {
  for (Kind k : kAllKinds)
    if (kind_name(k) == name) return k;
  return fail(Code::kInvalidArgument,
              "unknown kind " + quote(name) + ": expected dataset, checkpoint, scratch or cache");
}

Tier tier_of_location(std::string_view location) {
  if (location.starts_with("s3://")) return Tier::kObject;
  if (location.starts_with("mem://")) return Tier::kRam;
  if (location.starts_with("peer://") || location.starts_with("node+")) return Tier::kPeer;
  return Tier::kNvme;
}

Status validate_location(std::string_view project, std::string_view location) {
  auto bad = [&](const std::string& why) {
    return fail(Code::kInvalidArgument,
                "project " + quote(project) + ": location " + quote(location) + " " + why);
  };
  for (char c : location)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("holds a control character");
  size_t sep = location.find("://");
  if (sep == std::string_view::npos) {
    if (location.empty() || location[0] != '/') return bad("is not an absolute path");
    return {};
  }
  std::string_view scheme = location.substr(0, sep), rest = location.substr(sep + 3);
  if (scheme == "file") {
    if (rest.empty() || rest[0] != '/') return bad("is not an absolute path");
    if (rest.find_first_not_of('/') == std::string_view::npos)
      return bad("is the root directory: a project owns a directory below it");
    return {};
  }
  if (scheme != "s3" && scheme != "mem" && scheme != "peer" && scheme != "sluiced")
    return bad(
        "has an unknown scheme: expected a path, file://, s3://, mem://, peer:// or sluiced://");
  if (rest.empty() || rest[0] == '/') return bad("names no bucket or store");
  return {};
}

Status validate_name(std::string_view what, std::string_view name) {
  bool ok = !name.empty() && name.size() <= 64 && name[0] != '.' && name[0] != '-';
  for (char c : name) {
    bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-';
    ok = ok && allowed;
  }
  if (ok) return {};
  return fail(Code::kInvalidArgument,
              "invalid " + std::string(what) + " name " + quote(name) +
                  ": use 1-64 letters, digits, '.', '_' or '-', not starting with '.' or '-'");
}

struct Ledger::Sampling {
  Mutex mu;
  std::map<std::pair<std::string, Tier>, int64_t> last_ns SLUICE_GUARDED_BY(mu);
};

Ledger::Ledger(std::unique_ptr<Db> db, LedgerOptions options)
    : db_(std::move(db)),
      options_(options),
      batcher_(std::make_unique<Batcher>(*db_, options.clock, real_clock)),
      sampling_(std::make_unique<Sampling>()) {}

Ledger::~Ledger() = default;

int64_t Ledger::now_ns() const {
  return options_.clock ? options_.clock() : real_clock();
}

std::string Ledger::describe() const {
  return db_->describe();
}

Result<std::unique_ptr<Ledger>> Ledger::open(std::string_view uri, const LedgerOptions& options) {
  std::unique_ptr<Db> db;
  SLUICE_ASSIGN_OR_RETURN(LedgerUri where, parse_ledger_uri(uri));
  if (where.kind == LedgerUri::Kind::kPostgres) {
    SLUICE_ASSIGN_OR_RETURN(db, open_postgres(where.target, options.max_connections));
  } else {
    SLUICE_ASSIGN_OR_RETURN(db, open_sqlite(where.target));
  }
  Dialect dialect = db->dialect();
  // Tables are created, or added by a newer sluice of the same schema version (every DDL
  // statement is IF NOT EXISTS), under a writer's lock, once: a ledger whose recorded
  // table set is current opens without writing (so a read-only one reads).
  const std::string tables = std::to_string(kTableSet);
  std::string version, recorded;
  (void)db->with_conn([&](Conn& c) -> Status {
    auto rows = c.query("SELECT name, value FROM sluice_meta");
    if (rows)
      for (auto& r : *rows) {
        if (r.text(0) == "schema_version") version = r.text(1);
        if (r.text(0) == "table_set") recorded = r.text(1);
      }
    return {};
  });
  if (!version.empty() && version != std::to_string(kSchemaVersion))
    return fail(Code::kUnsupported, "ledger " + db->describe() + ": schema version " +
                                        quote(version) + ", this sluice knows version " +
                                        std::to_string(kSchemaVersion));
  if (version.empty() || recorded != tables) {
    Status s = db->transaction([&](Conn& c) -> Status {
      // Several processes may create the schema at once; on PostgreSQL they take turns.
      if (dialect == Dialect::kPostgres)
        SLUICE_RETURN_IF_ERROR(c.query("SELECT pg_advisory_xact_lock(7359112021)"));
      SLUICE_RETURN_IF_ERROR(c.script(kSchema));
      // Table set 4 made node caches charge as tallies (absolute figures per cache). What
      // they charged before, by changes, would be counted again by each cache's first
      // tally: it is dropped, and every cache sets its own figure when it next starts.
      // (Read again under the lock: another process may have upgraded it since.)
      SLUICE_ASSIGN_OR_RETURN(auto set, c.query("SELECT value FROM sluice_meta WHERE name ="
                                                " 'table_set'"));
      if (!set.empty() && std::atoi(set[0].text(0).c_str()) < 4) {
        SLUICE_ASSIGN_OR_RETURN(auto old,
                                c.query("DELETE FROM usage WHERE tier = 'nvme' AND kind = 'cache'"
                                        " RETURNING team, bytes"));
        for (auto& r : old)
          SLUICE_RETURN_IF_ERROR(
              c.query("UPDATE accounts SET used_bytes = CASE WHEN used_bytes < $2 THEN 0 ELSE"
                      " used_bytes - $2 END WHERE team = $1 AND tier = 'nvme'",
                      std::vector<Value>{r.text(0), r.i64(1)}));
      }
      SLUICE_RETURN_IF_ERROR(c.query(
          "INSERT INTO sluice_meta (name, value) VALUES ('schema_version', $1), ('table_set', $2)"
          " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
          std::vector<Value>{std::to_string(kSchemaVersion), tables}));
      return {};
    });
    if (!s) return std::unexpected(s.error().with_context("ledger " + db->describe()));
  }
  return std::unique_ptr<Ledger>(new Ledger(std::move(db), options));
}

// --- teams and projects ------------------------------------------------------------------

Status Ledger::add_team(std::string_view team) {
  SLUICE_RETURN_IF_ERROR(validate_name("team", team));
  Status s = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(c.query("INSERT INTO teams (name, created_ns) VALUES ($1, $2)",
                                   std::vector<Value>{std::string(team), now_ns()}));
    return {};
  });
  if (!s && s.error().code() == Code::kAlreadyExists)
    return fail(Code::kAlreadyExists, "team " + quote(team) + " already exists");
  return s;
}

Result<std::vector<std::string>> Ledger::teams() {
  std::vector<std::string> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT name FROM teams ORDER BY name"));
    for (auto& r : rows) out.push_back(r.text(0));
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

namespace {
Status require_team(Conn& c, std::string_view team) {
  SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT 1 FROM teams WHERE name = $1",
                                             std::vector<Value>{std::string(team)}));
  if (rows.empty())
    return fail(Code::kNotFound,
                "unknown team " + quote(team) +
                    (validate_name("team", team)
                         ? " (add it with: sluice team add " + std::string(team) + ")"
                         : std::string()));
  return {};
}

bool under(std::string_view location, std::string_view root) {
  return location == root || (location.starts_with(root) && location.size() > root.size() &&
                              location[root.size()] == '/');
}
}  // namespace

Status Ledger::add_project(Project p) {
  SLUICE_RETURN_IF_ERROR(validate_name("project", p.id));
  SLUICE_RETURN_IF_ERROR(validate_location(p.id, p.location));
  p.location = normalise_location(p.location);
  if (p.location.starts_with("file://")) {
    // A directory, or one to be made: never a file, FIFO or device already there.
    std::error_code ec;
    auto st = std::filesystem::status(p.location.substr(7), ec);
    if (!ec && std::filesystem::exists(st) && !std::filesystem::is_directory(st))
      return fail(Code::kInvalidArgument, "project " + quote(p.id) + ": location " +
                                              quote(p.location) + " exists and is not a directory");
  }
  if (p.location.starts_with("file://") && p.location.substr(7).front() != '/')
    return fail(Code::kInvalidArgument,
                "project " + quote(p.id) + ": location " + quote(p.location) + " is not absolute");
  p.created_ns = now_ns();
  return db_->transaction([&](Conn& c) -> Status {
    // Two adds at once must not both pass the overlap check (SQLite's writer lock already
    // serialises them; PostgreSQL needs a lock of its own).
    if (c.dialect() == Dialect::kPostgres)
      SLUICE_RETURN_IF_ERROR(c.query("SELECT pg_advisory_xact_lock(7359112022)"));
    SLUICE_RETURN_IF_ERROR(require_team(c, p.team));
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT id, location FROM projects"));
    for (auto& r : rows) {
      std::string id = r.text(0), loc = r.text(1);
      if (id == p.id)
        return fail(Code::kAlreadyExists, "project " + quote(p.id) + " already exists");
      if (under(p.location, loc) || under(loc, p.location))
        return fail(Code::kConflict, "project " + quote(p.id) + " at " + quote(p.location) +
                                         " overlaps project " + quote(id) + " at " + quote(loc) +
                                         ": every byte belongs to one project");
    }
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO projects (id, team, location, tier, kind, created_ns)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                std::vector<Value>{p.id, p.team, p.location, std::string(tier_name(p.tier)),
                                   std::string(kind_name(p.kind)), p.created_ns}));
    return {};
  });
}

Status Ledger::remove_project(std::string_view id) {
  return db_->transaction([&](Conn& c) -> Status {
    std::vector<Value> args{std::string(id)};
    SLUICE_ASSIGN_OR_RETURN(auto found, c.query("SELECT 1 FROM projects WHERE id = $1", args));
    if (found.empty()) return fail(Code::kNotFound, "unknown project " + quote(id));
    SLUICE_ASSIGN_OR_RETURN(auto rows,
                            c.query("SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(objects), 0) "
                                    "FROM usage WHERE project = $1",
                                    args));
    int64_t bytes = rows.empty() ? 0 : rows[0].i64(0), objects = rows.empty() ? 0 : rows[0].i64(1);
    if (bytes != 0 || objects != 0)
      return fail(Code::kConflict,
                  "project " + quote(id) + " still has " + human(bytes) + " in " +
                      std::to_string(objects) +
                      " objects charged to it: delete its data (or recount with sluice usage "
                      "reconcile) first");
    SLUICE_ASSIGN_OR_RETURN(auto trashed,
                            c.query("SELECT COUNT(*) FROM trash WHERE project = $1", args));
    if (!trashed.empty() && trashed[0].i64(0) > 0)
      return fail(Code::kConflict, "project " + quote(id) + " still has " +
                                       std::to_string(trashed[0].i64(0)) +
                                       " objects in its trash (sluice gc run purges them)");
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM usage WHERE project = $1", args));
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM tallies WHERE project = $1", args));
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM retention WHERE project = $1", args));
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM pins WHERE project = $1", args));
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM projects WHERE id = $1", args));
    return {};
  });
}

Result<std::vector<Project>> Ledger::projects() {
  std::vector<Project> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(
        auto rows,
        c.query("SELECT id, team, location, tier, kind, created_ns FROM projects ORDER BY id"));
    for (auto& r : rows) {
      Project p;
      p.id = r.text(0);
      p.team = r.text(1);
      p.location = r.text(2);
      p.tier = parse_tier(r.text(3)).value_or(Tier::kNvme);
      p.kind = parse_kind(r.text(4)).value_or(Kind::kScratch);
      p.created_ns = r.i64(5);
      out.push_back(std::move(p));
    }
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

const Project* Ledger::owner_of(const std::vector<Project>& projects, std::string_view location) {
  std::string loc = normalise_location(location);
  const Project* best = nullptr;
  for (const auto& p : projects)
    if (under(loc, p.location) && (!best || p.location.size() > best->location.size())) best = &p;
  return best;
}

std::vector<std::string> Ledger::pins_within(
    const std::vector<Project>& projects,
    const std::vector<std::pair<std::string, std::string>>& pins, std::string_view location) {
  const std::string loc = normalise_location(location);
  const Project* p = owner_of(projects, loc);
  if (!p) return {};
  // Where `location` lies in its project, as the project's keys are spelled: "sub/dir/".
  std::string sub = loc.substr(std::min(p->location.size(), loc.size()));
  while (sub.starts_with("/")) sub.erase(0, 1);
  if (!sub.empty()) sub += "/";
  std::vector<std::string> out;
  for (const auto& [project, prefix] : pins) {
    if (project != p->id) continue;
    if (sub.starts_with(prefix))
      out.push_back("");
    else if (prefix.starts_with(sub))
      out.push_back(prefix.substr(sub.size()));
  }
  return out;
}

// --- quotas ----------------------------------------------------------------------------

Status Ledger::ensure_account(const std::string& team, Tier tier) {
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO accounts (team, tier, grace_ns, updated_ns) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (team, tier) DO NOTHING",
                std::vector<Value>{team, std::string(tier_name(tier)),
                                   int64_t{7} * 24 * 3600 * 1'000'000'000, now_ns()}));
    return {};
  });
}

Status Ledger::set_limits(std::string_view team, Tier tier, const Limits& limits) {
  auto check = [&](const char* what, const std::optional<int64_t>& v) -> Status {
    if (v && *v < 0)
      return fail(Code::kInvalidArgument, std::string("quota for team ") + quote(team) + ": " +
                                              what + " limit " + std::to_string(*v) +
                                              " is negative");
    return {};
  };
  SLUICE_RETURN_IF_ERROR(check("soft bytes", limits.soft_bytes));
  SLUICE_RETURN_IF_ERROR(check("hard bytes", limits.hard_bytes));
  SLUICE_RETURN_IF_ERROR(check("soft objects", limits.soft_objects));
  SLUICE_RETURN_IF_ERROR(check("hard objects", limits.hard_objects));
  if (limits.grace.count() < 0 || limits.grace.count() > int64_t{100} * 365 * 24 * 3600)
    return fail(Code::kInvalidArgument, "quota for team " + quote(team) + ": grace period " +
                                            std::to_string(limits.grace.count()) +
                                            " s is out of range (0 to 100 years)");
  auto soft_over_hard = [](const std::optional<int64_t>& s, const std::optional<int64_t>& h) {
    return s && h && *s > *h;
  };
  if (soft_over_hard(limits.soft_bytes, limits.hard_bytes) ||
      soft_over_hard(limits.soft_objects, limits.hard_objects))
    return fail(Code::kInvalidArgument,
                "quota for team " + quote(team) + ": a soft limit above its hard limit");
  std::string t(team);
  return db_->transaction([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(require_team(c, team));
    int64_t now = now_ns();
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO accounts (team, tier, grace_ns, updated_ns) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (team, tier) DO NOTHING",
                std::vector<Value>{t, std::string(tier_name(tier)),
                                   limits.grace.count() * 1'000'000'000, now}));
    // Whether the account is past a soft limit now is recomputed under the new limits.
    SLUICE_RETURN_IF_ERROR(c.query(
        "UPDATE accounts SET soft_bytes = $3, hard_bytes = $4, soft_objects = $5,"
        " hard_objects = $6, grace_ns = $7, updated_ns = $8,"
        " over_soft_since_ns = CASE WHEN (CAST($3 AS BIGINT) IS NOT NULL AND used_bytes > $3)"
        " OR (CAST($5 AS BIGINT) IS NOT NULL AND used_objects > $5)"
        " THEN COALESCE(over_soft_since_ns, $8) ELSE NULL END"
        " WHERE team = $1 AND tier = $2",
        std::vector<Value>{t, std::string(tier_name(tier)), opt_value(limits.soft_bytes),
                           opt_value(limits.hard_bytes), opt_value(limits.soft_objects),
                           opt_value(limits.hard_objects), limits.grace.count() * 1'000'000'000,
                           now}));
    return {};
  });
}

Result<std::vector<Account>> Ledger::accounts(std::string_view team) {
  std::vector<Account> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    std::string sql = std::string("SELECT ") + kAccountColumns + " FROM accounts";
    std::vector<Value> args;
    if (!team.empty()) {
      SLUICE_RETURN_IF_ERROR(require_team(c, team));
      sql += " WHERE team = $1";
      args.emplace_back(std::string(team));
    }
    sql += " ORDER BY team, tier";
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query(sql, args));
    for (auto& r : rows) out.push_back(account_from_row(r));
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Error Ledger::quota_error(const ChargeTarget& t, int64_t bytes, int64_t objects) {
  auto accounts_or = accounts(t.team);
  std::string where = "team " + quote(t.team) + " on tier " + std::string(tier_name(t.tier));
  if (!accounts_or)
    return Error(Code::kQuotaExceeded,
                 "quota exceeded for " + where + " (" + accounts_or.error().message() + ")");
  for (const Account& a : *accounts_or) {
    if (a.tier != t.tier) continue;
    const Limits& l = a.limits;
    int64_t nb = a.used_bytes + a.reserved_bytes + bytes;
    int64_t no = a.used_objects + a.reserved_objects + objects;
    bool grace_over =
        a.over_soft_since_ns && now_ns() - *a.over_soft_since_ns >= l.grace.count() * 1'000'000'000;
    std::string usage_text = "; used " + human(a.used_bytes) + " in " +
                             objects_text(a.used_objects) + ", reserved " +
                             human(a.reserved_bytes) + " in " + objects_text(a.reserved_objects) +
                             ", asked " + human(bytes) + " in " + objects_text(objects);
    std::string limit;
    if (l.hard_bytes && nb > *l.hard_bytes)
      limit = "hard limit " + human(*l.hard_bytes);
    else if (l.hard_objects && no > *l.hard_objects)
      limit = "hard limit " + objects_text(*l.hard_objects);
    else if (grace_over && l.soft_bytes && nb > *l.soft_bytes)
      limit = "soft limit " + human(*l.soft_bytes) + " (grace period over)";
    else if (grace_over && l.soft_objects && no > *l.soft_objects)
      limit = "soft limit " + objects_text(*l.soft_objects) + " (grace period over)";
    else
      limit = "limit (usage changed meanwhile)";
    return Error(Code::kQuotaExceeded, "quota exceeded for " + where + ": " + limit + usage_text);
  }
  return Error(Code::kQuotaExceeded, "quota exceeded for " + where);
}

// --- reservations ----------------------------------------------------------------------

Result<std::string> Ledger::reserve(const ChargeTarget& t, int64_t bytes, int64_t objects) {
  if (bytes < 0 || objects < 0)
    return fail(Code::kInvalidArgument, "reserve: negative bytes or objects");
  std::string id = new_reservation_id();
  for (int attempt = 0; attempt < 3; ++attempt) {
    BatchOp op{.type = BatchOp::Type::kReserve,
               .target = t,
               .id = id,
               .bytes = bytes,
               .objects = objects,
               .expires_ns = now_ns() + options_.reservation_ttl.count() * 1'000'000'000};
    batcher_->run(op);
    if (!op.status) return std::unexpected(op.status.error());
    if (op.reserved) return id;
    // Refused, or the account is not there yet: create it, and let expired reservations
    // (crashed writers) go before refusing.
    if (attempt == 0) {
      SLUICE_RETURN_IF_ERROR(ensure_account(t.team, t.tier));
    } else if (attempt == 1) {
      SLUICE_ASSIGN_OR_RETURN(int64_t expired, expire_reservations());
      if (expired == 0) break;
    }
  }
  return std::unexpected(quota_error(t, bytes, objects));
}

Status Ledger::grow(std::string_view reservation, const ChargeTarget& t, int64_t bytes,
                    int64_t objects) {
  if (bytes < 0 || objects < 0)
    return fail(Code::kInvalidArgument, "grow: negative bytes or objects");
  bool refused = false;
  Status s = db_->transaction([&](Conn& c) -> Status {
    int64_t now = now_ns();
    int64_t expires = now + options_.reservation_ttl.count() * 1'000'000'000;
    SLUICE_RETURN_IF_ERROR(c.query(
        "UPDATE reservations SET bytes = bytes + $2, objects = objects + $3, expires_ns = $4"
        " WHERE id = $1 AND expires_ns >= $5",
        std::vector<Value>{std::string(reservation), bytes, objects, expires, now}));
    if (c.changes() != 1)
      return fail(Code::kNotFound,
                  "reservation " + quote(reservation) + " is gone (it expired after " +
                      std::to_string(options_.reservation_ttl.count()) + " s without a renewal)");
    SLUICE_RETURN_IF_ERROR(
        c.query(sql::kReserve,
                std::vector<Value>{t.team, std::string(tier_name(t.tier)), bytes, objects, now}));
    if (c.changes() != 1) {
      refused = true;
      return fail(Code::kQuotaExceeded, "refused");  // rolls the renewal back
    }
    return {};
  });
  if (!s && refused) return std::unexpected(quota_error(t, bytes, objects));
  return s;
}

Status Ledger::commit(std::string_view reservation, const ChargeTarget& t, int64_t bytes,
                      int64_t objects) {
  BatchOp op{.type = BatchOp::Type::kSettle,
             .target = t,
             .id = std::string(reservation),
             .bytes = bytes,
             .objects = objects};
  batcher_->run(op);
  if (op.status) maybe_sample(t.team, t.tier);
  return op.status;
}

Status Ledger::release(std::string_view reservation) {
  return db_->transaction([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(
        auto r, c.query(sql::kDeleteReservation, std::vector<Value>{std::string(reservation)}));
    for (auto& row : r)
      SLUICE_RETURN_IF_ERROR(c.query(
          sql::kUnreserve, std::vector<Value>{row.text(0), row.text(1), row.i64(2), row.i64(3)}));
    return {};
  });
}

Status Ledger::charge(const ChargeTarget& t, int64_t bytes, int64_t objects) {
  SLUICE_RETURN_IF_ERROR(ensure_account(t.team, t.tier));
  return commit("", t, bytes, objects);
}

namespace {

// The publish lock's statements, with "NOW" standing for the database server's clock in
// nanoseconds since the Unix epoch: a lock's expiry is judged by the one clock every writer
// shares, never by the clocks of the writers' hosts, which may disagree. SQLite's 'now' is
// the same for every use within one statement; PostgreSQL's now() is the time its
// transaction began, and each of these statements runs alone (autocommit).
struct LockSql {
  std::string take, renew, expire, want, wanted, unwant;
};

const LockSql& lock_sql(Dialect dialect) {
  auto make = [](std::string_view now) {
    auto with_now = [&](std::string text) {
      for (size_t at = text.find("NOW"); at != std::string::npos; at = text.find("NOW", at))
        text.replace(at, 3, now);
      return text;
    };
    return LockSql{
        with_now("INSERT INTO publishing (location, holder, expires_ns) VALUES ($1, $2, NOW + $3)"
                 " ON CONFLICT (location) DO UPDATE SET holder = $2, expires_ns = NOW + $3"
                 " WHERE publishing.expires_ns < NOW"),
        with_now("UPDATE publishing SET expires_ns = NOW + $3 WHERE location = $1 AND holder = $2"),
        with_now("DELETE FROM publishing WHERE expires_ns < NOW"),
        with_now("INSERT INTO publish_waiting (location, until_ns) VALUES ($1, NOW + $2)"
                 " ON CONFLICT (location) DO UPDATE SET until_ns = NOW + $2"),
        with_now("SELECT location FROM publish_waiting WHERE location = $1 AND until_ns > NOW"),
        with_now("DELETE FROM publish_waiting WHERE location = $1 OR until_ns < NOW")};
  };
  // SQLite 3.40 has no unixepoch('subsec'): whole seconds and the milliseconds of %f.
  static const LockSql sqlite = make(
      "((CAST(strftime('%s', 'now') AS INTEGER) * 1000"
      " + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)) * 1000000)");
  static const LockSql postgres = make("CAST(EXTRACT(EPOCH FROM now()) * 1000000000 AS BIGINT)");
  return dialect == Dialect::kSqlite ? sqlite : postgres;
}

constexpr int64_t kNsPerSecond = 1'000'000'000;
// How long a waiter's mark in publish_waiting stands unless renewed: several of its polls.
constexpr int64_t kWaitingMarkNs = kNsPerSecond;

}  // namespace

Result<std::string> Ledger::lock_key(std::string_view location, std::chrono::seconds hold,
                                     std::chrono::seconds wait) {
  const LockSql& sql = lock_sql(db_->dialect());
  const std::string holder = new_reservation_id();
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto pause = std::chrono::milliseconds(2);
  bool marked = false;  // this caller said in publish_waiting that it waits
  for (;;) {
    bool taken = false;
    Status asked = db_->with_conn([&](Conn& c) -> Status {
      SLUICE_RETURN_IF_ERROR(c.query(sql.take, std::vector<Value>{std::string(location), holder,
                                                                  hold.count() * kNsPerSecond}));
      taken = c.changes() == 1;
      // A holder that keeps the lock across many publishes (the charging store's lease)
      // looks for this mark and lets go early.
      if (taken && marked) {
        SLUICE_RETURN_IF_ERROR(c.query(sql.unwant, std::vector<Value>{std::string(location)}));
      } else if (!taken && wait.count() > 0) {
        SLUICE_RETURN_IF_ERROR(
            c.query(sql.want, std::vector<Value>{std::string(location), kWaitingMarkNs}));
        marked = true;
      }
      return {};
    });
    if (!asked) return std::unexpected(asked.error());
    if (taken) return holder;
    if (std::chrono::steady_clock::now() + pause > deadline)
      return fail(Code::kUnavailable, "another writer has been publishing " +
                                          std::string(location) + " for over " +
                                          std::to_string(wait.count()) + " s");
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, kLockPoll);
  }
}

Result<bool> Ledger::key_wanted(std::string_view location) {
  bool wanted = false;
  Status asked = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query(lock_sql(db_->dialect()).wanted,
                                               std::vector<Value>{std::string(location)}));
    wanted = !rows.empty();
    return {};
  });
  if (!asked) return std::unexpected(asked.error());
  return wanted;
}

Status Ledger::renew_key(std::string_view location, std::string_view holder,
                         std::chrono::seconds hold) {
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(c.query(lock_sql(db_->dialect()).renew,
                                   std::vector<Value>{std::string(location), std::string(holder),
                                                      hold.count() * kNsPerSecond}));
    if (c.changes() != 1)
      return fail(Code::kNotFound, "the publish lock of " + std::string(location) +
                                       " was taken over (held past its time)");
    return {};
  });
}

Status Ledger::unlock_key(std::string_view location, std::string_view holder) {
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM publishing WHERE location = $1 AND holder = $2",
                                   std::vector<Value>{std::string(location), std::string(holder)}));
    if (c.changes() != 1)
      return fail(Code::kNotFound, "the publish lock of " + std::string(location) +
                                       " was taken over (held past its time)");
    return {};
  });
}

Result<int64_t> Ledger::expire_reservations() {
  int64_t count = 0;
  Status outer = db_->transaction([&](Conn& c) -> Status {
    count = 0;
    SLUICE_ASSIGN_OR_RETURN(
        auto rows,
        c.query(
            "DELETE FROM reservations WHERE expires_ns < $1 RETURNING team, tier, bytes, objects",
            std::vector<Value>{now_ns()}));
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> sums;
    for (auto& r : rows) {
      auto& s = sums[{r.text(0), r.text(1)}];
      s.first += r.i64(2);
      s.second += r.i64(3);
      ++count;
    }
    // Publish locks of writers that crashed: taken over by the next writer of the key
    // anyway, and dropped here so keys never written again leave nothing behind; the same
    // for the marks of waiters that gave up.
    const LockSql& lock = lock_sql(c.dialect());
    SLUICE_RETURN_IF_ERROR(c.query(lock.expire));
    SLUICE_RETURN_IF_ERROR(c.query(lock.unwant, std::vector<Value>{std::string()}));
    for (auto& [key, s] : sums)
      SLUICE_RETURN_IF_ERROR(
          c.query("UPDATE accounts SET reserved_bytes = reserved_bytes - $3,"
                  " reserved_objects = reserved_objects - $4 WHERE team = $1 AND tier = $2",
                  std::vector<Value>{key.first, key.second, s.first, s.second}));
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return count;
}

// --- usage, reconciliation, history ------------------------------------------------------

Result<std::vector<Usage>> Ledger::usage() {
  std::vector<Usage> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(
        auto rows, c.query("SELECT team, project, tier, kind, bytes, objects, updated_ns FROM usage"
                           " ORDER BY team, project, tier, kind"));
    for (auto& r : rows) {
      Usage u;
      u.team = r.text(0);
      u.project = r.text(1);
      u.tier = parse_tier(r.text(2)).value_or(Tier::kNvme);
      u.kind = parse_kind(r.text(3)).value_or(Kind::kScratch);
      u.bytes = r.i64(4);
      u.objects = r.i64(5);
      u.updated_ns = r.i64(6);
      out.push_back(std::move(u));
    }
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Status Ledger::set_usage(const ChargeTarget& t, int64_t bytes, int64_t objects) {
  if (bytes < 0 || objects < 0) return fail(Code::kInvalidArgument, "set_usage: negative figures");
  SLUICE_RETURN_IF_ERROR(ensure_account(t.team, t.tier));
  std::string tier(tier_name(t.tier)), kind(kind_name(t.kind));
  return db_->transaction([&](Conn& c) -> Status {
    int64_t now = now_ns();
    // The account row first: a settle committing between the read and the write below
    // would otherwise be lost (PostgreSQL; SQLite has one writer at a time).
    if (c.dialect() == Dialect::kPostgres)
      SLUICE_RETURN_IF_ERROR(
          c.query("SELECT 1 FROM accounts WHERE team = $1 AND tier = $2 FOR UPDATE",
                  std::vector<Value>{t.team, tier}));
    SLUICE_ASSIGN_OR_RETURN(
        auto rows, c.query("SELECT bytes, objects FROM usage WHERE project = $1 AND tier = $2"
                           " AND kind = $3",
                           std::vector<Value>{t.project, tier, kind}));
    int64_t old_b = rows.empty() ? 0 : rows[0].i64(0), old_o = rows.empty() ? 0 : rows[0].i64(1);
    SLUICE_RETURN_IF_ERROR(c.query(
        "INSERT INTO usage (project, tier, kind, team, bytes, objects, updated_ns)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (project, tier, kind) DO UPDATE SET"
        " bytes = $5, objects = $6, updated_ns = $7",
        std::vector<Value>{t.project, tier, kind, t.team, bytes, objects, now}));
    SLUICE_RETURN_IF_ERROR(
        c.query(sql::kSettle, std::vector<Value>{t.team, tier, int64_t{0}, int64_t{0},
                                                 bytes - old_b, objects - old_o, now}));
    return {};
  });
}

Status Ledger::set_tally(std::string_view source, const ChargeTarget& t, int64_t bytes,
                         std::string_view reservation) {
  if (source.empty()) return fail(Code::kInvalidArgument, "set_tally: no source");
  if (bytes < 0) return fail(Code::kInvalidArgument, "set_tally: negative bytes");
  SLUICE_RETURN_IF_ERROR(ensure_account(t.team, t.tier));
  std::string tier(tier_name(t.tier)), kind(kind_name(t.kind));
  Status s = db_->transaction([&](Conn& c) -> Status {
    int64_t now = now_ns();
    SLUICE_ASSIGN_OR_RETURN(auto project, c.query("SELECT 1 FROM projects WHERE id = $1",
                                                  std::vector<Value>{t.project}));
    if (project.empty()) return fail(Code::kNotFound, "unknown project " + quote(t.project));
    int64_t released_b = 0, released_o = 0;
    if (!reservation.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto gone, c.query(sql::kDeleteReservation,
                                                 std::vector<Value>{std::string(reservation)}));
      for (auto& row : gone) {
        if (row.text(0) == t.team && row.text(1) == tier) {
          released_b += row.i64(2);
          released_o += row.i64(3);
        } else {
          SLUICE_RETURN_IF_ERROR(
              c.query(sql::kUnreserve,
                      std::vector<Value>{row.text(0), row.text(1), row.i64(2), row.i64(3)}));
        }
      }
    }
    // The account row first, as in set_usage: a settle between the read and the writes
    // below would otherwise be lost (PostgreSQL; SQLite has one writer at a time).
    if (c.dialect() == Dialect::kPostgres)
      SLUICE_RETURN_IF_ERROR(
          c.query("SELECT 1 FROM accounts WHERE team = $1 AND tier = $2 FOR UPDATE",
                  std::vector<Value>{t.team, tier}));
    std::vector<Value> key{std::string(source), t.project, tier, kind};
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT bytes FROM tallies WHERE source = $1 AND"
                                               " project = $2 AND tier = $3 AND kind = $4",
                                               key));
    int64_t delta = bytes - (rows.empty() ? 0 : rows[0].i64(0));
    if (bytes == 0) {
      SLUICE_RETURN_IF_ERROR(
          c.query("DELETE FROM tallies WHERE source = $1 AND project = $2 AND"
                  " tier = $3 AND kind = $4",
                  key));
    } else {
      SLUICE_RETURN_IF_ERROR(c.query(
          "INSERT INTO tallies (source, project, tier, kind, team, bytes, updated_ns)"
          " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (source, project, tier, kind)"
          " DO UPDATE SET team = $5, bytes = $6, updated_ns = $7",
          std::vector<Value>{std::string(source), t.project, tier, kind, t.team, bytes, now}));
    }
    if (delta != 0)
      SLUICE_RETURN_IF_ERROR(
          c.query(sql::kUsageAdd,
                  std::vector<Value>{t.project, tier, kind, t.team, delta, int64_t{0}, now}));
    if (delta != 0 || released_b != 0 || released_o != 0)
      SLUICE_RETURN_IF_ERROR(c.query(
          sql::kSettle,
          std::vector<Value>{t.team, tier, released_b, released_o, delta, int64_t{0}, now}));
    return {};
  });
  if (s) maybe_sample(t.team, t.tier);
  return s;
}

Result<std::vector<Tally>> Ledger::tallies(std::string_view source) {
  std::vector<Tally> out;
  Status s = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(
        auto rows, c.query("SELECT source, project, team, tier, kind, bytes, updated_ns FROM"
                           " tallies WHERE $1 = '' OR source = $1 ORDER BY source, project, tier,"
                           " kind",
                           std::vector<Value>{std::string(source)}));
    for (auto& r : rows) {
      SLUICE_ASSIGN_OR_RETURN(Tier tier, parse_tier(r.text(3)));
      SLUICE_ASSIGN_OR_RETURN(Kind kind, parse_kind(r.text(4)));
      out.push_back(
          Tally{r.text(0), ChargeTarget{r.text(1), r.text(2), tier, kind}, r.i64(5), r.i64(6)});
    }
    return {};
  });
  if (!s) return std::unexpected(s.error());
  return out;
}

Result<int64_t> Ledger::recount_accounts() {
  int64_t changed = 0;
  Status outer = db_->transaction([&](Conn& c) -> Status {
    changed = 0;
    // No reserve or settle may commit between the sums read below and the accounts
    // written from them (PostgreSQL: writers wait for the table lock; SQLite: one writer).
    if (c.dialect() == Dialect::kPostgres)
      SLUICE_RETURN_IF_ERROR(c.script("LOCK TABLE accounts IN SHARE ROW EXCLUSIVE MODE"));
    using Key = std::pair<std::string, std::string>;
    std::map<Key, std::array<int64_t, 4>> truth;  // used bytes, objects; reserved bytes, objects
    SLUICE_ASSIGN_OR_RETURN(
        auto used,
        c.query("SELECT team, tier, SUM(bytes), SUM(objects) FROM usage GROUP BY team, tier"));
    for (auto& r : used) {
      auto& v = truth[{r.text(0), r.text(1)}];
      v[0] = r.i64(2);
      v[1] = r.i64(3);
    }
    SLUICE_ASSIGN_OR_RETURN(auto held,
                            c.query("SELECT team, tier, SUM(bytes), SUM(objects) FROM reservations"
                                    " GROUP BY team, tier"));
    for (auto& r : held) {
      auto& v = truth[{r.text(0), r.text(1)}];
      v[2] = r.i64(2);
      v[3] = r.i64(3);
    }
    SLUICE_ASSIGN_OR_RETURN(auto accs,
                            c.query(std::string("SELECT ") + kAccountColumns + " FROM accounts"));
    int64_t now = now_ns();
    for (auto& r : accs) {
      Account a = account_from_row(r);
      auto it = truth.find({a.team, std::string(tier_name(a.tier))});
      std::array<int64_t, 4> v = it == truth.end() ? std::array<int64_t, 4>{} : it->second;
      if (v[0] == a.used_bytes && v[1] == a.used_objects && v[2] == a.reserved_bytes &&
          v[3] == a.reserved_objects)
        continue;
      ++changed;
      SLUICE_RETURN_IF_ERROR(c.query(
          "UPDATE accounts SET used_bytes = $3, used_objects = $4, reserved_bytes = $5,"
          " reserved_objects = $6, updated_ns = $7,"
          " over_soft_since_ns = CASE WHEN (soft_bytes IS NOT NULL AND $3 > soft_bytes)"
          " OR (soft_objects IS NOT NULL AND $4 > soft_objects)"
          " THEN COALESCE(over_soft_since_ns, $7) ELSE NULL END"
          " WHERE team = $1 AND tier = $2",
          std::vector<Value>{a.team, std::string(tier_name(a.tier)), v[0], v[1], v[2], v[3], now}));
    }
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return changed;
}

Status Ledger::record_history() {
  return db_->with_conn([&](Conn& c) -> Status {
    std::vector<Value> now{now_ns()};
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO history (team, tier, t_ns, bytes, objects)"
                " SELECT team, tier, CAST($1 AS BIGINT), used_bytes, used_objects FROM accounts"
                " WHERE true ON CONFLICT (team, tier, t_ns) DO NOTHING",
                now));
    SLUICE_RETURN_IF_ERROR(c.query(kSampleTiers, now));
    return {};
  });
}

void Ledger::maybe_sample(const std::string& team, Tier tier) {
  int64_t now = now_ns();
  {
    MutexLock lock(sampling_->mu);
    int64_t& last = sampling_->last_ns[{team, tier}];
    if (last != 0 && now - last < options_.history_interval.count() * 1'000'000'000) return;
    last = now;
  }
  // A missed sample only thins the history; it never fails the write that caused it.
  (void)db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO history (team, tier, t_ns, bytes, objects)"
                " SELECT team, tier, CAST($3 AS BIGINT), used_bytes, used_objects FROM accounts"
                " WHERE team = $1 AND tier = $2 ON CONFLICT (team, tier, t_ns) DO NOTHING",
                std::vector<Value>{team, std::string(tier_name(tier)), now}));
    SLUICE_RETURN_IF_ERROR(c.query(kSampleTiers, std::vector<Value>{now}));
    return {};
  });
}

Status Ledger::add_history(std::string_view team, Tier tier, const HistoryPoint& p) {
  return db_->with_conn([&](Conn& c) -> Status {
    if (team != kAllTeams) SLUICE_RETURN_IF_ERROR(require_team(c, team));
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO history (team, tier, t_ns, bytes, objects) VALUES ($1, $2, $3, $4, $5)"
                " ON CONFLICT (team, tier, t_ns) DO UPDATE SET bytes = $4, objects = $5",
                std::vector<Value>{std::string(team), std::string(tier_name(tier)), p.t_ns, p.bytes,
                                   p.objects}));
    return {};
  });
}

namespace {
Status require_project(Conn& c, std::string_view project) {
  SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT 1 FROM projects WHERE id = $1",
                                             std::vector<Value>{std::string(project)}));
  if (rows.empty()) return fail(Code::kNotFound, "unknown project " + quote(project));
  return {};
}

std::optional<int64_t> seconds_ns(const std::optional<std::chrono::seconds>& s) {
  if (!s) return std::nullopt;
  return s->count() * 1'000'000'000;
}
}  // namespace

namespace {

Status check_rule(const RetentionRule& r) {
  auto too_big = [](const std::optional<uint64_t>& v) { return v && *v > uint64_t{1} << 62; };
  auto bad_duration = [](const std::optional<std::chrono::seconds>& d) {
    return d && (d->count() < 0 || d->count() > int64_t{100} * 365 * 86400);
  };
  if (too_big(r.keep_last) || too_big(r.keep_every) || bad_duration(r.max_age) ||
      bad_duration(r.max_idle))
    return fail(Code::kInvalidArgument, "retention rule for project " + quote(r.project) +
                                            ": a count or duration out of range");
  if (r.keep_every && *r.keep_every == 0)
    return fail(Code::kInvalidArgument, "retention rule for project " + quote(r.project) +
                                            ": keep-every must be at least 1");
  if (r.series.empty() && r.keep_every)
    return fail(Code::kInvalidArgument, "retention rule for project " + quote(r.project) +
                                            ": keep-every keeps checkpoint steps: give a series");
  if (!r.series.empty() &&
      (r.series.find('/') != std::string::npos || !store::validate_key(r.series + "/x")))
    return fail(Code::kInvalidArgument, "retention rule for project " + quote(r.project) +
                                            ": series " + quote(r.series) + " is not a name");
  return {};
}

// Writes (or, when empty, deletes) a rule, inside a transaction.
Status write_rule(Conn& c, const RetentionRule& r, int64_t now) {
  std::vector<Value> key{r.project, r.series};
  if (r.empty()) {
    SLUICE_RETURN_IF_ERROR(
        c.query("DELETE FROM retention WHERE project = $1 AND series = $2", key));
    return {};
  }
  auto u = [](const std::optional<uint64_t>& v) {
    return v ? Value(static_cast<int64_t>(*v)) : Value(std::monostate{});
  };
  SLUICE_RETURN_IF_ERROR(c.query(
      "INSERT INTO retention (project, series, keep_last, keep_every, max_age_ns, max_idle_ns,"
      " updated_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (project, series) DO UPDATE"
      " SET keep_last = $3, keep_every = $4, max_age_ns = $5, max_idle_ns = $6, updated_ns = $7",
      std::vector<Value>{r.project, r.series, u(r.keep_last), u(r.keep_every),
                         opt_value(seconds_ns(r.max_age)), opt_value(seconds_ns(r.max_idle)),
                         now}));
  return {};
}

RetentionRule rule_of(const Row& r) {
  RetentionRule rule{.project = r.text(0), .series = r.text(1)};
  if (!r.is_null(2)) rule.keep_last = static_cast<uint64_t>(r.i64(2));
  if (!r.is_null(3)) rule.keep_every = static_cast<uint64_t>(r.i64(3));
  if (!r.is_null(4)) rule.max_age = std::chrono::seconds(r.i64(4) / 1'000'000'000);
  if (!r.is_null(5)) rule.max_idle = std::chrono::seconds(r.i64(5) / 1'000'000'000);
  return rule;
}

constexpr const char* kRuleColumns =
    "SELECT project, series, keep_last, keep_every, max_age_ns, max_idle_ns FROM retention";

}  // namespace

Status Ledger::set_rule(const RetentionRule& r) {
  SLUICE_RETURN_IF_ERROR(check_rule(r));
  return db_->transaction([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(require_project(c, r.project));
    return write_rule(c, r, now_ns());
  });
}

Result<RetentionRule> Ledger::update_rule(const RulePatch& p) {
  RetentionRule r{.project = p.project, .series = p.series};
  Status st = db_->transaction([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(require_project(c, p.project));
    // The project's row first: another update between the read and the write below would
    // otherwise be lost (PostgreSQL; SQLite has one writer at a time).
    if (c.dialect() == Dialect::kPostgres)
      SLUICE_RETURN_IF_ERROR(c.query("SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
                                     std::vector<Value>{p.project}));
    SLUICE_ASSIGN_OR_RETURN(
        auto rows, c.query(std::string(kRuleColumns) + " WHERE project = $1 AND series = $2",
                           std::vector<Value>{p.project, p.series}));
    r = rows.empty() ? RetentionRule{.project = p.project, .series = p.series} : rule_of(rows[0]);
    if (p.keep_last) r.keep_last = *p.keep_last;
    if (p.keep_every) r.keep_every = *p.keep_every;
    if (p.max_age) r.max_age = *p.max_age;
    if (p.max_idle) r.max_idle = *p.max_idle;
    SLUICE_RETURN_IF_ERROR(check_rule(r));
    return write_rule(c, r, now_ns());
  });
  if (!st) return std::unexpected(st.error());
  return r;
}

Status Ledger::remove_rule(std::string_view project, std::string_view series) {
  return db_->transaction([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(require_project(c, project));
    std::vector<Value> key{std::string(project), std::string(series)};
    SLUICE_ASSIGN_OR_RETURN(
        auto rows, c.query("SELECT 1 FROM retention WHERE project = $1 AND series = $2", key));
    if (rows.empty())
      return fail(Code::kNotFound, "no retention rule for project " + quote(project) +
                                       (series.empty() ? "" : " series " + quote(series)));
    SLUICE_RETURN_IF_ERROR(
        c.query("DELETE FROM retention WHERE project = $1 AND series = $2", key));
    return {};
  });
}

Result<std::vector<RetentionRule>> Ledger::rules() {
  std::vector<RetentionRule> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto rows,
                            c.query(std::string(kRuleColumns) + " ORDER BY project, series"));
    for (auto& r : rows) out.push_back(rule_of(r));
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Status Ledger::pin(std::string_view project, std::string_view prefix) {
  // A pin is a key prefix as the project's keys are spelled: relative, no "." or ".."
  // components, no doubled '/' (one that can never match would only look like protection).
  std::string probe(prefix);
  if (probe.ends_with('/')) probe += 'x';
  if (prefix.empty() || prefix.size() > 1024 || prefix.find('*') != std::string_view::npos ||
      !store::validate_key(probe))
    return fail(
        Code::kInvalidArgument,
        "pin " + quote(prefix) +
            ": expected a key prefix within the project, such as "
            "llama/step-000000001000/ (relative, no '.', '..', '//' or '*', at most 1024 bytes)");
  return db_->transaction([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(require_project(c, project));
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO pins (project, prefix, created_ns) VALUES ($1, $2, $3)"
                " ON CONFLICT (project, prefix) DO NOTHING",
                std::vector<Value>{std::string(project), std::string(prefix), now_ns()}));
    return {};
  });
}

Status Ledger::unpin(std::string_view project, std::string_view prefix) {
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(c.query("DELETE FROM pins WHERE project = $1 AND prefix = $2",
                                   std::vector<Value>{std::string(project), std::string(prefix)}));
    if (c.changes() == 0)
      return fail(Code::kNotFound, "project " + quote(project) + " has no pin " + quote(prefix));
    return {};
  });
}

Result<std::vector<std::pair<std::string, std::string>>> Ledger::pins() {
  std::vector<std::pair<std::string, std::string>> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto rows,
                            c.query("SELECT project, prefix FROM pins ORDER BY project, prefix"));
    for (auto& r : rows) out.emplace_back(r.text(0), r.text(1));
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Status Ledger::add_trash(const std::vector<TrashEntry>& entries) {
  return db_->transaction([&](Conn& c) -> Status {
    for (const TrashEntry& e : entries)
      SLUICE_RETURN_IF_ERROR(
          c.query("INSERT INTO trash (run, project, key, trash_key, reason, kind, bytes,"
                  " trashed_ns, purge_after_ns) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                  std::vector<Value>{e.run, e.project, e.key, e.trash_key, e.reason,
                                     std::string(kind_name(e.kind)), e.bytes, e.trashed_ns,
                                     e.purge_after_ns}));
    return {};
  });
}

Result<std::vector<TrashEntry>> Ledger::trash(std::string_view run) {
  std::vector<TrashEntry> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    std::string sql =
        "SELECT run, project, key, trash_key, reason, bytes, trashed_ns, purge_after_ns, kind"
        " FROM trash";
    std::vector<Value> args;
    if (!run.empty()) {
      sql += " WHERE run = $1";
      args.emplace_back(std::string(run));
    }
    sql += " ORDER BY run, project, key";
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query(sql, args));
    for (auto& r : rows)
      out.push_back({r.text(0), r.text(1), r.text(2), r.text(3), r.text(4), r.i64(5), r.i64(6),
                     r.i64(7), parse_kind(r.text(8)).value_or(Kind::kScratch)});
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Status Ledger::drop_trash(std::string_view run, std::string_view project, std::string_view key) {
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(
        c.query("DELETE FROM trash WHERE run = $1 AND project = $2 AND key = $3",
                std::vector<Value>{std::string(run), std::string(project), std::string(key)}));
    if (c.changes() == 0)
      return fail(Code::kNotFound, "no trash entry " + std::string(key) + " of run " +
                                       std::string(run) + " in project " + quote(project));
    return {};
  });
}

Status Ledger::set_capacity(Tier tier, std::optional<int64_t> bytes,
                            std::optional<int64_t> objects) {
  if ((bytes && *bytes < 0) || (objects && *objects < 0))
    return fail(Code::kInvalidArgument,
                "capacity of tier " + std::string(tier_name(tier)) + " is negative");
  return db_->with_conn([&](Conn& c) -> Status {
    SLUICE_RETURN_IF_ERROR(
        c.query("INSERT INTO capacities (tier, bytes, objects, updated_ns) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (tier) DO UPDATE SET bytes = $2, objects = $3, updated_ns = $4",
                std::vector<Value>{std::string(tier_name(tier)), opt_value(bytes),
                                   opt_value(objects), now_ns()}));
    return {};
  });
}

Result<std::vector<Capacity>> Ledger::capacities() {
  std::vector<Capacity> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto rows, c.query("SELECT tier, bytes, objects FROM capacities"
                                               " ORDER BY tier"));
    for (auto& r : rows)
      out.push_back({parse_tier(r.text(0)).value_or(Tier::kNvme), r.opt_i64(1), r.opt_i64(2)});
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

Result<std::vector<TierTotal>> Ledger::tier_totals() {
  std::vector<TierTotal> out;
  for (Tier tier : kAllTiers) out.push_back(TierTotal{.tier = tier});
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    SLUICE_ASSIGN_OR_RETURN(
        auto used, c.query("SELECT tier, SUM(used_bytes), SUM(used_objects), SUM(reserved_bytes)"
                           " FROM accounts GROUP BY tier"));
    for (auto& r : used) {
      auto tier = parse_tier(r.text(0));
      if (!tier) continue;
      TierTotal& t = out[static_cast<size_t>(*tier)];
      t.used_bytes = r.i64(1);
      t.used_objects = r.i64(2);
      t.reserved_bytes = r.i64(3);
    }
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  SLUICE_ASSIGN_OR_RETURN(std::vector<Capacity> caps, capacities());
  for (const Capacity& cap : caps) {
    TierTotal& t = out[static_cast<size_t>(cap.tier)];
    t.capacity_bytes = cap.bytes;
    t.capacity_objects = cap.objects;
  }
  return out;
}

Result<std::vector<HistoryPoint>> Ledger::history(std::string_view team, Tier tier,
                                                  int64_t since_ns) {
  std::vector<HistoryPoint> out;
  Status outer = db_->with_conn([&](Conn& c) -> Status {
    if (team != kAllTeams) SLUICE_RETURN_IF_ERROR(require_team(c, team));
    SLUICE_ASSIGN_OR_RETURN(
        auto rows,
        c.query("SELECT t_ns, bytes, objects FROM history WHERE team = $1 AND tier = $2"
                " AND t_ns >= $3 ORDER BY t_ns",
                std::vector<Value>{std::string(team), std::string(tier_name(tier)), since_ns}));
    for (auto& r : rows) out.push_back({r.i64(0), r.i64(1), r.i64(2)});
    return {};
  });
  if (!outer) return std::unexpected(outer.error());
  return out;
}

}  // namespace sluice::ledger
