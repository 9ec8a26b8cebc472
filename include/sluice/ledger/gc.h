// sluice/ledger/gc.h: the retention engine behind `sluice gc` (docs/ledger.md, "Retention
// and clean-up"): what the rules remove and why, a trash stage, purge after a delay, restore.
//
//   GcOptions o;  o.delay = std::chrono::hours(24);
//   GcPlan plan = plan_gc(ledger, o).value();       // changes nothing
//   GcRunReport r = run_gc(ledger, o).value();       // trashes, then purges what waited
//   restore_gc(ledger, r.run, o);                    // brings that run back
//
// Units are planned per project under its rules (retention.h): the steps of each series
// with a rule (a step counts as complete only when its manifest decodes and every shard it
// names is there at its size), then every other object under the project's own rule. Keys
// in the trash (.sluice-trash/) and checkpoint steps a series rule does not cover are never
// units of the project rule.
//
// A run moves each unit to .sluice-trash/RUN/<key> in its project: recorded in the ledger
// first (a crash leaves an entry to purge, never an unrecorded copy), copied (never over an
// existing key), then the originals removed, a step's manifest first (so a half-removed
// step is no longer listed). Moves are not charged: they neither add nor free room. Then
// everything whose delay has passed is removed from the trash and uncharged, as the kind it
// was charged as, when its original is gone. Restore copies a run's keys back, a step's
// manifest last and only when every other key of the step came back, and never into a step
// saved again since.
//
// A project that cannot be listed or opened is an error in the report; the others go on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/ledger/ledger.h"
#include "sluice/ledger/retention.h"
#include "sluice/store/store.h"

namespace sluice::ledger {

inline constexpr std::string_view kTrashPrefix = ".sluice-trash/";

enum class GcPhase {
  kPlanning,  // done and total are projects
  kTrashing,  // bytes of the units the plan removes
  kPurging,   // trash objects whose delay has passed
};

struct GcProgress {
  GcPhase phase = GcPhase::kPlanning;
  uint64_t done = 0, total = 0;
};

struct GcOptions {
  std::string project;  // only this project; empty: every project with a rule
  // An incomplete checkpoint step (no manifest, a torn one, a lost shard) younger than this
  // is left alone: it may be a save in progress.
  std::chrono::seconds grace{24 * 3600};
  // How long trashed data waits before a run purges it (0: this run's too).
  std::chrono::seconds delay{24 * 3600};
  store::StoreOptions stores;  // how the projects' locations are opened (S3 endpoint, ...)
  // Called before each project, unit or object of a phase, and once at its end (done ==
  // total), on the caller's thread (plan and run).
  std::function<void(const GcProgress&)> on_progress;
};

// One unit with what its rule decided.
struct GcUnit {
  std::string project, series;  // series empty: the project's own rule
  RetentionUnit unit;
  RetentionDecision decision;
};

struct GcPlan {
  std::vector<GcUnit> units;
  std::vector<std::string> errors;   // projects that could not be planned
  std::vector<std::string> skipped;  // keys left alone, and why (a link out of the project)
};

// What every rule decides now. NotFound for an unknown options.project.
Result<GcPlan> plan_gc(Ledger& ledger, const GcOptions& options);

struct GcRunReport {
  std::string run;  // the run's ID (restore_gc takes it)
  int64_t trashed_units = 0, trashed_bytes = 0;
  int64_t purge_after_ns = 0;  // when this run's trash may be purged
  int64_t purged_objects = 0, purged_bytes = 0;
  std::vector<std::string> errors;   // units or purges that failed; the rest went on
  std::vector<std::string> skipped;  // keys left alone, and why (GcPlan::skipped)
};

// Plans, moves what the plan removes to the trash (`on_trashed` is told of each unit
// moved), then purges what has waited out its delay.
Result<GcRunReport> run_gc(Ledger& ledger, const GcOptions& options,
                           const std::function<void(const GcUnit&)>& on_trashed = {});

struct GcRestoreReport {
  int64_t restored = 0, objects = 0;  // of the run's objects
  std::vector<std::string> errors;    // keys left in the trash, and why
};

// Brings back everything run `run` moved to the trash. NotFound when the trash holds
// nothing of it.
Result<GcRestoreReport> restore_gc(Ledger& ledger, std::string_view run, const GcOptions& options);

// As JSON, in the shapes of sluice/ledger/json.h.
void to_json(nlohmann::json& j, const GcUnit& unit);
void to_json(nlohmann::json& j, const GcRunReport& report);

}  // namespace sluice::ledger
