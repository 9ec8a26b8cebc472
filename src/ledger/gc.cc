// The retention engine: plan, trash, purge, restore (see gc.h).
#include "sluice/ledger/gc.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "sluice/ckpt/live.h"
#include "sluice/ckpt/manifest.h"
#include "sluice/ledger/reconcile.h"
#include "sluice/xfer/copy.h"

namespace sluice::ledger {

namespace {

// Last access of a key of a file:// location (atime), else its last write.
int64_t accessed_ns(const Project& p, const store::ObjectInfo& o) {
  if (!p.location.starts_with("file://")) return o.mtime_ns;
  struct stat st;
  std::string path = p.location.substr(7) + "/" + o.key;
  if (::stat(path.c_str(), &st) != 0) return o.mtime_ns;
  return std::max<int64_t>(o.mtime_ns,
                           st.st_atim.tv_sec * int64_t{1'000'000'000} + st.st_atim.tv_nsec);
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

// The units of one project under its rules: the steps of each series with a rule, then
// (under the project's own rule) every other object.
Result<std::vector<GcUnit>> plan_project(const Project& p, const std::vector<RetentionRule>& rules,
                                         const std::vector<std::string>& pins, const GcOptions& o,
                                         int64_t now, std::vector<std::string>& skipped) {
  SLUICE_ASSIGN_OR_RETURN(auto st, open_location(p, o.stores));
  // A key that cannot be described (a symlink anyone who can write the project planted,
  // leading out of it) is left alone and reported; retention goes on for the rest.
  std::vector<store::ObjectInfo> listing;
  store::ListOptions lo;
  lo.skip_unreadable = true;
  do {
    SLUICE_ASSIGN_OR_RETURN(store::ListPage page, st->list(lo));
    for (auto& obj : page.objects) listing.push_back(std::move(obj));
    for (auto& s : page.skipped) skipped.push_back("project " + p.id + ": " + s.reason);
    lo.continuation = std::move(page.next_token);
  } while (!lo.continuation.empty());
  std::map<std::string, uint64_t> sizes;
  for (const auto& obj : listing) sizes[obj.key] = obj.size;
  std::vector<GcUnit> out;
  std::set<std::string> in_series;  // keys some series rule took
  for (const RetentionRule& r : rules) {
    if (r.series.empty()) continue;
    std::map<uint64_t, RetentionUnit> steps;
    std::set<uint64_t> held;  // steps a save under way holds (ckpt/live.h)
    // Markers that prove their save gone (ckpt/live.h: live_owner_gone), by step.
    std::map<uint64_t, std::vector<const store::ObjectInfo*>> gone;
    for (const auto& obj : listing) {
      uint64_t step = 0;
      std::string leaf;
      if (!ckpt::parse_step_key(r.series, obj.key, step, leaf)) continue;
      RetentionUnit& u = steps[step];
      u.step = step;
      u.name = ckpt::step_prefix(r.series, step);
      u.bytes += static_cast<int64_t>(obj.size);
      u.created_ns = std::max(u.created_ns, obj.mtime_ns);
      u.accessed_ns = std::max(u.accessed_ns, accessed_ns(p, obj));
      if (ckpt::is_live_leaf(leaf)) {
        const ckpt::LiveMarker v = ckpt::judge_live_marker(*st, obj, now);
        if (v.holds) held.insert(step);
        if (v.owner_gone) gone[step].push_back(&obj);
      }
      if (leaf == "manifest.json")
        u.keys.insert(u.keys.begin(), obj.key);  // manifest first
      else
        u.keys.push_back(obj.key);
      in_series.insert(obj.key);
    }
    std::vector<RetentionUnit> units;
    std::vector<RetentionUnit> left;  // what saves proven gone left, taken out of their steps
    for (auto& [step, u] : steps) {
      // A step a save is still writing or committing is not retention's to judge yet.
      if (held.contains(step)) continue;
      u.complete = !u.keys.empty() && u.keys.front() == ckpt::manifest_key(r.series, step) &&
                   ckpt::read_whole_step(*st, r.series, step, sizes, p.id).has_value();
      // In a step with no manifest, the shard and marker of a save whose marker proves its
      // process gone (ckpt/live.h: live_owner_gone) wait for no grace: as the
      // Checkpointer's own gc does, retention takes them now (to the trash, as ever).
      if (!u.keys.empty() && u.keys.front() != ckpt::manifest_key(r.series, step))
        for (const store::ObjectInfo* mk : gone[step]) {
          const std::string stem(ckpt::save_stem(mk->key));
          if (std::any_of(pins.begin(), pins.end(),
                          [&](const std::string& pin) { return stem.starts_with(pin); }))
            continue;
          RetentionUnit g{.name = stem, .step = step, .complete = false};
          for (const std::string& key : {stem + ".shard", mk->key}) {
            auto at = std::find(u.keys.begin(), u.keys.end(), key);
            if (at == u.keys.end()) continue;
            u.keys.erase(at);
            g.keys.push_back(key);
            g.bytes += static_cast<int64_t>(sizes[key]);
          }
          u.bytes -= g.bytes;
          g.created_ns = g.accessed_ns = u.created_ns;
          left.push_back(std::move(g));
        }
      if (!u.keys.empty()) units.push_back(std::move(u));
    }
    auto decisions = apply_retention(r, units, pins, now, o.grace);
    for (auto& g : left) {
      units.push_back(std::move(g));
      decisions.push_back({.unit = units.size() - 1,
                           .remove = true,
                           .reason = "left by a save whose process is gone (its live marker "
                                     "proves it): removed without waiting for the grace"});
    }
    for (auto& d : decisions) out.push_back({p.id, r.series, units[d.unit], d});
  }
  for (const RetentionRule& r : rules) {
    if (!r.series.empty()) continue;
    std::vector<RetentionUnit> units;
    for (const auto& obj : listing) {
      // Checkpoint steps go only by their series' rule (whole, never the newest); a
      // project rule never takes them apart key by key.
      if (in_series.contains(obj.key) || obj.key.starts_with(kTrashPrefix) ||
          !step_of(obj.key).empty())
        continue;
      units.push_back({.name = obj.key,
                       .complete = true,
                       .created_ns = obj.mtime_ns,
                       .accessed_ns = accessed_ns(p, obj),
                       .bytes = static_cast<int64_t>(obj.size),
                       .keys = {obj.key}});
    }
    auto decisions = apply_retention(r, units, pins, now, o.grace);
    for (auto& d : decisions) out.push_back({p.id, "", units[d.unit], d});
  }
  return out;
}

Result<GcPlan> plan_at(Ledger& l, const GcOptions& o, int64_t now) {
  SLUICE_ASSIGN_OR_RETURN(auto projects, l.projects());
  SLUICE_ASSIGN_OR_RETURN(auto rules, l.rules());
  SLUICE_ASSIGN_OR_RETURN(auto pins, l.pins());
  if (!o.project.empty() &&
      std::none_of(projects.begin(), projects.end(), [&](auto& p) { return p.id == o.project; }))
    return fail(Code::kNotFound, "unknown project '" + o.project + "'");
  GcPlan out;
  // The projects with a rule, each with its rules: what is planned, in order.
  std::vector<std::pair<const Project*, std::vector<RetentionRule>>> planned_projects;
  for (const Project& p : projects) {
    if (!o.project.empty() && p.id != o.project) continue;
    std::vector<RetentionRule> mine;
    for (auto& r : rules)
      if (r.project == p.id) mine.push_back(r);
    if (!mine.empty()) planned_projects.emplace_back(&p, std::move(mine));
  }
  GcProgress at{.phase = GcPhase::kPlanning, .total = planned_projects.size()};
  for (auto& [pp, mine] : planned_projects) {
    const Project& p = *pp;
    if (o.on_progress) o.on_progress(at);
    ++at.done;
    std::vector<std::string> pinned;
    for (auto& [proj, prefix] : pins)
      if (proj == p.id) pinned.push_back(prefix);
    auto planned = plan_project(p, mine, pinned, o, now, out.skipped);
    if (!planned) {
      out.errors.push_back(planned.error().to_string());
      continue;
    }
    for (auto& x : *planned) out.units.push_back(std::move(x));
  }
  if (o.on_progress) o.on_progress(at);  // done == total
  return out;
}

std::string new_run_id(int64_t now_ns) {
  std::time_t secs = static_cast<std::time_t>(now_ns / 1'000'000'000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;
  char tail[8];
  std::snprintf(tail, sizeof tail, "-%04x", rd() & 0xffff);
  return std::string(when) + tail;
}

// Copies `from` to `to` in one store, never over an existing key.
Status copy_within(store::Store& st, const std::string& from, const std::string& to) {
  xfer::CopyOptions co;
  co.overwrite = false;
  co.keep_mtime = true;  // retention orders objects by it: a restore must not make one new
  SLUICE_RETURN_IF_ERROR(xfer::copy(st, from, st, to, co));
  return {};
}

// The projects' stores, opened once. Moves to and from the trash go straight to the store,
// uncharged: they neither add nor free room (the trash stays charged to the project until
// it is purged, and the purge uncharges it through the ledger).
class ProjectStores {
 public:
  ProjectStores(std::vector<Project> projects, const store::StoreOptions& options)
      : projects_(std::move(projects)), options_(options) {}
  const Project* project(const std::string& id) const {
    for (const Project& p : projects_)
      if (p.id == id) return &p;
    return nullptr;
  }
  Result<store::Store*> get(const std::string& id) {
    if (auto it = open_.find(id); it != open_.end()) return it->second.get();
    const Project* p = project(id);
    if (!p) return fail(Code::kNotFound, "unknown project '" + id + "'");
    SLUICE_ASSIGN_OR_RETURN(auto st, open_location(*p, options_));
    return (open_[id] = std::move(st)).get();
  }

 private:
  std::vector<Project> projects_;
  store::StoreOptions options_;
  std::map<std::string, std::unique_ptr<store::Store>> open_;
};

// Moves one unit to the trash: recorded first (so a crash leaves an entry to purge, never
// an unrecorded copy), copied, then the originals removed in order (a step's manifest
// first, so a half-removed step is no longer listed), stopping at the first failure.
Status trash_unit(Ledger& ledger, store::Store& st, const GcUnit& x, Kind kind,
                  const std::string& run, int64_t now, int64_t purge_after) {
  std::vector<TrashEntry> entries;
  for (const std::string& key : x.unit.keys) {
    auto info = st.stat(key);
    if (!info) return std::unexpected(info.error());
    entries.push_back({run, x.project, key, std::string(kTrashPrefix) + run + "/" + key,
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

// Purges what has waited out its delay (this run's too, with a delay of 0): removed, then
// uncharged as what it was charged as.
Status purge(Ledger& ledger, ProjectStores& stores, const GcOptions& o, GcRunReport& report) {
  SLUICE_ASSIGN_OR_RETURN(auto trash, ledger.trash());
  std::erase_if(trash, [&](const TrashEntry& e) {
    return e.purge_after_ns > ledger.now_ns() || (!o.project.empty() && e.project != o.project);
  });
  GcProgress at{.phase = GcPhase::kPurging, .total = trash.size()};
  for (const TrashEntry& e : trash) {
    if (o.on_progress) o.on_progress(at);
    ++at.done;
    auto st = stores.get(e.project);
    if (!st) {
      report.errors.push_back(st.error().to_string());
      continue;
    }
    auto r = (*st)->remove(e.trash_key);
    if (!r && r.error().code() != Code::kNotFound) {
      report.errors.push_back("purge " + e.trash_key + ": " + r.error().to_string());
      continue;
    }
    if (auto d = ledger.drop_trash(e.run, e.project, e.key); !d) {
      report.errors.push_back("purge " + e.trash_key + ": " + d.error().to_string());
      continue;
    }
    // Uncharged only when the original is gone: a copy that a killed run made while the
    // original stayed was never charged (moves are not), nor was one it never made.
    bool left = r && !(*st)->stat(e.key);
    if (left) {
      const Project* p = stores.project(e.project);
      if (auto c = ledger.charge({p->id, p->team, p->tier, e.kind}, -e.bytes, -1); !c)
        report.errors.push_back("uncharge " + e.trash_key + ": " + c.error().to_string() +
                                " (sluice usage reconcile recounts it)");
    }
    ++report.purged_objects;
    report.purged_bytes += e.bytes;
  }
  if (o.on_progress) o.on_progress(at);  // done == total
  return {};
}

}  // namespace

Result<GcPlan> plan_gc(Ledger& ledger, const GcOptions& options) {
  return plan_at(ledger, options, ledger.now_ns());
}

Result<GcRunReport> run_gc(Ledger& ledger, const GcOptions& o,
                           const std::function<void(const GcUnit&)>& on_trashed) {
  if (o.delay.count() < 0 || o.grace.count() < 0)
    return fail(Code::kInvalidArgument, "gc: a negative delay or grace");
  const int64_t now = ledger.now_ns();
  GcRunReport report;
  report.purge_after_ns = now + o.delay.count() * 1'000'000'000;
  SLUICE_ASSIGN_OR_RETURN(GcPlan plan, plan_at(ledger, o, now));
  report.errors = std::move(plan.errors);
  report.skipped = std::move(plan.skipped);
  SLUICE_ASSIGN_OR_RETURN(auto projects, ledger.projects());
  ProjectStores stores(std::move(projects), o.stores);
  report.run = new_run_id(now);
  GcProgress at{.phase = GcPhase::kTrashing};
  for (const GcUnit& x : plan.units)
    if (x.decision.remove) at.total += x.unit.bytes;
  for (const GcUnit& x : plan.units) {
    if (!x.decision.remove) continue;
    if (o.on_progress) o.on_progress(at);
    at.done += x.unit.bytes;
    auto st = stores.get(x.project);
    if (!st) {
      report.errors.push_back(st.error().to_string());
      continue;
    }
    Kind kind = x.series.empty() ? stores.project(x.project)->kind : Kind::kCheckpoint;
    if (auto s = trash_unit(ledger, **st, x, kind, report.run, now, report.purge_after_ns); !s) {
      report.errors.push_back("project '" + x.project + "' " + x.unit.name + ": " +
                              s.error().to_string());
      continue;
    }
    ++report.trashed_units;
    report.trashed_bytes += x.unit.bytes;
    if (on_trashed) on_trashed(x);
  }
  if (o.on_progress) o.on_progress(at);  // done == total
  if (Status s = purge(ledger, stores, o, report); !s)
    report.errors.push_back("purge: " + s.error().to_string());
  return report;
}

Result<GcRestoreReport> restore_gc(Ledger& ledger, std::string_view run, const GcOptions& o) {
  if (run.empty())
    return fail(Code::kInvalidArgument,
                "gc restore: the run is empty (sluice gc trash lists them)");
  SLUICE_ASSIGN_OR_RETURN(auto entries, ledger.trash(run));
  if (entries.empty())
    return fail(Code::kNotFound,
                "no gc run '" + std::string(run) + "' in the trash (sluice gc trash lists them)");
  SLUICE_ASSIGN_OR_RETURN(auto projects, ledger.projects());
  ProjectStores stores(std::move(projects), o.stores);
  // Manifests last, and only for steps whose every other key came back: a step is listed
  // again only whole.
  std::stable_sort(entries.begin(), entries.end(), [](const TrashEntry& x, const TrashEntry& y) {
    return !x.key.ends_with("/manifest.json") && y.key.ends_with("/manifest.json");
  });
  GcRestoreReport report;
  report.objects = static_cast<int64_t>(entries.size());
  std::set<std::string> broken_steps, recreated;
  for (const TrashEntry& e : entries) {
    // Per project: a run may hold the same series and step from two projects.
    std::string step = step_of(e.key);
    if (!step.empty()) step = e.project + "\n" + step;
    if (e.key.ends_with("/manifest.json") && broken_steps.contains(step)) {
      report.errors.push_back(e.key +
                              ": left in the trash, since a shard of its step did not come back");
      continue;
    }
    auto st = stores.get(e.project);
    if (!st) {
      report.errors.push_back(e.key + ": " + st.error().to_string());
      continue;
    }
    // A step saved again since it was trashed is a different checkpoint: none of the old
    // one's keys go back into it.
    if (!step.empty() && !recreated.contains(step) && !e.key.ends_with("/manifest.json")) {
      const std::string manifest = step_of(e.key) + "manifest.json";
      bool trashed_with_manifest = std::any_of(
          entries.begin(), entries.end(),
          [&](const TrashEntry& x) { return x.project == e.project && x.key == manifest; });
      if (trashed_with_manifest && (*st)->stat(manifest)) recreated.insert(step);
    }
    if (!step.empty() && recreated.contains(step)) {
      report.errors.push_back(e.key + ": left in the trash: step " + step_of(e.key) +
                              " is there again (saved since, or never left)");
      continue;
    }
    // A run killed while copying left an entry whose original never left: nothing to do.
    if (!(*st)->stat(e.trash_key) && (*st)->stat(e.key)) {
      (void)ledger.drop_trash(e.run, e.project, e.key);
      ++report.restored;
      continue;
    }
    Status s = copy_within(**st, e.trash_key, e.key);
    if (s) s = (*st)->remove(e.trash_key);
    if (s) s = ledger.drop_trash(e.run, e.project, e.key);
    if (!s) {
      if (!step.empty()) broken_steps.insert(step);
      report.errors.push_back(e.key + ": " + s.error().to_string());
      continue;
    }
    ++report.restored;
  }
  return report;
}

void to_json(nlohmann::json& j, const GcUnit& x) {
  using nlohmann::json;
  j = json{
      {"project", x.project},        {"series", x.series.empty() ? json(nullptr) : json(x.series)},
      {"unit", x.unit.name},         {"step", x.unit.step ? json(*x.unit.step) : json(nullptr)},
      {"bytes", x.unit.bytes},       {"objects", x.unit.keys.size()},
      {"remove", x.decision.remove}, {"reason", x.decision.reason}};
}

void to_json(nlohmann::json& j, const GcRunReport& r) {
  j = nlohmann::json{{"run", r.run},
                     {"trashed_units", r.trashed_units},
                     {"trashed_bytes", r.trashed_bytes},
                     {"purge_after_ns", r.purge_after_ns},
                     {"purged_objects", r.purged_objects},
                     {"purged_bytes", r.purged_bytes},
                     {"errors", r.errors},
                     {"skipped", r.skipped}};
}

}  // namespace sluice::ledger
