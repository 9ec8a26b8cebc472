// Retention: the keep clauses, the pins and the newest checkpoint (retention.h).
#include "sluice/ledger/retention.h"

#include <algorithm>

namespace sluice::ledger {

namespace {

std::string days(std::chrono::seconds s) {
  int64_t n = s.count();
  if (n % 86400 == 0) return std::to_string(n / 86400) + "d";
  if (n % 3600 == 0) return std::to_string(n / 3600) + "h";
  return std::to_string(n) + "s";
}

}  // namespace

std::vector<RetentionDecision> apply_retention(const RetentionRule& rule,
                                               const std::vector<RetentionUnit>& units,
                                               const std::vector<std::string>& pinned, int64_t now,
                                               std::chrono::seconds grace) {
  std::vector<RetentionDecision> out(units.size());
  // Complete units, newest first: by step for checkpoints, else by creation time.
  std::vector<size_t> order;
  for (size_t i = 0; i < units.size(); ++i) {
    out[i].unit = i;
    if (units[i].complete) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const RetentionUnit &x = units[a], &y = units[b];
    if (x.step && y.step && *x.step != *y.step) return *x.step > *y.step;
    if (x.created_ns != y.created_ns) return x.created_ns > y.created_ns;
    return x.name > y.name;
  });
  std::vector<size_t> rank(units.size(), SIZE_MAX);
  for (size_t r = 0; r < order.size(); ++r) rank[order[r]] = r;

  for (size_t i = 0; i < units.size(); ++i) {
    const RetentionUnit& u = units[i];
    RetentionDecision& d = out[i];
    auto is_pinned = std::any_of(pinned.begin(), pinned.end(), [&](const std::string& p) {
      return u.name.starts_with(p) ||
             std::any_of(u.keys.begin(), u.keys.end(),
                         [&](const std::string& k) { return k.starts_with(p); });
    });
    if (is_pinned) {
      d.reason = "pinned";
      continue;
    }
    const int64_t age_ns = now - u.created_ns;
    if (!u.complete) {
      if (age_ns > grace.count() * 1'000'000'000) {
        d.remove = true;
        d.reason = "incomplete (no manifest) for more than " + days(grace);
      } else {
        d.reason = "incomplete, but may be a save in progress (younger than " + days(grace) + ")";
      }
      continue;
    }
    if (u.step && rank[i] == 0) {
      d.reason = "the newest complete checkpoint";
      continue;
    }
    if (rule.empty()) {
      d.reason = "no rule";
      continue;
    }
    std::vector<std::string> kept;
    if (rule.keep_last && rank[i] < *rule.keep_last)
      kept.push_back("among the newest " + std::to_string(*rule.keep_last));
    if (rule.keep_every && *rule.keep_every > 0 && u.step && *u.step % *rule.keep_every == 0)
      kept.push_back("step a multiple of " + std::to_string(*rule.keep_every));
    if (rule.max_age && age_ns <= rule.max_age->count() * 1'000'000'000)
      kept.push_back("younger than " + days(*rule.max_age));
    if (rule.max_idle && now - u.accessed_ns <= rule.max_idle->count() * 1'000'000'000)
      kept.push_back("read within " + days(*rule.max_idle));
    if (!kept.empty()) {
      d.reason = kept.front();
      for (size_t k = 1; k < kept.size(); ++k) d.reason += ", " + kept[k];
      continue;
    }
    d.remove = true;
    std::vector<std::string> why;
    if (rule.keep_last) why.push_back("not among the newest " + std::to_string(*rule.keep_last));
    if (rule.keep_every && u.step)
      why.push_back("not a multiple of " + std::to_string(*rule.keep_every));
    if (rule.max_age) why.push_back("older than " + days(*rule.max_age));
    if (rule.max_idle) why.push_back("not read for " + days(*rule.max_idle));
    d.reason = why.empty() ? "no keep clause holds" : why.front();
    for (size_t k = 1; k < why.size(); ++k) d.reason += ", " + why[k];
  }
  return out;
}

}  // namespace sluice::ledger
