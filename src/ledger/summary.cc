// The ledger's figures summed and judged for people: where an account stands, usage by a
// column, the trash by run (sluice/ledger/ledger.h).
#include <algorithm>
#include <map>
#include <utility>

#include "sluice/core/sizes.h"
#include "sluice/ledger/ledger.h"

namespace sluice::ledger {

std::string account_state(const Account& a, int64_t now_ns) {
  const Limits& l = a.limits;
  if ((l.hard_bytes && a.used_bytes >= *l.hard_bytes) ||
      (l.hard_objects && a.used_objects >= *l.hard_objects))
    return "at hard limit";
  if (!a.over_soft_since_ns) return "ok";
  const int64_t ends = *a.over_soft_since_ns + l.grace.count() * 1'000'000'000;
  return now_ns >= ends ? "over soft, grace over" : "over soft, grace until " + format_utc(ends);
}

namespace {
constexpr std::pair<UsageBy, std::string_view> kUsageBy[] = {{UsageBy::kTeam, "team"},
                                                             {UsageBy::kProject, "project"},
                                                             {UsageBy::kTier, "tier"},
                                                             {UsageBy::kKind, "kind"}};
}  // namespace

Result<UsageBy> parse_usage_by(std::string_view name) {
  for (auto [by, n] : kUsageBy)
    if (n == name) return by;
  return fail(
      Code::kInvalidArgument,
      "'" + std::string(name) + "' is not a usage grouping: expected team, project, tier or kind");
}

std::string_view usage_by_name(UsageBy by) {
  for (auto [b, n] : kUsageBy)
    if (b == by) return n;
  return "?";
}

std::vector<UsageTotal> usage_totals(const std::vector<Usage>& usage, UsageBy by) {
  std::map<std::string, UsageTotal> sums;
  for (const Usage& u : usage) {
    std::string group = by == UsageBy::kTeam      ? u.team
                        : by == UsageBy::kProject ? u.project
                        : by == UsageBy::kTier    ? std::string(tier_name(u.tier))
                                                  : std::string(kind_name(u.kind));
    UsageTotal& t = sums[group];
    t.group = std::move(group);
    t.bytes += u.bytes;
    t.objects += u.objects;
    t.updated_ns = std::max(t.updated_ns, u.updated_ns);
  }
  std::vector<UsageTotal> out;
  for (auto& [_, t] : sums) out.push_back(std::move(t));
  return out;
}

std::vector<TrashRun> trash_runs(const std::vector<TrashEntry>& entries) {
  std::map<std::pair<std::string, std::string>, TrashRun> runs;
  for (const TrashEntry& e : entries) {
    TrashRun& r = runs[{e.run, e.project}];
    r.run = e.run;
    r.project = e.project;
    ++r.objects;
    r.bytes += e.bytes;
    r.trashed_ns = e.trashed_ns;
    r.purge_after_ns = e.purge_after_ns;
  }
  std::vector<TrashRun> out;
  for (auto& [_, r] : runs) out.push_back(std::move(r));
  return out;
}

}  // namespace sluice::ledger
