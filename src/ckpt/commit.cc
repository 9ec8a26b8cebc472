// The commit protocol: shard records, rank 0's manifest, waiting for it, copies to later tiers.
#include "ckpt/checkpointer_impl.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "sluice/xfer/copy.h"

namespace sluice::ckpt {

namespace {

// Etags as a listing and a stat spell them: S3 quotes them (and may mark them weak).
bool same_etag(std::string_view a, std::string_view b) {
  auto bare = [](std::string_view e) {
    if (e.starts_with("W/")) e.remove_prefix(2);
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    return e;
  };
  return bare(a) == bare(b);
}

}  // namespace

void CheckpointerImpl::replicate_loop() {
  while (std::shared_ptr<SaveJob> job = take(Queue::kReplicate)) {
    const size_t src = static_cast<size_t>(job->source_tier);
    auto commit_on = [&](size_t i) {
      if (auto st = publish_record_and_commit(*job, i); !st) {
        // A save that failed takes back the shard it published: nothing is left for gc's
        // grace (a full tier stays full otherwise), and the loser of two saves of one step
        // leaves no orphan. Only where no manifest can name it: another save committed the
        // step (AlreadyExists, or a manifest without this shard), the tier refused the
        // record (full, over quota), or rank 0 failed before committing. A rank that gave up
        // waiting, or could not read the tier for a moment, keeps it: rank 0 may commit.
        const Code code = st.error().code();
        const bool unnamed = code == Code::kAlreadyExists || code == Code::kNoSpace ||
                             code == Code::kQuotaExceeded ||
                             (code == Code::kConflict && o_.rank != 0) ||
                             (o_.rank == 0 && code != Code::kUnavailable &&
                              code != Code::kIoError && code != Code::kTimedOut);
        if (unnamed)
          (void)o_.tiers[i].store->remove(
              shard_key(o_.series, job->step, o_.rank, job->record.save_id));
        job->handle->set(i, TierState::kFailed, st.error());
        return false;
      }
      job->handle->set(i, TierState::kCommitted);
      if (o_.gc_after_save && o_.rank == 0) {
        GcReport ignored;
        (void)gc_tier(i, ignored);  // retention is best effort; `gc` reports its errors
      }
      return true;
    };
    if (!commit_on(src)) {
      // Copies are made from a committed copy only.
      Error e(Code::kCancelled, "not copied: the commit on tier " + o_.tiers[src].name + " failed");
      for (size_t i = src + 1; i < o_.tiers.size(); ++i)
        job->handle->set(i, TierState::kSkipped, e);
      finish(*job);
      continue;
    }
    const std::string key = shard_key(o_.series, job->step, o_.rank, job->record.save_id);
    for (size_t i = src + 1; i < o_.tiers.size(); ++i) {
      job->handle->set(i, TierState::kWriting);
      xfer::CopyOptions co;
      co.overwrite = false;
      co.cancel = o_.cancel;
      co.on_progress = [&](const xfer::CopyProgress& p) { job->handle->written(i, p.bytes_done); };
      Status cleared = check_not_committed(o_.tiers[i], job->step);
      if (cleared) hold_step(*job, i);
      Result<store::ObjectInfo> copied =
          cleared ? xfer::copy(*o_.tiers[src].store, key, *o_.tiers[i].store, key, co)
                  : Result<store::ObjectInfo>(std::unexpected(cleared.error()));
      if (copied && copied->etag != job->source_etag) {
        (void)o_.tiers[i].store->remove(key);  // bytes of another version: never recorded
        copied = fail(Code::kConflict,
                      key + " on tier " + o_.tiers[src].name + " changed after it was committed");
      }
      if (!copied) {
        job->handle->set(
            i, TierState::kFailed,
            Error(copied.error().code(), "copying shard " + key + " to tier " + o_.tiers[i].name +
                                             ": " + copied.error().message()));
        continue;
      }
      commit_on(i);
    }
    finish(*job);
  }
}

Status CheckpointerImpl::check_not_committed(const Tier& tier, uint64_t step) {
  auto st = tier.store->stat(manifest_key(o_.series, step));
  if (st)
    return fail(Code::kAlreadyExists, "step " + std::to_string(step) + " of series " + o_.series +
                                          " is already committed on tier " + tier.name);
  if (st.error().code() != Code::kNotFound) return std::unexpected(st.error());
  return ok();
}

Status CheckpointerImpl::publish_record_and_commit(SaveJob& job, size_t i) {
  const Tier& tier = o_.tiers[i];
  ShardRecord rec = job.record;
  SLUICE_ASSIGN_OR_RETURN(auto info,
                          tier.store->stat(shard_key(o_.series, job.step, o_.rank, rec.save_id)));
  if (info.size != rec.bytes)
    return fail(Code::kCorruption, "shard " + info.key + " on tier " + tier.name + " has " +
                                       std::to_string(info.size) + " bytes, not " +
                                       std::to_string(rec.bytes));
  rec.etag = info.etag;
  rec.created_ns = now_ns();
  rec.run_id = o_.run_id;
  if (static_cast<int>(i) == job.source_tier) job.source_etag = info.etag;
  const std::string text = encode_record(rec);
  SLUICE_RETURN_IF_ERROR(
      tier.store->put(record_key(o_.series, job.step, o_.rank), std::as_bytes(std::span(text))));
  if (o_.rank != 0) return wait_for_commit(i, job.step, rec.save_id);

  // Rank 0 commits once every rank's record is there and names the shard now published.
  Manifest m;
  m.series = o_.series;
  m.step = job.step;
  m.world = o_.world;
  m.created_ns = now_ns();
  m.shards.resize(o_.world);
  m.shards[0] = rec;
  SLUICE_RETURN_IF_ERROR(gather_records(job, i, m));
  const std::string text_m = encode_manifest(m);
  const std::string mkey = manifest_key(o_.series, job.step);
  store::WriteOptions wo;
  wo.overwrite = false;
  auto st = tier.store->put(mkey, std::as_bytes(std::span(text_m)), wo);
  if (!st && st.error().code() == Code::kAlreadyExists)
    return fail(Code::kAlreadyExists, "step " + std::to_string(job.step) + " of series " +
                                          o_.series + " was committed on tier " + tier.name +
                                          " by another save");
  if (!st) return st;
  // And is whole once written (a removal racing the write above): else it is taken back.
  // Only a step seen to be broken is taken back: a tier that cannot be read for a moment
  // says nothing against the commit just made (and other ranks may have reported it).
  if (auto whole = manifest_on(i, job.step);
      !whole &&
      (whole.error().code() == Code::kNotFound || whole.error().code() == Code::kCorruption)) {
    (void)tier.store->remove(mkey);
    return fail(Code::kConflict, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                     " was not whole once committed, so the commit was taken "
                                     "back: " +
                                     whole.error().message());
  }
  return ok();
}

Status CheckpointerImpl::gather_records(SaveJob& job, size_t i, Manifest& m) {
  const Tier& tier = o_.tiers[i];
  auto removed = [&](const ShardRecord& sh) {
    return fail(Code::kConflict, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                     ": shard " +
                                     shard_key(o_.series, job.step, sh.rank, sh.save_id) +
                                     " of rank " + std::to_string(sh.rank) +
                                     " was removed or replaced before the commit; nothing was "
                                     "committed");
  };
  if (o_.world == 1) {
    // Nothing to wait for; the shard must still be there (a stat: a tier whose credentials
    // may write but not list still takes a single-rank save).
    const ShardRecord& own = m.shards[0];
    auto now = tier.store->stat(shard_key(o_.series, job.step, own.rank, own.save_id));
    if (!now || now->size != own.bytes || (!own.etag.empty() && now->etag != own.etag))
      return removed(own);
    return ok();
  }
  // Records read but not (yet) taken, by rank, with the etag they were read at: another
  // run's record, or one whose shard is not there as recorded. Read again only once the
  // listing shows that record replaced.
  std::vector<std::optional<std::pair<std::string, ShardRecord>>> read(o_.world);
  std::vector<bool> have(o_.world, false);
  have[0] = true;
  const auto deadline = Clock::now() + o_.commit_timeout;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    // One paged LIST of the step a round: which records are there, and every shard's size
    // and etag. (A stat per missing rank was world - 1 requests a round.)
    SLUICE_ASSIGN_OR_RETURN(auto objs, tier.store->list_all(step_prefix(o_.series, job.step)));
    std::map<std::string, store::ObjectInfo, std::less<>> listed;
    for (auto& obj : objs) listed.emplace(obj.key, std::move(obj));
    // Whether the shard a record names is published as recorded (its size and etag).
    auto published = [&](const ShardRecord& rec) {
      const std::string sk = shard_key(o_.series, job.step, rec.rank, rec.save_id);
      auto it = listed.find(sk);
      if (it == listed.end() || it->second.size != rec.bytes) return false;
      if (rec.etag.empty() || same_etag(it->second.etag, rec.etag)) return true;
      // A store whose listing spells an etag otherwise than its stat: ask the shard.
      auto sh = tier.store->stat(sk);
      return sh && sh->size == rec.bytes && sh->etag == rec.etag;
    };
    for (unsigned r = 1; r < o_.world; ++r) {
      if (have[r]) continue;
      const std::string rk = record_key(o_.series, job.step, r);
      auto at = listed.find(rk);
      if (at == listed.end()) continue;
      if (!read[r] || read[r]->first != at->second.etag) {
        auto doc = read_document(*tier.store, at->second);
        if (!doc) {
          // Replaced or removed since the listing: the next round sees what is there.
          if (doc.error().code() == Code::kNotFound || doc.error().code() == Code::kConflict)
            continue;
          return std::unexpected(doc.error());
        }
        auto got = decode_record(*doc, rk + " on tier " + tier.name);
        if (!got) return std::unexpected(got.error());
        if (got->series != o_.series || got->step != job.step || got->rank != r ||
            got->world != o_.world)
          return fail(Code::kCorruption,
                      rk + " on tier " + tier.name + " describes another rank, step or world");
        read[r].emplace(at->second.etag, std::move(*got));
      }
      const ShardRecord& got = read[r]->second;
      // A record of another run (an earlier attempt at this step that crashed) is not this
      // save's: wait for this run's rank to replace it.
      if (got.run_id != o_.run_id) continue;
      if (got.chunk_size != o_.chunk_size)
        return fail(Code::kInvalidArgument,
                    rk + " on tier " + tier.name + ": rank " + std::to_string(r) +
                        " uses chunks of " + std::to_string(got.chunk_size) + " bytes, rank 0 of " +
                        std::to_string(o_.chunk_size));
      // The record names the shard now published (not one replaced since).
      if (!published(got)) continue;
      m.shards[r] = got;
      have[r] = true;
    }
    if (std::all_of(have.begin(), have.end(), [](bool b) { return b; })) {
      // The manifest may only name what is there now: a shard removed while rank 0 waited
      // (a gc in another process, an operator) must fail the commit, not be named. This
      // round's listing says what is there.
      for (const ShardRecord& sh : m.shards)
        if (!published(sh)) return removed(sh);
      return ok();
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (unsigned r = 0; r < o_.world; ++r)
        if (!have[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return fail(Code::kTimedOut, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                       ": no shard record from rank(s) " + missing + " after " +
                                       std::to_string(o_.commit_timeout.count()) + " ms");
    }
    SLUICE_RETURN_IF_ERROR(check_cancel());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

Status CheckpointerImpl::wait_for_commit(size_t i, uint64_t step, const std::string& save_id) {
  const auto deadline = Clock::now() + o_.commit_timeout;
  auto pause = std::chrono::milliseconds(20);
  const std::string key = manifest_key(o_.series, step);
  for (;;) {
    auto st = o_.tiers[i].store->stat(key);
    if (st) {
      // Committed: and whole, naming this rank's shard as published (else nothing restores).
      // A tier that cannot be read for a moment is asked again.
      auto got = manifest_on(i, step);
      if (!got && got.error().code() != Code::kNotFound &&
          got.error().code() != Code::kCorruption && Clock::now() < deadline) {
        std::this_thread::sleep_for(pause);
        continue;
      }
      if (!got) return std::unexpected(got.error());
      const Manifest& m = *got;
      if (m.shards.size() != o_.world || m.shards[o_.rank].save_id != save_id)
        return fail(Code::kConflict, "step " + std::to_string(step) + " on tier " +
                                         o_.tiers[i].name +
                                         " was committed by another save, without this rank's "
                                         "shard");
      return ok();
    }
    if (st.error().code() != Code::kNotFound) return std::unexpected(st.error());
    if (Clock::now() >= deadline)
      return fail(Code::kTimedOut, "step " + std::to_string(step) + " on tier " + o_.tiers[i].name +
                                       ": rank 0 did not commit within " +
                                       std::to_string(o_.commit_timeout.count()) + " ms");
    SLUICE_RETURN_IF_ERROR(check_cancel());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace sluice::ckpt
