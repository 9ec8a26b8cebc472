// Retention and clean-up (gc) and sync of missing copies between tiers.
#include "ckpt/checkpointer_impl.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "sluice/ckpt/live.h"
#include "sluice/xfer/copy.h"

namespace sluice::ckpt {

namespace {

// Step directories left empty on a local tier (a save killed between creating the
// directory and publishing into it, or a step gc emptied), once older than the grace.
// Best effort: what cannot be removed is only an empty directory.
void remove_empty_step_dirs(const std::string& series_dir, std::string_view series,
                            const std::set<uint64_t>& active, std::chrono::seconds grace) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - grace;
  for (const auto& e : fs::directory_iterator(series_dir, ec)) {
    uint64_t step = 0;
    std::string leaf;
    const std::string key = std::string(series) + "/" + e.path().filename().string() + "/x";
    std::error_code ec2;
    if (!parse_step_key(series, key, step, leaf) || active.count(step) || !e.is_directory(ec2) ||
        e.is_symlink(ec2) || fs::last_write_time(e.path(), ec2) > cutoff || ec2)
      continue;
    fs::remove(e.path(), ec2);  // removes only an empty directory (ENOTEMPTY otherwise)
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Retention and clean-up.

Status CheckpointerImpl::gc_tier(size_t i, GcReport& report) {
  const Tier& tier = o_.tiers[i];
  SLUICE_ASSIGN_OR_RETURN(auto objs, tier.store->list_all(o_.series + "/step-"));
  struct StepObjects {
    bool has_manifest = false;
    bool committed = false;
    int64_t newest_ns = 0;
    std::vector<std::string> keys;
    std::vector<store::ObjectInfo> shards;
    std::vector<store::ObjectInfo> markers;  // of saves under way, or stale ones
    bool live = false;                       // a marker holds the step
    bool pinned = false;                     // a key of it lies under a pin
    // Saves (save_stem) whose marker proves them gone (live.h: live_owner_gone).
    std::set<std::string, std::less<>> gone;
    size_t records = 0;
  };
  std::map<uint64_t, StepObjects> steps;
  std::map<std::string, uint64_t> sizes;
  // Asked before anything is judged: without the pins (a ledger down), nothing goes.
  std::vector<std::string> pins;
  if (tier.retention.pinned) {
    auto p = tier.retention.pinned();
    if (!p)
      return std::unexpected(
          p.error().with_context("tier " + tier.name + ": the pins retention honours"));
    pins = std::move(*p);
  }
  for (const auto& obj : objs) {
    uint64_t step = 0;
    std::string leaf;
    if (!parse_step_key(o_.series, obj.key, step, leaf)) continue;
    StepObjects& s = steps[step];
    if (leaf == "manifest.json") s.has_manifest = true;
    if (leaf.ends_with(".shard")) s.shards.push_back(obj);
    if (leaf.ends_with(".json") && leaf != "manifest.json") ++s.records;
    if (is_live_leaf(leaf)) s.markers.push_back(obj);
    s.newest_ns = std::max(s.newest_ns, obj.mtime_ns);
    s.pinned = s.pinned || std::any_of(pins.begin(), pins.end(), [&](const std::string& p) {
                 return obj.key.starts_with(p) || step_prefix(o_.series, step).starts_with(p);
               });
    s.keys.push_back(obj.key);
    sizes[obj.key] = obj.size;
  }
  // A step a save is still writing or committing (here or in another process) is left
  // alone whatever the grace: its marker holds it (live.h).
  const int64_t now = now_ns();
  for (auto& [step, s] : steps)
    for (const auto& mk : s.markers) {
      const LiveMarker v = judge_live_marker(*tier.store, mk, now);
      if (v.holds) s.live = true;
      if (v.owner_gone) s.gone.emplace(save_stem(mk.key));
    }
  // A save proven gone (live.h: live_owner_gone) will never commit: its shard, as large as
  // the model, waits for no grace (35 kills had left 290 MB for an hour), unless the step's
  // manifest names it; its marker goes with it. Its record, a key its rank's next save
  // writes again, and anything else wait for the grace. Called for a step no marker holds.
  auto remove_gone_saves = [&](uint64_t step, StepObjects& s) -> Status {
    const auto& gone = s.gone;
    if (gone.empty()) return ok();
    std::set<std::string> named;
    if (s.has_manifest) {
      auto m = manifest_on(i, step, &sizes);
      if (!m) return ok();  // a manifest that cannot be read now: nothing goes early
      for (const auto& sh : m->shards)
        named.insert(shard_key(o_.series, step, sh.rank, sh.save_id));
    }
    std::set<std::string> doomed;
    for (const auto& sh : s.shards)
      if (gone.contains(save_stem(sh.key)) && !named.contains(sh.key)) doomed.insert(sh.key);
    for (const auto& mk : s.markers)
      if (gone.contains(save_stem(mk.key))) doomed.insert(mk.key);
    const std::vector<std::string> keys(doomed.begin(), doomed.end());
    SLUICE_RETURN_IF_ERROR(tier.store->remove_many(keys));
    report.objects_removed += keys.size();
    std::erase_if(s.keys, [&](const std::string& k) { return doomed.contains(k); });
    std::erase_if(s.shards, [&](const store::ObjectInfo& o) { return doomed.contains(o.key); });
    std::erase_if(s.markers, [&](const store::ObjectInfo& o) { return doomed.contains(o.key); });
    return ok();
  };
  // Only a whole copy is a checkpoint (read_whole_step): a step whose manifest is damaged or
  // whose shard is lost or truncated is not counted towards keep_last and never stands in
  // for the newest one; it is removed like an unfinished save once past the grace.
  for (auto& [step, s] : steps) s.committed = s.has_manifest && manifest_on(i, step, &sizes);
  std::set<uint64_t> active;
  {
    MutexLock lk(mu_);
    active = active_steps_;
  }
  std::vector<uint64_t> committed;
  for (const auto& [step, s] : steps)
    if (s.committed) committed.push_back(step);
  const Retention& r = tier.retention;
  std::set<uint64_t> keep;
  // The newest checkpoint that restores is never removed.
  if (!committed.empty()) keep.insert(committed.back());
  for (size_t k = 0; k < committed.size(); ++k) {
    bool in_last = r.keep_last == 0 || committed.size() - k <= r.keep_last;
    bool every = r.keep_every && committed[k] % r.keep_every == 0;
    if (in_last || every) keep.insert(committed[k]);
  }
  const int64_t cutoff =
      now_ns() - std::chrono::duration_cast<std::chrono::nanoseconds>(o_.incomplete_grace).count();
  for (auto& [step, s] : steps) {
    if (active.count(step) || s.live || s.pinned) continue;
    SLUICE_RETURN_IF_ERROR(remove_gone_saves(step, s));
    if (s.committed && keep.count(step)) {
      // Markers left by a killed save of a step that got committed all the same.
      for (const auto& mk : s.markers) {
        auto rm = tier.store->remove(mk.key);
        if (!rm && rm.error().code() != Code::kNotFound) return rm;
        ++report.objects_removed;
      }
    }
    if (s.committed && keep.count(step) && s.shards.size() > s.records) {
      // A kept checkpoint with more shards than ranks: the others are of attempts that lost
      // the race to commit, or crashed; once stale they go.
      auto m = manifest_on(i, step, &sizes);
      if (!m) continue;
      std::set<std::string> named;
      for (const auto& sh : m->shards)
        named.insert(shard_key(o_.series, step, sh.rank, sh.save_id));
      for (const auto& obj : s.shards) {
        if (named.count(obj.key) || obj.mtime_ns > cutoff) continue;
        auto rm = tier.store->remove(obj.key);
        if (!rm && rm.error().code() != Code::kNotFound) return rm;
        ++report.objects_removed;
      }
      continue;
    }
    if (s.committed ? keep.count(step) != 0 : s.newest_ns > cutoff) continue;
    if (s.has_manifest) {
      // The manifest goes first: a half-removed checkpoint is no longer listed.
      SLUICE_RETURN_IF_ERROR(tier.store->remove(manifest_key(o_.series, step)));
      std::erase(s.keys, manifest_key(o_.series, step));
    }
    if (s.committed) {
      report.removed_steps.push_back(step);
    } else {
      report.removed_incomplete.push_back(step);
    }
    SLUICE_RETURN_IF_ERROR(tier.store->remove_many(s.keys));
    report.objects_removed += s.keys.size() + (s.has_manifest ? 1 : 0);
  }
  if (local_tier(tier))
    remove_empty_step_dirs(tier.local_dir + "/" + o_.series, o_.series, active,
                           o_.incomplete_grace);
  return ok();
}

Result<GcReport> CheckpointerImpl::gc() {
  GcReport report;
  for (size_t i = 0; i < o_.tiers.size(); ++i) SLUICE_RETURN_IF_ERROR(gc_tier(i, report));
  std::sort(report.removed_steps.begin(), report.removed_steps.end());
  report.removed_steps.erase(std::unique(report.removed_steps.begin(), report.removed_steps.end()),
                             report.removed_steps.end());
  std::sort(report.removed_incomplete.begin(), report.removed_incomplete.end());
  report.removed_incomplete.erase(
      std::unique(report.removed_incomplete.begin(), report.removed_incomplete.end()),
      report.removed_incomplete.end());
  return report;
}

std::string_view to_string(SyncPhase phase) {
  return phase == SyncPhase::kVerifying ? "verifying" : "copying";
}

Result<SyncReport> CheckpointerImpl::sync(const SyncOptions& so) {
  for (size_t t : so.fill)
    if (t >= o_.tiers.size())
      return fail(Code::kInvalidArgument, "sync: no tier " + std::to_string(t) + " to fill");
  auto wanted = [&](size_t t) {
    return so.fill.empty() || std::find(so.fill.begin(), so.fill.end(), t) != so.fill.end();
  };
  auto cancelled = [&] { return so.cancel && so.cancel->load(); };
  SyncReport report;
  SLUICE_ASSIGN_OR_RETURN(auto steps, list());
  for (const StepInfo& info : steps) {
    if (so.step && info.step != *so.step) continue;
    ++report.steps;
    if (cancelled()) {
      report.cancelled = true;
      break;
    }
    const uint64_t step = info.step;
    auto note = [&](const std::string& why) {
      report.problems.push_back("step " + std::to_string(step) + ": " + why);
    };
    // The source: the nearest tier whose copy is complete and intact.
    std::optional<size_t> src;
    std::optional<Manifest> m;
    std::vector<size_t> missing;
    std::vector<std::pair<size_t, Manifest>> held;
    for (size_t i = 0; i < o_.tiers.size(); ++i) {
      auto got = manifest_on(i, step);
      if (got)
        held.emplace_back(i, std::move(*got));
      else if (got.error().code() != Code::kNotFound)
        note("tier " + o_.tiers[i].name + ": " + got.error().message());
      else if (wanted(i))
        missing.push_back(i);
    }
    if (missing.empty()) continue;
    for (auto& [i, manifest] : held) {
      VerifyOptions vo{.tier = static_cast<int>(i), .cancel = so.cancel};
      if (so.on_progress)
        vo.on_progress = [&, step](const std::string& tier, uint64_t done, uint64_t total) {
          so.on_progress(SyncProgress{step, SyncPhase::kVerifying, tier, done, total});
        };
      auto v = verify(step, vo);
      if (!v && v.error().code() == Code::kCancelled) {
        report.cancelled = true;
        return report;
      }
      if (v && v->bad_chunks == 0 && v->problems.empty()) {
        src = i;
        m = std::move(manifest);
        break;
      }
      note("the copy on tier " + o_.tiers[i].name + " does not verify");
    }
    if (!src) {
      note("no intact copy to copy from");
      continue;
    }
    for (size_t t : missing) {
      auto bytes = cancelled() ? Result<uint64_t>(std::unexpected(Error(Code::kCancelled, "")))
                               : copy_step(step, *m, *src, t, so);
      if (!bytes && (bytes.error().code() == Code::kCancelled || cancelled())) {
        report.cancelled = true;  // the copy cut short has no manifest: gc removes it
        return report;
      }
      if (!bytes)
        note("copying to tier " + o_.tiers[t].name + ": " + bytes.error().message());
      else
        report.copied.push_back({step, o_.tiers[t].name, *bytes});
    }
  }
  return report;
}

Result<uint64_t> CheckpointerImpl::copy_step(uint64_t step, const Manifest& m, size_t src,
                                             size_t to, const SyncOptions& so) {
  const Tier& dst = o_.tiers[to];
  Manifest out = m;
  out.created_ns = now_ns();
  uint64_t total = 0;
  for (const auto& shard : out.shards) total += shard.bytes;
  uint64_t bytes = 0;
  xfer::CopyOptions co;
  co.cancel = so.cancel;
  if (so.on_progress)
    co.on_progress = [&](const xfer::CopyProgress& p) {
      so.on_progress(
          SyncProgress{step, SyncPhase::kCopying, dst.name, bytes + p.bytes_done, total});
    };
  for (auto& shard : out.shards) {
    const std::string key = shard_key(o_.series, step, shard.rank, shard.save_id);
    SLUICE_RETURN_IF_ERROR(xfer::copy(*o_.tiers[src].store, key, *dst.store, key, co));
    SLUICE_ASSIGN_OR_RETURN(auto stat, dst.store->stat(key));
    shard.etag = stat.etag;
    shard.created_ns = now_ns();
    bytes += shard.bytes;
    const std::string text = encode_record(shard);
    SLUICE_RETURN_IF_ERROR(
        dst.store->put(record_key(o_.series, step, shard.rank), std::as_bytes(std::span(text))));
  }
  // Stopped before the manifest: the copy is not committed (gc removes what was written).
  if (so.cancel && so.cancel->load()) return fail(Code::kCancelled, "sync cancelled");
  store::WriteOptions wo;
  wo.overwrite = false;
  const std::string text = encode_manifest(out);
  SLUICE_RETURN_IF_ERROR(
      dst.store->put(manifest_key(o_.series, step), std::as_bytes(std::span(text)), wo));
  return bytes;
}

}  // namespace sluice::ckpt
