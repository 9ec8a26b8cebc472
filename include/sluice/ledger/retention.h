// sluice/ledger/retention.h: which data retention rules say may go, and why.
//
// A rule belongs to a project, and either to one checkpoint series in it (`series`) or to
// the project's other objects (`series` empty). Rules say what to KEEP, and everything a
// rule covers that no keep clause holds goes (the model of restic's `forget`):
//   keep_last N     the newest N complete units
//   keep_every K    checkpoint steps divisible by K
//   max_age D       units created within D
//   max_idle D      units read within D (last access; where a store cannot tell, creation)
// Whatever the rules say, these are never removed: data under a pinned prefix, and the
// newest complete checkpoint of every series. A checkpoint step without its manifest (a
// save that never committed) goes once it is older than `incomplete_grace`, whatever
// the keep clauses say, and never sooner: it may be a save in progress.
//
// A unit is what lives and dies together: a checkpoint step (every key under
// "<series>/step-N/"), or one object.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::ledger {

struct RetentionRule {
  std::string project;
  std::string series;  // a checkpoint series, or empty: the project's other objects
  std::optional<uint64_t> keep_last, keep_every;
  std::optional<std::chrono::seconds> max_age, max_idle;
  bool empty() const { return !keep_last && !keep_every && !max_age && !max_idle; }
};

// A change to a rule, field by field: nullopt keeps the field, a value sets it, and an
// empty inner optional (`patch.max_age = std::optional<std::chrono::seconds>{}`) clears it.
struct RulePatch {
  template <typename T>
  using Field = std::optional<std::optional<T>>;
  std::string project;
  std::string series;
  Field<uint64_t> keep_last, keep_every;
  Field<std::chrono::seconds> max_age, max_idle;
  bool empty() const { return !keep_last && !keep_every && !max_age && !max_idle; }
};

struct RetentionUnit {
  std::string name;              // the step prefix, or the object's key
  std::optional<uint64_t> step;  // for a checkpoint step
  bool complete = true;          // false: a step without its manifest
  int64_t created_ns = 0, accessed_ns = 0;
  int64_t bytes = 0;
  std::vector<std::string> keys;  // a step's manifest first
};

struct RetentionDecision {
  size_t unit = 0;  // index into the units given
  bool remove = false;
  std::string reason;  // why it goes, or why it stays
};

// Decides every unit under one rule. `pinned` are key prefixes never removed.
std::vector<RetentionDecision> apply_retention(const RetentionRule& rule,
                                               const std::vector<RetentionUnit>& units,
                                               const std::vector<std::string>& pinned,
                                               int64_t now_ns,
                                               std::chrono::seconds incomplete_grace);

}  // namespace sluice::ledger
