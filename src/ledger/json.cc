// The ledger's records as JSON (sluice/ledger/json.h).
#include "sluice/ledger/json.h"

#include <nlohmann/json.hpp>

namespace sluice::ledger {

using nlohmann::json;

namespace {
template <typename T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
json seconds_or_null(const std::optional<std::chrono::seconds>& d) {
  return d ? json(d->count()) : json(nullptr);
}
}  // namespace

json account_json(const Account& a, int64_t now_ns) {
  return json{{"team", a.team},
              {"tier", tier_name(a.tier)},
              {"used_bytes", a.used_bytes},
              {"used_objects", a.used_objects},
              {"reserved_bytes", a.reserved_bytes},
              {"reserved_objects", a.reserved_objects},
              {"soft_bytes", or_null(a.limits.soft_bytes)},
              {"hard_bytes", or_null(a.limits.hard_bytes)},
              {"soft_objects", or_null(a.limits.soft_objects)},
              {"hard_objects", or_null(a.limits.hard_objects)},
              {"grace_s", a.limits.grace.count()},
              {"over_soft_since_ns", or_null(a.over_soft_since_ns)},
              {"state", account_state(a, now_ns)},
              {"updated_ns", a.updated_ns}};
}

void to_json(json& j, const Project& p) {
  j = json{{"id", p.id},
           {"team", p.team},
           {"location", p.location},
           {"tier", tier_name(p.tier)},
           {"kind", kind_name(p.kind)},
           {"created_ns", p.created_ns}};
}

void to_json(json& j, const TierTotal& t) {
  j = json{{"tier", tier_name(t.tier)},
           {"used_bytes", t.used_bytes},
           {"used_objects", t.used_objects},
           {"reserved_bytes", t.reserved_bytes},
           {"capacity_bytes", or_null(t.capacity_bytes)},
           {"capacity_objects", or_null(t.capacity_objects)}};
}

void to_json(json& j, const ForecastRow& r) {
  const Forecast& f = r.forecast;
  json history = json::array();
  for (const HistoryPoint& p : r.points) history.push_back({p.t_ns, p.bytes});
  json line = nullptr;
  if (f.line)
    line = {{"rate_per_day", f.linear.rate_per_day},
            {"r2", f.line->r2},
            {"points", f.line->points},
            {"from_ns", f.line->from_ns},
            {"to_ns", f.line->to_ns},
            {"trusted", f.linear_trusted},
            {"hits_at_ns", or_null(f.linear.hits_at_ns)}};
  j = json{
      {"team", r.team.empty() ? json(nullptr) : json(r.team)},
      {"tier", tier_name(r.tier)},
      {"metric", r.metric},
      {"limit", f.limit},
      {"limit_kind", r.limit_kind},
      {"now", f.now_value},
      {"linear", line},
      {"holt", {{"rate_per_day", f.holt.rate_per_day}, {"hits_at_ns", or_null(f.holt.hits_at_ns)}}},
      {"verdict", f.verdict},
      {"verdict_at_ns", or_null(f.verdict_at_ns)},
      {"history", history}};
}

void to_json(json& j, const ReconcileEntry& e) {
  j = json{{"project", e.project},
           {"team", e.team},
           {"location", e.location},
           {"tier", tier_name(e.tier)},
           {"ledger_bytes", e.ledger_bytes},
           {"ledger_objects", e.ledger_objects},
           {"found_bytes", e.found_bytes},
           {"found_objects", e.found_objects},
           {"changed", e.changed},
           {"error", e.error ? json(e.error->to_string()) : json(nullptr)}};
}

void to_json(json& j, const RetentionRule& r) {
  j = json{{"project", r.project},
           {"series", r.series},
           {"keep_last", or_null(r.keep_last)},
           {"keep_every", or_null(r.keep_every)},
           {"max_age_s", seconds_or_null(r.max_age)},
           {"max_idle_s", seconds_or_null(r.max_idle)}};
}

void to_json(json& j, const TrashRun& r) {
  j = json{{"run", r.run},     {"project", r.project},       {"objects", r.objects},
           {"bytes", r.bytes}, {"trashed_ns", r.trashed_ns}, {"purge_after_ns", r.purge_after_ns}};
}

}  // namespace sluice::ledger
