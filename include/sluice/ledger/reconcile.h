// sluice/ledger/reconcile.h: recount what the ledger says against the real stores.
//
// Usage drifts in every system that counts it: a writer killed after it published but
// before it was charged, a delete done behind sluice's back, a ledger that was down. For
// every project, reconcile lists the project's location, sums the bytes and objects it
// finds, and sets the project's usage on its own tier to that (the difference goes to the
// project's default kind; other kinds keep their figures unless the listing shows less
// than they add up to). It also drops expired reservations and recounts every account.
// A location that cannot be listed (a missing directory, an unmounted file system, a
// server error) is reported and left alone: absence is never taken as "empty".
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/ledger/ledger.h"
#include "sluice/store/store.h"

namespace sluice::ledger {

struct ReconcileEntry {
  std::string project, team, location;
  Tier tier = Tier::kNvme;
  int64_t ledger_bytes = 0, ledger_objects = 0;  // before
  int64_t found_bytes = 0, found_objects = 0;    // what the listing found
  bool changed = false;
  std::optional<Error> error;  // the location could not be listed; nothing changed
};

struct ReconcileReport {
  std::vector<ReconcileEntry> projects;
  int64_t expired_reservations = 0;
  int64_t accounts_recounted = 0;
};

// Opens a project's location to list or change what is in it: never created (a missing
// directory is NotFound, not an empty project), and an object store's prefix as a folder
// ("s3://b/x" lists "x/...", not "xy").
Result<std::unique_ptr<store::Store>> open_location(const Project& project,
                                                    const store::StoreOptions& options);

// Where a reconcile is: the project being listed (the index-th of `projects`, from 1) and
// what its listing has found so far.
struct ReconcileProgress {
  std::string_view project;
  size_t index = 0, projects = 0;
  int64_t objects = 0, bytes = 0;
};

struct ReconcileOptions {
  bool dry_run = false;  // report what would change; change nothing
  // Called as each project's listing starts and after each page of it, on the caller's
  // thread.
  std::function<void(const ReconcileProgress&)> on_progress;
};

// `store_options` opens each location (credentials and endpoint for s3://).
Result<ReconcileReport> reconcile(Ledger& ledger, const store::StoreOptions& store_options,
                                  const ReconcileOptions& options = {});

}  // namespace sluice::ledger
