// sluice/ledger/ledger.h: what sluice stores, charged to teams; quotas enforced before a
// write starts.
//
// The ledger is a small catalog in SQLite (the embedded default, `$SLUICE_HOME/ledger.db`)
// or PostgreSQL (a fleet: `postgresql://...`, shared by every node). It knows:
// - teams, and projects: a project is a location prefix ("s3://bucket/vision/",
//   "file:///scratch/nlp") with an ID, an owning team, the tier its bytes rest on and the
//   kind of data it holds by default; everything written under it is charged to it;
// - usage: bytes and objects by project, tier and kind (and so by team), each with the time
//   it was last changed;
// - accounts: per team and tier, the usage, the bytes and objects reserved by writers in
//   flight, and the quota (soft and hard limits on bytes and on objects, a grace period);
// - history: samples of every account over time, for forecasts.
//
// A writer reserves what it will write before it writes (`reserve`), grows the reservation
// if it writes more (`grow`), and then either `commit`s (the usage changes by what it
// really wrote and the reservation goes) or `release`s. A reservation is refused with
// QuotaExceeded when used + reserved + asked would pass the hard limit, or the soft limit
// once its grace period is over; the check and the reservation are one atomic step, so
// concurrent writers can never pass a hard limit together. A reservation not committed or
// released within its time to live (a crashed writer) expires and stops counting.
//
// Thread-safe; one Ledger per process is enough. docs/ledger.md says more; the schema is
// docs/formats/ledger-schema.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/ledger/retention.h"

namespace sluice::ledger {

class Db;
class Batcher;

enum class Tier { kRam, kNvme, kPeer, kObject };
enum class Kind { kDataset, kCheckpoint, kScratch, kCache };
inline constexpr Tier kAllTiers[] = {Tier::kRam, Tier::kNvme, Tier::kPeer, Tier::kObject};
inline constexpr Kind kAllKinds[] = {Kind::kDataset, Kind::kCheckpoint, Kind::kScratch,
                                     Kind::kCache};

std::string_view tier_name(Tier tier);  // "ram", "nvme", "peer", "object"
std::string_view kind_name(Kind kind);  // "dataset", "checkpoint", "scratch", "cache"
Result<Tier> parse_tier(std::string_view name);
Result<Kind> parse_kind(std::string_view name);
// The tier a location's scheme rests on: s3:// object, mem:// ram, peer:// and node+ peer,
// file:// and plain paths nvme.
Tier tier_of_location(std::string_view location);

// Project locations: an absolute path (or file://), s3://BUCKET[/prefix], mem://NAME[/...],
// peer:// or sluiced://; no control characters, not "/" itself.
Status validate_location(std::string_view project, std::string_view location);
// The one spelling of a location that projects are stored and matched under: file:// for
// paths, "..", "." and symlinks resolved (as far as the path exists), no trailing '/'.
std::string normalise_location(std::string_view location);

// Team and project names: 1-64 bytes of [A-Za-z0-9._-], not starting with '.' or '-'.
Status validate_name(std::string_view what, std::string_view name);

struct Project {
  std::string id;
  std::string team;
  std::string location;  // normalised: no trailing '/', file:// for plain paths
  Tier tier = Tier::kNvme;
  Kind kind = Kind::kScratch;
  int64_t created_ns = 0;
};

// Limits of one team on one tier. Unset means unlimited. Past the soft limit writes still
// succeed for `grace`; after that the soft limit refuses like the hard one, until usage
// drops below it again.
struct Limits {
  std::optional<int64_t> soft_bytes, hard_bytes;
  std::optional<int64_t> soft_objects, hard_objects;
  std::chrono::seconds grace{7 * 24 * 3600};
};

struct Account {
  std::string team;
  Tier tier = Tier::kNvme;
  int64_t used_bytes = 0, used_objects = 0;
  int64_t reserved_bytes = 0, reserved_objects = 0;
  Limits limits;
  std::optional<int64_t> over_soft_since_ns;  // when usage first went past a soft limit
  int64_t updated_ns = 0;
};

struct Usage {
  std::string team, project;
  Tier tier = Tier::kNvme;
  Kind kind = Kind::kScratch;
  int64_t bytes = 0, objects = 0;
  int64_t updated_ns = 0;  // when this figure was last true (last change or recount)
};

struct HistoryPoint {
  int64_t t_ns = 0;
  int64_t bytes = 0, objects = 0;
};

// How much a tier can hold across every team (for forecasts); unset means unknown.
struct Capacity {
  Tier tier = Tier::kNvme;
  std::optional<int64_t> bytes, objects;
};

// What a tier holds across every team, and what it can hold (unset: unknown).
struct TierTotal {
  Tier tier = Tier::kNvme;
  int64_t used_bytes = 0, used_objects = 0, reserved_bytes = 0;
  std::optional<int64_t> capacity_bytes, capacity_objects;
};

// Where an account stands against its limits at `now_ns`: "ok", "over soft, grace until
// <time>", "over soft, grace over" or "at hard limit".
std::string account_state(const Account& account, int64_t now_ns);

// Usage summed by one of its columns (`sluice usage --by`).
enum class UsageBy { kTeam, kProject, kTier, kKind };
Result<UsageBy> parse_usage_by(std::string_view name);  // "team", "project", "tier", "kind"
std::string_view usage_by_name(UsageBy by);
struct UsageTotal {
  std::string group;  // the team, project, tier or kind
  int64_t bytes = 0, objects = 0;
  int64_t updated_ns = 0;  // the newest of the figures summed
};
// One total per group, in the group's order.
std::vector<UsageTotal> usage_totals(const std::vector<Usage>& usage, UsageBy by);

// The team name under which the history keeps each tier's total over all teams.
inline constexpr std::string_view kAllTeams = "*";

// An object moved to the trash by `sluice gc run`, until it is purged or restored.
struct TrashEntry {
  std::string run;        // the gc run that moved it
  std::string project;    // whose location holds both keys
  std::string key;        // where it was
  std::string trash_key;  // where it is: .sluice-trash/<run>/<key>
  std::string reason;
  int64_t bytes = 0;
  int64_t trashed_ns = 0, purge_after_ns = 0;
  Kind kind = Kind::kScratch;  // what it was charged as: the purge uncharges that
};

// What one gc run left in the trash of one project (`sluice gc trash`).
struct TrashRun {
  std::string run, project;
  int64_t objects = 0, bytes = 0;
  int64_t trashed_ns = 0, purge_after_ns = 0;
};
// The trash's entries grouped by run and project, in that order.
std::vector<TrashRun> trash_runs(const std::vector<TrashEntry>& entries);

// What a charge is against: a project's usage on one tier, of one kind.
struct ChargeTarget {
  std::string project;
  std::string team;  // the project's team
  Tier tier = Tier::kNvme;
  Kind kind = Kind::kScratch;
};

// What one source (a node's cache) holds for a target, as it last said (set_tally).
struct Tally {
  std::string source;
  ChargeTarget target;
  int64_t bytes = 0;
  int64_t updated_ns = 0;
};

struct LedgerOptions {
  // How long a reservation lives unless committed, released or grown (which renews it).
  std::chrono::seconds reservation_ttl{15 * 60};
  // An account's usage is sampled into the history at most this often (on commits).
  std::chrono::seconds history_interval{3600};
  // PostgreSQL: connections kept open for this process's concurrent callers.
  size_t max_connections = 16;
  // Test hook: the clock (nanoseconds since the Unix epoch); null means the real one.
  int64_t (*clock)() = nullptr;
};

class Ledger {
 public:
  // Opens (and creates, the first time) a ledger:
  //   sqlite:///abs/path/ledger.db, or a plain path ending in .db   SQLite file
  //   postgresql://user[:password]@host[:port]/db[?...]             PostgreSQL (also postgres://)
  // An unreachable server is Unavailable, naming it (without the password).
  static Result<std::unique_ptr<Ledger>> open(std::string_view uri,
                                              const LedgerOptions& options = {});
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Where the ledger is, without a password.
  std::string describe() const;

  // --- teams and projects --------------------------------------------------------------
  Status add_team(std::string_view team);  // AlreadyExists if it is there
  Result<std::vector<std::string>> teams();
  // The team must exist (NotFound otherwise); the ID and the location must be new. A
  // location inside or around another project's is refused (InvalidArgument): every byte
  // belongs to one project.
  Status add_project(Project project);
  // Only a project with no usage left (FailedPrecondition as InvalidArgument otherwise).
  Status remove_project(std::string_view id);
  Result<std::vector<Project>> projects();
  // The project owning `location` (the longest project location it lies under), or null.
  static const Project* owner_of(const std::vector<Project>& projects, std::string_view location);
  // The pins (project, prefix) that cover keys under `location`, as keys are spelled
  // there: a pin of its project that reaches into `location` with the part beyond it, and
  // "" for one that covers all of it. Empty when no project owns `location`.
  static std::vector<std::string> pins_within(
      const std::vector<Project>& projects,
      const std::vector<std::pair<std::string, std::string>>& pins, std::string_view location);

  // --- quotas --------------------------------------------------------------------------
  // Replaces the team's limits on a tier. NotFound for an unknown team.
  Status set_limits(std::string_view team, Tier tier, const Limits& limits);
  // Every account, or one team's (NotFound for an unknown team).
  Result<std::vector<Account>> accounts(std::string_view team = {});

  // --- reservations ----------------------------------------------------------------------
  // Reserves bytes and objects against the target's team and tier. QuotaExceeded names the
  // team, tier, limit, usage and what was asked. Returns the reservation's ID.
  Result<std::string> reserve(const ChargeTarget& target, int64_t bytes, int64_t objects);
  // Adds to a reservation (a writer that writes more than it first said), checked like
  // reserve; renews its time to live. NotFound when it expired.
  Status grow(std::string_view reservation, const ChargeTarget& target, int64_t bytes,
              int64_t objects);
  // Ends a reservation and changes the target's usage by (bytes, objects), which may be
  // negative (an overwrite with a smaller object) and need not equal what was reserved.
  // A reservation that already expired still charges the usage.
  Status commit(std::string_view reservation, const ChargeTarget& target, int64_t bytes,
                int64_t objects);
  // Ends a reservation without charging anything.
  Status release(std::string_view reservation);
  // Changes usage with no reservation (a removal: negative figures).
  Status charge(const ChargeTarget& target, int64_t bytes, int64_t objects);
  // One holder of `location` at a time, for stores that cannot say what a publish replaced
  // (object stores): the charging layer holds the lock of a key's folder across looking at
  // the old objects, publishing and charging, so racing writers charge against exactly
  // what each replaced. Waits up to `wait` for another holder (Unavailable after), asking
  // again at least every kLockPoll and marking meanwhile that it waits (key_wanted), and
  // takes over a lock held past `hold` (a crashed writer). Expiry is judged by the database
  // server's clock (SQLite's or PostgreSQL's own time), never by the writers' hosts' clocks.
  // Returns the holder's ID.
  Result<std::string> lock_key(std::string_view location, std::chrono::seconds hold,
                               std::chrono::seconds wait);
  static constexpr std::chrono::milliseconds kLockPoll{100};
  // Whether another caller is waiting in lock_key for `location` now: a holder that keeps
  // the lock across many publishes lets go early for it.
  Result<bool> key_wanted(std::string_view location);
  // A holder whose publish runs long renews its lock (for another `hold`, from the server's
  // time now); NotFound when it was taken over meanwhile, as unlock_key says then too.
  Status renew_key(std::string_view location, std::string_view holder, std::chrono::seconds hold);
  Status unlock_key(std::string_view location, std::string_view holder);
  // Drops every reservation past its time to live; returns how many.
  Result<int64_t> expire_reservations();

  // --- usage, reconciliation and history -------------------------------------------------
  Result<std::vector<Usage>> usage();
  // Sets one usage figure to what a recount found (reconcile), keeping the account in step.
  Status set_usage(const ChargeTarget& target, int64_t bytes, int64_t objects);
  // A source that knows what it holds (a node's cache, which can count its chunks) charges
  // it as one absolute figure per target instead of by changes: set_tally sets what
  // `source` holds for `target` to `bytes`, changes the target's usage by the difference
  // from the figure last set, and ends `reservation` (when not empty) without charging it,
  // all in one transaction. Setting the same figure again changes nothing, so a caller that
  // lost the reply sends it again, and one that restarts recounts and sets what it holds.
  // 0 forgets the figure. NotFound when the target's project is gone.
  Status set_tally(std::string_view source, const ChargeTarget& target, int64_t bytes,
                   std::string_view reservation = {});
  // The figures `source` (empty: every source) set last, by source, project, tier, kind.
  Result<std::vector<Tally>> tallies(std::string_view source = {});
  // Recomputes every account's used and reserved figures from the usage rows and the live
  // reservations; returns the accounts whose figures changed.
  Result<int64_t> recount_accounts();
  // A tier's capacity across all teams (none: unknown).
  Status set_capacity(Tier tier, std::optional<int64_t> bytes, std::optional<int64_t> objects);
  Result<std::vector<Capacity>> capacities();
  // Every tier, in kAllTiers order: its usage and reservations summed over the teams, and
  // its capacity.
  Result<std::vector<TierTotal>> tier_totals();
  // Appends a sample of every account and of every tier's total (or records one given
  // point, for imports and tests). history(kAllTeams, tier) is the tier's total.
  Status record_history();
  Status add_history(std::string_view team, Tier tier, const HistoryPoint& point);
  Result<std::vector<HistoryPoint>> history(std::string_view team, Tier tier, int64_t since_ns = 0);

  // --- retention (retention.h) ----------------------------------------------------------
  // Sets the rule of a project (or of one checkpoint series in it); an empty rule removes
  // it. NotFound for an unknown project; InvalidArgument for a series that is not a name
  // (no '/'), or keep_every without a series (it keeps checkpoint steps).
  Status set_rule(const RetentionRule& rule);
  // Changes the fields a patch names and keeps the others, in one transaction (two callers
  // changing different fields both keep theirs); returns the rule as it now is, empty when
  // every field was cleared (the rule is then removed). Checked as set_rule checks.
  Result<RetentionRule> update_rule(const RulePatch& patch);
  // NotFound when the project (or series) has no rule.
  Status remove_rule(std::string_view project, std::string_view series = {});
  Result<std::vector<RetentionRule>> rules();
  // Keys of a project starting with `prefix` are never removed by gc.
  Status pin(std::string_view project, std::string_view prefix);
  Status unpin(std::string_view project, std::string_view prefix);  // NotFound if not pinned
  Result<std::vector<std::pair<std::string, std::string>>> pins();  // (project, prefix)
  Status add_trash(const std::vector<TrashEntry>& entries);
  Result<std::vector<TrashEntry>> trash(std::string_view run = {});
  Status drop_trash(std::string_view run, std::string_view project, std::string_view key);

  int64_t now_ns() const;
  std::chrono::seconds reservation_ttl() const { return options_.reservation_ttl; }

 private:
  Ledger(std::unique_ptr<Db> db, LedgerOptions options);
  Status ensure_account(const std::string& team, Tier tier);
  Error quota_error(const ChargeTarget& target, int64_t bytes, int64_t objects);
  void maybe_sample(const std::string& team, Tier tier);

  std::unique_ptr<Db> db_;
  LedgerOptions options_;
  std::unique_ptr<Batcher> batcher_;  // group commit of reserve, commit and charge
  struct Sampling;
  std::unique_ptr<Sampling> sampling_;
};

}  // namespace sluice::ledger
