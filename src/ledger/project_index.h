// src/ledger/project_index.h: which project owns a location, from the ledger's project list
// kept in memory. A location no project owns loads the list again (at most every few
// seconds), so a project added meanwhile is found without asking the ledger on every write.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "sluice/core/thread_annotations.h"
#include "sluice/ledger/ledger.h"

namespace sluice::ledger {

class ProjectIndex {
 public:
  explicit ProjectIndex(std::shared_ptr<Ledger> ledger) : ledger_(std::move(ledger)) {}

  // Loads the projects now: a ledger that cannot be reached fails here.
  // A failed load counts as a load for the refresh interval: a ledger that is down is not
  // asked again for every location.
  Status load() {
    auto projects = ledger_->projects();
    MutexLock lock(mu_);
    loaded_ = std::chrono::steady_clock::now();
    if (!projects) {
      if (!known_) unknown_ = projects.error();
      return std::unexpected(projects.error());
    }
    projects_ = std::move(*projects);
    known_ = true;
    return {};
  }

  // The project owning `location` (the longest project location it lies under), or
  // nullopt when none does. Until one load has succeeded no location can be said to have
  // no owner: the error of the last load, until a load succeeds.
  Result<std::optional<Project>> owner(std::string_view location) {
    for (int pass = 0; pass < 2; ++pass) {
      {
        MutexLock lock(mu_);
        if (const Project* p = Ledger::owner_of(projects_, location)) return *p;
        if (!known_ && pass == 0 && std::chrono::steady_clock::now() - loaded_ < kRefresh)
          return std::unexpected(unknown_);
        if (pass == 1 || std::chrono::steady_clock::now() - loaded_ < kRefresh) break;
      }
      SLUICE_RETURN_IF_ERROR(load());  // a project added since
    }
    return std::optional<Project>{};
  }

  // Whether one load has succeeded.
  bool known() {
    MutexLock lock(mu_);
    return known_;
  }

  Ledger& ledger() { return *ledger_; }

 private:
  static constexpr auto kRefresh = std::chrono::seconds(5);
  std::shared_ptr<Ledger> ledger_;
  Mutex mu_;
  std::vector<Project> projects_ SLUICE_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point loaded_ SLUICE_GUARDED_BY(mu_){};
  bool known_ SLUICE_GUARDED_BY(mu_) = false;
  Error unknown_ SLUICE_GUARDED_BY(mu_){Code::kUnavailable,
                                        "the ledger's projects were never loaded"};
};

}  // namespace sluice::ledger
