// sluice/ledger/json.h: the ledger's records as JSON, one shape for each wherever it is
// shown (`sluice ... --json`, a binding, the page). Times are nanoseconds since the Unix
// epoch (`*_ns`), durations seconds (`*_s`), tiers and kinds their names; a limit or
// figure not set is null. Each is nlohmann's to_json, so `nlohmann::json j = project;`.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "sluice/ledger/forecast.h"
#include "sluice/ledger/ledger.h"
#include "sluice/ledger/reconcile.h"
#include "sluice/ledger/retention.h"

namespace sluice::ledger {

// An account with its state at `now_ns` (account_state).
nlohmann::json account_json(const Account& account, int64_t now_ns);

void to_json(nlohmann::json& j, const Project& p);
void to_json(nlohmann::json& j, const TierTotal& t);
void to_json(nlohmann::json& j, const ForecastRow& r);  // with the history it came from
void to_json(nlohmann::json& j, const ReconcileEntry& e);
void to_json(nlohmann::json& j, const RetentionRule& r);
void to_json(nlohmann::json& j, const TrashRun& r);

}  // namespace sluice::ledger
