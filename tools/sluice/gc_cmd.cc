// `sluice gc`: retention rules and pins per project or checkpoint series; `plan` says what
// would go and why, `run` moves it to a trash stage and deletes for good only after a
// delay, `restore` brings a run back. docs/ledger.md, "Retention and clean-up".
#include "gc_cmd.h"

#include <sys/stat.h>

#include <charconv>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "aws_config.h"
#include "common.h"
#include "ledger_cmd.h"
#include "sizes.h"
#include "sluice/ckpt/manifest.h"
#include "sluice/ledger/reconcile.h"
#include "sluice/ledger/retention.h"
#include "sluice/xfer/copy.h"

namespace sluice::cli {

namespace {

using nlohmann::json;
using namespace sluice::ledger;

constexpr std::string_view kTrash = ".sluice-trash/";

struct GcArgs {
  std::string ledger, project, series, prefix, run;
  std::string keep_last, keep_every, max_age, max_idle;
  std::string delay = "24h", grace = "24h";
  AwsFlags aws;
  bool json = false;
};

// One unit with what the rule decided.
struct Planned {
  std::string project, series;
  RetentionUnit unit;
  RetentionDecision decision;
};

Result<std::optional<uint64_t>> count_flag(const std::string& flag, const std::string& text) {
  if (text.empty()) return std::optional<uint64_t>{};
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size())
    return fail(Code::kInvalidArgument, flag + " '" + text + "': expected a whole number");
  return std::optional<uint64_t>(v);
}

Result<std::optional<std::chrono::seconds>> opt_duration(const std::string& flag,
                                                         const std::string& text) {
  if (text.empty()) return std::optional<std::chrono::seconds>{};
  SLUICE_ASSIGN_OR_RETURN(auto d, duration_flag(flag, text));
  return std::optional<std::chrono::seconds>(d);
}

// Last access of a key of a file:// location (atime), else its last write.
int64_t accessed_ns(const Project& p, const store::ObjectInfo& o) {
  if (!p.location.starts_with("file://")) return o.mtime_ns;
  struct stat st;
  std::string path = p.location.substr(7) + "/" + o.key;
  if (::stat(path.c_str(), &st) != 0) return o.mtime_ns;
  return std::max<int64_t>(o.mtime_ns,
                           st.st_atim.tv_sec * int64_t{1'000'000'000} + st.st_atim.tv_nsec);
}

Result<std::unique_ptr<store::Store>> open_project(const Project& p, const AwsFlags& aws) {
  SLUICE_ASSIGN_OR_RETURN(store::StoreOptions so, s3_store_options(aws));
  return open_location(p, so);  // never created; an object store's prefix as a folder
}

// The step folder of a checkpoint key ("s/step-000000001000/"), or empty.
std::string step_of(const std::string& key) {
  size_t slash = key.find('/');
  if (slash == std::string::npos) return {};
  uint64_t step = 0;
  std::string leaf;
  if (!ckpt::parse_step_key(key.substr(0, slash), key, step, leaf)) return {};
  return ckpt::step_prefix(key.substr(0, slash), step);
}

// Whether a step's manifest decodes and every shard it names is there at its size: only
// such a step counts as complete (and the newest of them is never removed). A step with a
// torn manifest or a lost shard is handled like an unfinished save.
bool intact(store::Store& st, const std::string& series, uint64_t step,
            const std::map<std::string, uint64_t>& sizes) {
  auto text = st.get(ckpt::manifest_key(series, step));
  if (!text) return false;
  std::string_view view(reinterpret_cast<const char*>(text->data()), text->size());
  auto m = ckpt::decode_manifest(view, ckpt::manifest_key(series, step));
  if (!m || m->step != step) return false;
  for (const auto& shard : m->shards) {
    auto it = sizes.find(ckpt::shard_key(series, step, shard.rank, shard.save_id));
    if (it == sizes.end() || it->second != shard.bytes) return false;
  }
  return true;
}

// The units of one project under its rules: the steps of each series with a rule, then
// (under the project's own rule) every other object.
Result<std::vector<Planned>> plan_project(const Project& p, const std::vector<RetentionRule>& rules,
                                          const std::vector<std::string>& pins, const GcArgs& a,
                                          int64_t now, std::chrono::seconds grace) {
  SLUICE_ASSIGN_OR_RETURN(auto st, open_project(p, a.aws));
  SLUICE_ASSIGN_OR_RETURN(auto listing, st->list_all(""));
  std::map<std::string, uint64_t> sizes;
  for (const auto& o : listing) sizes[o.key] = o.size;
  std::vector<Planned> out;
  std::set<std::string> in_series;  // keys some series rule took
  for (const RetentionRule& r : rules) {
    if (r.series.empty()) continue;
    std::map<uint64_t, RetentionUnit> steps;
    for (const auto& o : listing) {
      uint64_t step = 0;
      std::string leaf;
      if (!ckpt::parse_step_key(r.series, o.key, step, leaf)) continue;
      RetentionUnit& u = steps[step];
      u.step = step;
      u.name = ckpt::step_prefix(r.series, step);
      u.bytes += static_cast<int64_t>(o.size);
      u.created_ns = std::max(u.created_ns, o.mtime_ns);
      u.accessed_ns = std::max(u.accessed_ns, accessed_ns(p, o));
      if (leaf == "manifest.json")
        u.keys.insert(u.keys.begin(), o.key);  // manifest first
      else
        u.keys.push_back(o.key);
      in_series.insert(o.key);
    }
    std::vector<RetentionUnit> units;
    for (auto& [step, u] : steps) {
      u.complete = !u.keys.empty() && u.keys.front() == ckpt::manifest_key(r.series, step) &&
                   intact(*st, r.series, step, sizes);
      units.push_back(std::move(u));
    }
    auto decisions = apply_retention(r, units, pins, now, grace);
    for (auto& d : decisions) out.push_back({p.id, r.series, units[d.unit], d});
  }
  for (const RetentionRule& r : rules) {
    if (!r.series.empty()) continue;
    std::vector<RetentionUnit> units;
    for (const auto& o : listing) {
      // Checkpoint steps go only by their series' rule (whole, never the newest); a
      // project rule never takes them apart key by key.
      if (in_series.contains(o.key) || o.key.starts_with(kTrash) || !step_of(o.key).empty())
        continue;
      units.push_back({.name = o.key,
                       .complete = true,
                       .created_ns = o.mtime_ns,
                       .accessed_ns = accessed_ns(p, o),
                       .bytes = static_cast<int64_t>(o.size),
                       .keys = {o.key}});
    }
    auto decisions = apply_retention(r, units, pins, now, grace);
    for (auto& d : decisions) out.push_back({p.id, "", units[d.unit], d});
  }
  return out;
}

// Every project with a rule (or only --project), planned.
Result<std::vector<Planned>> plan_all(Ledger& l, const GcArgs& a, int64_t now,
                                      std::chrono::seconds grace,
                                      std::vector<std::string>& errors) {
  SLUICE_ASSIGN_OR_RETURN(auto projects, l.projects());
  SLUICE_ASSIGN_OR_RETURN(auto rules, l.rules());
  SLUICE_ASSIGN_OR_RETURN(auto pins, l.pins());
  if (!a.project.empty() &&
      std::none_of(projects.begin(), projects.end(), [&](auto& p) { return p.id == a.project; }))
    return fail(Code::kNotFound, "unknown project '" + a.project + "'");
  std::vector<Planned> out;
  for (const Project& p : projects) {
    if (!a.project.empty() && p.id != a.project) continue;
    std::vector<RetentionRule> mine;
    for (auto& r : rules)
      if (r.project == p.id) mine.push_back(r);
    if (mine.empty()) continue;
    std::vector<std::string> pinned;
    for (auto& [proj, prefix] : pins)
      if (proj == p.id) pinned.push_back(prefix);
    auto planned = plan_project(p, mine, pinned, a, now, grace);
    if (!planned) {
      errors.push_back(planned.error().to_string());
      continue;
    }
    for (auto& x : *planned) out.push_back(std::move(x));
  }
  return out;
}

std::string new_run_id(int64_t now) {
  std::random_device rd;
  char tail[8];
  std::snprintf(tail, sizeof tail, "-%04x", rd() & 0xffff);
  return format_utc(now, "%Y%m%dT%H%M%SZ") + tail;
}

std::string utc(int64_t ns) {
  return format_utc(ns, "%Y-%m-%d %H:%M:%SZ");
}

int print_plan(const std::vector<Planned>& plan, const std::vector<std::string>& errors,
               bool as_json, const char* verb) {
  int64_t bytes = 0, units = 0;
  json out = json::array();
  for (auto& x : plan) {
    if (x.decision.remove) {
      bytes += x.unit.bytes;
      ++units;
    }
    if (as_json) {
      out.push_back({{"project", x.project},
                     {"series", x.series.empty() ? json(nullptr) : json(x.series)},
                     {"unit", x.unit.name},
                     {"step", x.unit.step ? json(*x.unit.step) : json(nullptr)},
                     {"bytes", x.unit.bytes},
                     {"objects", x.unit.keys.size()},
                     {"remove", x.decision.remove},
                     {"reason", x.decision.reason}});
    } else {
      std::printf("%-6s %-16s %-12s %-48s %11s  %s\n", x.decision.remove ? verb : "keep",
                  x.project.c_str(), x.series.empty() ? "-" : x.series.c_str(), x.unit.name.c_str(),
                  format_size(static_cast<double>(x.unit.bytes)).c_str(),
                  x.decision.reason.c_str());
    }
  }
  if (as_json) {
    std::printf("%s\n", json{{"units", out}, {"errors", errors}}.dump().c_str());
  } else {
    std::printf("%lld unit(s), %s to the trash\n", static_cast<long long>(units),
                format_size(static_cast<double>(bytes)).c_str());
  }
  for (auto& e : errors) std::fprintf(stderr, "sluice: error: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}

int run_plan(const GcArgs& a, const std::string& home) {
  auto grace = duration_flag("--grace", a.grace);
  if (!grace) return report_error(grace.error());
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  std::vector<std::string> errors;
  auto plan = plan_all(**l, a, (*l)->now_ns(), *grace, errors);
  if (!plan) return report_error(plan.error());
  if (plan->empty() && errors.empty() && !a.json) {
    std::printf("nothing to do: no retention rule (sluice gc rule set)\n");
    return 0;
  }
  return print_plan(*plan, errors, a.json, "trash");
}

// Copies `from` to `to` in one store, never over an existing key.
Status copy_within(store::Store& st, const std::string& from, const std::string& to) {
  xfer::CopyOptions co;
  co.overwrite = false;
  SLUICE_RETURN_IF_ERROR(xfer::copy(st, from, st, to, co));
  return {};
}

// The projects' stores, opened once. Moves to and from the trash go straight to the store,
// uncharged: they neither add nor free room (the trash stays charged to the project until
// it is purged, and the purge uncharges it through the ledger).
class ProjectStores {
 public:
  ProjectStores(std::vector<Project> projects, const AwsFlags& aws)
      : projects_(std::move(projects)), aws_(aws) {}
  const Project* project(const std::string& id) const {
    for (const Project& p : projects_)
      if (p.id == id) return &p;
    return nullptr;
  }
  Result<store::Store*> get(const std::string& id) {
    if (auto it = open_.find(id); it != open_.end()) return it->second.get();
    const Project* p = project(id);
    if (!p) return fail(Code::kNotFound, "unknown project '" + id + "'");
    SLUICE_ASSIGN_OR_RETURN(auto st, open_project(*p, aws_));
    return (open_[id] = std::move(st)).get();
  }

 private:
  std::vector<Project> projects_;
  AwsFlags aws_;
  std::map<std::string, std::unique_ptr<store::Store>> open_;
};

// Moves one unit to the trash: recorded first (so a crash leaves an entry to purge, never
// an unrecorded copy), copied, then the originals removed in order (a step's manifest
// first, so a half-removed step is no longer listed), stopping at the first failure.
Status trash_unit(Ledger& ledger, store::Store& st, const Planned& x, Kind kind,
                  const std::string& run, int64_t now, int64_t purge_after) {
  std::vector<TrashEntry> entries;
  for (const std::string& key : x.unit.keys) {
    auto info = st.stat(key);
    if (!info) return std::unexpected(info.error());
    entries.push_back({run, x.project, key, std::string(kTrash) + run + "/" + key,
                       x.decision.reason, static_cast<int64_t>(info->size), now, purge_after,
                       kind});
  }
  SLUICE_RETURN_IF_ERROR(ledger.add_trash(entries));
  for (const TrashEntry& e : entries) {
    if (auto c = copy_within(st, e.key, e.trash_key); !c) {
      for (const TrashEntry& undo : entries) {  // nothing half-moved
        (void)st.remove(undo.trash_key);
        (void)ledger.drop_trash(undo.run, undo.project, undo.key);
      }
      return c;
    }
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    auto r = st.remove(entries[i].key);
    if (r || r.error().code() == Code::kNotFound) continue;
    // What could not be removed stays where it was and leaves the trash again: the trash
    // holds only what really left (a step already without its manifest stays unlisted).
    for (size_t j = i; j < entries.size(); ++j) {
      (void)st.remove(entries[j].trash_key);
      (void)ledger.drop_trash(entries[j].run, entries[j].project, entries[j].key);
    }
    return std::unexpected(r.error().with_context("removing " + entries[i].key));
  }
  return {};
}

int run_run(const GcArgs& a, const std::string& home) {
  // Every flag is checked before anything moves or is purged.
  auto delay = duration_flag("--delay", a.delay);
  if (!delay) return report_error(delay.error());
  auto grace = duration_flag("--grace", a.grace);
  if (!grace) return report_error(grace.error());
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  Ledger& ledger = **l;
  const int64_t now = ledger.now_ns();
  const int64_t purge_after = now + delay->count() * 1'000'000'000;
  std::vector<std::string> errors;
  auto plan = plan_all(ledger, a, now, *grace, errors);
  if (!plan) return report_error(plan.error());
  auto projects = ledger.projects();
  if (!projects) return report_error(projects.error());
  ProjectStores stores(*projects, a.aws);

  const std::string run = new_run_id(now);
  int64_t moved_units = 0, moved_bytes = 0;
  for (const Planned& x : *plan) {
    if (!x.decision.remove) continue;
    auto st = stores.get(x.project);
    if (!st) {
      errors.push_back(st.error().to_string());
      continue;
    }
    Kind kind = x.series.empty() ? stores.project(x.project)->kind : Kind::kCheckpoint;
    if (auto s = trash_unit(ledger, **st, x, kind, run, now, purge_after); !s) {
      errors.push_back("project '" + x.project + "' " + x.unit.name + ": " + s.error().to_string());
      continue;
    }
    ++moved_units;
    moved_bytes += x.unit.bytes;
    if (!a.json)
      std::printf("trashed %-16s %s (%s): %s\n", x.project.c_str(), x.unit.name.c_str(),
                  format_size(static_cast<double>(x.unit.bytes)).c_str(),
                  x.decision.reason.c_str());
  }

  // Purge what has waited out its delay (this run's too, with --delay 0): removed, then
  // uncharged as what it was charged as.
  int64_t purged = 0, purged_bytes = 0;
  auto trash = ledger.trash();
  if (!trash) return report_error(trash.error());
  for (const TrashEntry& e : *trash) {
    if (e.purge_after_ns > ledger.now_ns()) continue;
    if (!a.project.empty() && e.project != a.project) continue;
    auto st = stores.get(e.project);
    if (!st) {
      errors.push_back(st.error().to_string());
      continue;
    }
    auto r = (*st)->remove(e.trash_key);
    if (!r && r.error().code() != Code::kNotFound) {
      errors.push_back("purge " + e.trash_key + ": " + r.error().to_string());
      continue;
    }
    if (auto d = ledger.drop_trash(e.run, e.project, e.key); !d) {
      errors.push_back("purge " + e.trash_key + ": " + d.error().to_string());
      continue;
    }
    // Uncharged only when the original is gone: a copy that a killed run made while the
    // original stayed was never charged (moves are not), nor was one it never made.
    bool left = r && !(*st)->stat(e.key);
    if (left) {
      const Project* p = stores.project(e.project);
      if (auto c = ledger.charge({p->id, p->team, p->tier, e.kind}, -e.bytes, -1); !c)
        errors.push_back("uncharge " + e.trash_key + ": " + c.error().to_string() +
                         " (sluice usage reconcile recounts it)");
    }
    ++purged;
    purged_bytes += e.bytes;
  }
  if (a.json) {
    std::printf("%s\n", json{{"run", run},
                             {"trashed_units", moved_units},
                             {"trashed_bytes", moved_bytes},
                             {"purge_after_ns", purge_after},
                             {"purged_objects", purged},
                             {"purged_bytes", purged_bytes},
                             {"errors", errors}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "run %s: %lld unit(s), %s moved to the trash (deleted for good after %s; "
        "sluice gc restore %s brings them back); purged %lld object(s), %s\n",
        run.c_str(), static_cast<long long>(moved_units),
        format_size(static_cast<double>(moved_bytes)).c_str(), utc(purge_after).c_str(),
        run.c_str(), static_cast<long long>(purged),
        format_size(static_cast<double>(purged_bytes)).c_str());
  }
  for (auto& e : errors) std::fprintf(stderr, "sluice: error: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}

int run_restore(const GcArgs& a, const std::string& home) {
  if (a.run.empty())
    return report_error(
        Error(Code::kInvalidArgument, "gc restore: RUN is empty (sluice gc trash lists the runs)"));
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  Ledger& ledger = **l;
  auto entries = ledger.trash(a.run);
  if (!entries) return report_error(entries.error());
  if (entries->empty())
    return report_error(Error(
        Code::kNotFound, "no gc run '" + a.run + "' in the trash (sluice gc trash lists them)"));
  auto projects = ledger.projects();
  if (!projects) return report_error(projects.error());
  ProjectStores stores(*projects, a.aws);
  // Manifests last, and only for steps whose every other key came back: a step is listed
  // again only whole.
  std::stable_sort(entries->begin(), entries->end(), [](const TrashEntry& x, const TrashEntry& y) {
    return !x.key.ends_with("/manifest.json") && y.key.ends_with("/manifest.json");
  });
  std::vector<std::string> errors;
  std::set<std::string> broken_steps, recreated;
  int64_t restored = 0;
  for (const TrashEntry& e : *entries) {
    // Per project: a run may hold the same series and step from two projects.
    std::string step = step_of(e.key);
    if (!step.empty()) step = e.project + "\n" + step;
    if (e.key.ends_with("/manifest.json") && broken_steps.contains(step)) {
      errors.push_back(e.key + ": left in the trash, since a shard of its step did not come back");
      continue;
    }
    auto st = stores.get(e.project);
    if (!st) {
      errors.push_back(e.key + ": " + st.error().to_string());
      continue;
    }
    // A step saved again since it was trashed is a different checkpoint: none of the old
    // one's keys go back into it.
    if (!step.empty() && !recreated.contains(step) && !e.key.ends_with("/manifest.json")) {
      const std::string manifest = step_of(e.key) + "manifest.json";
      bool trashed_with_manifest = std::any_of(
          entries->begin(), entries->end(),
          [&](const TrashEntry& x) { return x.project == e.project && x.key == manifest; });
      if (trashed_with_manifest && (*st)->stat(manifest)) recreated.insert(step);
    }
    if (!step.empty() && recreated.contains(step)) {
      errors.push_back(e.key + ": left in the trash: step " + step_of(e.key) +
                       " is there again (saved since, or never left)");
      continue;
    }
    // A run killed while copying left an entry whose original never left: nothing to do.
    if (!(*st)->stat(e.trash_key) && (*st)->stat(e.key)) {
      (void)ledger.drop_trash(e.run, e.project, e.key);
      ++restored;
      continue;
    }
    Status s = copy_within(**st, e.trash_key, e.key);
    if (s) s = (*st)->remove(e.trash_key);
    if (s) s = ledger.drop_trash(e.run, e.project, e.key);
    if (!s) {
      if (!step.empty()) broken_steps.insert(step);
      errors.push_back(e.key + ": " + s.error().to_string());
      continue;
    }
    ++restored;
  }
  std::printf("restored %lld of %zu object(s) of run %s\n", static_cast<long long>(restored),
              entries->size(), a.run.c_str());
  for (auto& e : errors) std::fprintf(stderr, "sluice: error: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}

int run_trash(const GcArgs& a, const std::string& home) {
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto entries = (*l)->trash();
  if (!entries) return report_error(entries.error());
  struct Run {
    std::string project;
    int64_t objects = 0, bytes = 0, trashed = 0, purge = 0;
  };
  std::map<std::pair<std::string, std::string>, Run> runs;
  for (auto& e : *entries) {
    Run& r = runs[{e.run, e.project}];
    r.project = e.project;
    ++r.objects;
    r.bytes += e.bytes;
    r.trashed = e.trashed_ns;
    r.purge = e.purge_after_ns;
  }
  if (a.json) {
    json out = json::array();
    for (auto& [k, r] : runs)
      out.push_back({{"run", k.first},
                     {"project", r.project},
                     {"objects", r.objects},
                     {"bytes", r.bytes},
                     {"trashed_ns", r.trashed},
                     {"purge_after_ns", r.purge}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%-24s %-16s %8s %11s  %-21s %s\n", "RUN", "PROJECT", "OBJECTS", "BYTES", "TRASHED",
              "PURGED AFTER");
  for (auto& [k, r] : runs)
    std::printf("%-24s %-16s %8lld %11s  %-21s %s\n", k.first.c_str(), r.project.c_str(),
                static_cast<long long>(r.objects),
                format_size(static_cast<double>(r.bytes)).c_str(), utc(r.trashed).c_str(),
                utc(r.purge).c_str());
  return 0;
}

int run_rule_set(const GcArgs& a, const std::string& home) {
  RetentionRule r{.project = a.project, .series = a.series};
  auto kl = count_flag("--keep-last", a.keep_last);
  auto ke = count_flag("--keep-every", a.keep_every);
  auto ma = opt_duration("--max-age", a.max_age);
  auto mi = opt_duration("--max-idle", a.max_idle);
  if (!kl) return report_error(kl.error());
  if (!ke) return report_error(ke.error());
  if (!ma) return report_error(ma.error());
  if (!mi) return report_error(mi.error());
  r.keep_last = *kl;
  r.keep_every = *ke;
  r.max_age = *ma;
  r.max_idle = *mi;
  if (a.series.empty() && r.keep_every)
    return report_error(Error(Code::kInvalidArgument,
                              "--keep-every keeps checkpoint steps: give it with --series"));
  if (!a.series.empty()) {
    if (auto k = store::validate_key(a.series + "/x");
        !k || a.series.find('/') != std::string::npos)
      return report_error(
          Error(Code::kInvalidArgument, "--series '" + a.series + "' is not a series name"));
  }
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  if (auto s = (*l)->set_rule(r); !s) return report_error(s.error());
  std::printf(r.empty() ? "rule of %s%s%s removed\n" : "rule of %s%s%s set\n", a.project.c_str(),
              a.series.empty() ? "" : " series ", a.series.c_str());
  return 0;
}

int run_rule_ls(const GcArgs& a, const std::string& home) {
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto rules = (*l)->rules();
  if (!rules) return report_error(rules.error());
  auto pins = (*l)->pins();
  if (!pins) return report_error(pins.error());
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  auto dur = [](const std::optional<std::chrono::seconds>& d) {
    return d ? json(d->count()) : json(nullptr);
  };
  if (a.json) {
    json rs = json::array(), ps = json::array();
    for (auto& r : *rules)
      rs.push_back({{"project", r.project},
                    {"series", r.series},
                    {"keep_last", opt(r.keep_last)},
                    {"keep_every", opt(r.keep_every)},
                    {"max_age_s", dur(r.max_age)},
                    {"max_idle_s", dur(r.max_idle)}});
    for (auto& [p, prefix] : *pins) ps.push_back({{"project", p}, {"prefix", prefix}});
    std::printf("%s\n", json{{"rules", rs}, {"pins", ps}}.dump().c_str());
    return 0;
  }
  auto txt = [](const auto& v) { return v ? std::to_string(*v) : std::string("-"); };
  auto dtxt = [](const std::optional<std::chrono::seconds>& d) {
    return d ? std::to_string(d->count()) + "s" : std::string("-");
  };
  std::printf("%-16s %-12s %9s %10s %12s %12s\n", "PROJECT", "SERIES", "KEEP-LAST", "KEEP-EVERY",
              "MAX-AGE", "MAX-IDLE");
  for (auto& r : *rules)
    std::printf("%-16s %-12s %9s %10s %12s %12s\n", r.project.c_str(),
                r.series.empty() ? "-" : r.series.c_str(), txt(r.keep_last).c_str(),
                txt(r.keep_every).c_str(), dtxt(r.max_age).c_str(), dtxt(r.max_idle).c_str());
  for (auto& [p, prefix] : *pins) std::printf("pinned: %s %s\n", p.c_str(), prefix.c_str());
  return 0;
}

}  // namespace

void add_gc_commands(CLI::App& app, std::string home, int& rc) {
  auto args = std::make_shared<GcArgs>();
  GcArgs& a = *args;
  auto run = [args, home, &rc](int (*fn)(const GcArgs&, const std::string&)) {
    return [args, home, &rc, fn] { rc = fn(*args, home); };
  };
  auto ledger_flag = [&](CLI::App* c) {
    c->add_option("--ledger", a.ledger,
                  "The ledger (default: $SLUICE_LEDGER, else $SLUICE_HOME/ledger.db)");
  };
  auto aws = [&](CLI::App* c) {
    c->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// projects");
    c->add_option("--profile", a.aws.profile, "AWS profile");
    c->add_option("--region", a.aws.region, "Region");
  };
  auto* gc = app.add_subcommand(
      "gc",
      "Retention: rules per project or checkpoint series; plan, run (to a trash stage, "
      "deleted for good after a delay), restore");
  gc->require_subcommand(1);

  auto* rule = gc->add_subcommand("rule", "Retention rules");
  rule->require_subcommand(1);
  auto* rset = rule->add_subcommand(
      "set",
      "Set what a project (or one checkpoint series in it) keeps; everything else it "
      "covers may go. No keep flag: the rule is removed");
  rset->add_option("PROJECT", a.project, "Project ID")->required();
  rset->add_option("--series", a.series,
                   "A checkpoint series in the project (default: its other objects)");
  rset->add_option("--keep-last", a.keep_last, "Keep the newest N (checkpoints, or objects)")
      ->check(not_empty());
  rset->add_option("--keep-every", a.keep_every, "Keep checkpoint steps divisible by K")
      ->check(not_empty());
  rset->add_option("--max-age", a.max_age, "Keep what was created within this (30d, 12h)")
      ->check(not_empty());
  rset->add_option("--max-idle", a.max_idle,
                   "Keep what was read within this (file:// atime; elsewhere the last write)")
      ->check(not_empty());
  ledger_flag(rset);
  rset->callback(run(run_rule_set));
  auto* rls = rule->add_subcommand("ls", "List the rules and pins");
  rls->add_flag("--json", a.json, "Print JSON");
  ledger_flag(rls);
  rls->callback(run(run_rule_ls));

  auto* pin = gc->add_subcommand("pin", "Never remove keys of a project under a prefix");
  pin->add_option("PROJECT", a.project, "Project ID")->required();
  pin->add_option("PREFIX", a.prefix, "Key prefix, e.g. llama/step-000000001000/")->required();
  ledger_flag(pin);
  pin->callback(run([](const GcArgs& x, const std::string& h) {
    auto l = open_ledger_at(x.ledger, h);
    if (!l) return report_error(l.error());
    if (auto s = (*l)->pin(x.project, x.prefix); !s) return report_error(s.error());
    std::printf("pinned %s %s\n", x.project.c_str(), x.prefix.c_str());
    return 0;
  }));
  auto* unpin = gc->add_subcommand("unpin", "Remove a pin");
  unpin->add_option("PROJECT", a.project, "Project ID")->required();
  unpin->add_option("PREFIX", a.prefix, "The pinned prefix")->required();
  ledger_flag(unpin);
  unpin->callback(run([](const GcArgs& x, const std::string& h) {
    auto l = open_ledger_at(x.ledger, h);
    if (!l) return report_error(l.error());
    if (auto s = (*l)->unpin(x.project, x.prefix); !s) return report_error(s.error());
    std::printf("unpinned %s %s\n", x.project.c_str(), x.prefix.c_str());
    return 0;
  }));

  auto* plan =
      gc->add_subcommand("plan", "Print what the rules would remove and why; change nothing");
  plan->add_option("--project", a.project, "Only this project");
  plan->add_option("--grace", a.grace,
                   "An incomplete checkpoint step younger than this is left alone")
      ->default_val("24h")
      ->check(not_empty());
  plan->add_flag("--json", a.json, "Print JSON");
  ledger_flag(plan);
  aws(plan);
  plan->callback(run(run_plan));

  auto* grun = gc->add_subcommand(
      "run",
      "Move what the rules remove to the trash stage (.sluice-trash/RUN/ in the project), "
      "and delete for good what has been in the trash longer than its delay");
  grun->add_option("--project", a.project, "Only this project");
  grun->add_option("--delay", a.delay,
                   "How long trashed data waits before it is deleted (24h, 7d, 0)")
      ->default_val("24h")
      ->check(not_empty());
  grun->add_option("--grace", a.grace,
                   "An incomplete checkpoint step younger than this is left alone")
      ->default_val("24h")
      ->check(not_empty());
  grun->add_flag("--json", a.json, "Print JSON");
  ledger_flag(grun);
  aws(grun);
  grun->callback(run(run_run));

  auto* restore =
      gc->add_subcommand("restore", "Bring back everything a gc run moved to the trash");
  restore->add_option("RUN", a.run, "The run ID (sluice gc trash lists them)")->required();
  ledger_flag(restore);
  aws(restore);
  restore->callback(run(run_restore));

  auto* trash = gc->add_subcommand("trash", "List what is in the trash, per run and project");
  trash->add_flag("--json", a.json, "Print JSON");
  ledger_flag(trash);
  trash->callback(run(run_trash));
}

}  // namespace sluice::cli
