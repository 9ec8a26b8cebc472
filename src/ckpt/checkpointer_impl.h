// src/ckpt/checkpointer_impl.h: the declarations the checkpointer's files share (private).
//
// CheckpointerImpl, whose methods save.cc, commit.cc, restore.cc and retention.cc define,
// and what those files use together: save handles and jobs, the staging ring, copy helpers,
// the clock and small helpers.
//
// Threads and data flow of a save:
//   caller (save)      tensors -> staging ring, one segment at a time (the only stall)
//   stage writer       staging ring -> the first tier that takes the shard; chunk checksums
//   replicator         record + commit on that tier, then copies to every later tier
// Segments of the staging ring are numbered by one sequence across saves: the caller may
// fill segment q once segment q - slots is released, and the stage writer may write it
// once it is filled. A save that fits in the ring keeps its segments until the shard is
// published somewhere, so a failed first tier can be retried on the next from memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/ckpt/checkpointer.h"
#include "sluice/core/thread_annotations.h"

namespace sluice::ckpt {

// Shared by this layer's files only; in `detail`, so no other file's type of the same
// name in this namespace is ever taken for one of these.
namespace detail {

using Clock = std::chrono::steady_clock;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------
// Save handles.

class Handle final : public SaveHandle {
 public:
  Handle(uint64_t step, uint64_t total, const std::vector<Tier>& tiers) {
    p_.step = step;
    p_.bytes_total = total;
    for (const auto& t : tiers) {
      p_.tiers.push_back({t.name, TierState::kPending, 0, std::nullopt});
      required_.push_back(t.required);
    }
  }

  SaveProgress progress() const override {
    MutexLock lk(mu_);
    return p_;
  }

  Status wait() override {
    UniqueLock lk(mu_);
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return p_.finished; });
    for (size_t i = 0; i < p_.tiers.size(); ++i)
      if (required_[i] && p_.tiers[i].state != TierState::kCommitted)
        return std::unexpected(p_.tiers[i].error.value_or(
            Error(Code::kInternal, "tier " + p_.tiers[i].tier + " was not written")));
    return ok();
  }

  Status wait_tier(size_t i) override {
    UniqueLock lk(mu_);
    if (i >= p_.tiers.size()) return fail(Code::kInvalidArgument, "no tier " + std::to_string(i));
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return settled(p_.tiers[i].state); });
    if (p_.tiers[i].state == TierState::kCommitted) return ok();
    return std::unexpected(p_.tiers[i].error.value_or(Error(Code::kCancelled, "tier skipped")));
  }

  void staged(uint64_t n) {
    MutexLock lk(mu_);
    p_.bytes_staged = n;
  }
  void set(size_t i, TierState s, std::optional<Error> e = std::nullopt) {
    MutexLock lk(mu_);
    p_.tiers[i].state = s;
    if (e) p_.tiers[i].error = std::move(e);
    if (s == TierState::kCommitted) p_.tiers[i].bytes_done = p_.bytes_total;
    p_.finished = std::all_of(p_.tiers.begin(), p_.tiers.end(),
                              [](const TierProgress& t) { return settled(t.state); });
    cv_.notify_all();
  }
  void written(size_t i, uint64_t n) {
    MutexLock lk(mu_);
    p_.tiers[i].bytes_done = n;
  }
  TierState state(size_t i) const {
    MutexLock lk(mu_);
    return p_.tiers[i].state;
  }

 private:
  static bool settled(TierState s) {
    return s == TierState::kCommitted || s == TierState::kFailed || s == TierState::kSkipped;
  }
  mutable Mutex mu_;
  CondVar cv_;
  SaveProgress p_ SLUICE_GUARDED_BY(mu_);
  std::vector<bool> required_;  // set by the constructor, read-only after
};

// ---------------------------------------------------------------------------------------
// The staging ring.

class StagingRing {
 public:
  StagingRing(AlignedBuffer mem, uint64_t segment)
      : mem_(std::move(mem)), segment_(segment), slots_(mem_.size() / segment) {}

  uint64_t segment() const { return segment_; }
  uint64_t slots() const { return slots_; }
  std::byte* slot(uint64_t seq) const { return mem_.data() + (seq % slots_) * segment_; }

  // The caller waits until segment `seq` may be filled.
  void wait_free(uint64_t seq) {
    UniqueLock lk(mu_);
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return seq < released_ + slots_; });
  }
  // Segments before `end` are filled (or will never be: their save gave up).
  void mark_filled_through(uint64_t end) {
    MutexLock lk(mu_);
    filled_ = std::max(filled_, end);
    cv_.notify_all();
  }
  // The stage writer waits until segment `seq` is filled.
  void wait_filled(uint64_t seq) {
    UniqueLock lk(mu_);
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return filled_ > seq; });
  }
  void release_through(uint64_t end) {
    MutexLock lk(mu_);
    released_ = std::max(released_, end);
    cv_.notify_all();
  }
  // Hands out `n` sequence numbers for one save.
  uint64_t reserve(uint64_t n) {
    MutexLock lk(mu_);
    uint64_t first = next_;
    next_ += n;
    return first;
  }

 private:
  AlignedBuffer mem_;
  const uint64_t segment_, slots_;
  Mutex mu_;
  CondVar cv_;
  uint64_t next_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t filled_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t released_ SLUICE_GUARDED_BY(mu_) = 0;
};

// One queued save.
struct SaveJob {
  uint64_t step = 0;
  ShardRecord record;  // tensors laid out; chunk checksums filled by the stage writer
  uint64_t first_seq = 0, segments = 0;
  bool fits = false;                 // the whole shard is in the ring at once
  std::atomic<bool> aborted{false};  // the caller failed while staging
  std::optional<Error> abort_error;  // set before `aborted`, read after it
  // The first tier failed while the caller was still streaming into the ring: staging stops.
  std::atomic<bool> abandoned{false};
  std::optional<Error> abandon_error;  // set before `abandoned`, read after it
  std::string source_etag;             // the shard's etag on source_tier once committed
  std::shared_ptr<Handle> handle;
  int source_tier = -1;  // the tier the stage writer published the shard on
};

inline bool local_tier(const Tier& t) {
  return !t.local_dir.empty();
}

// A thread that copies part of each staged segment: one thread's memcpy runs at about half
// of what the memory system gives two (8-9 vs 17-18 GiB/s on our machines).
class CopyHelper {
 public:
  CopyHelper() : thread_([this] { loop(); }) {}
  ~CopyHelper() {
    {
      MutexLock lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  void post(std::function<Status()> fn) {
    MutexLock lk(mu_);
    task_ = std::move(fn);
    done_ = false;
    cv_.notify_all();
  }
  Status wait() {
    UniqueLock lk(mu_);
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return done_; });
    return result_;
  }

 private:
  void loop() {
    UniqueLock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return stop_ || task_; });
      if (!task_) return;
      auto fn = std::move(task_);
      task_ = nullptr;
      lk.unlock();
      Status r = fn();
      lk.lock();
      result_ = std::move(r);
      done_ = true;
      cv_.notify_all();
    }
  }
  Mutex mu_;
  CondVar cv_;
  std::function<Status()> task_ SLUICE_GUARDED_BY(mu_);
  Status result_ SLUICE_GUARDED_BY(mu_) = ok();
  bool done_ SLUICE_GUARDED_BY(mu_) = true;
  bool stop_ SLUICE_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The files one restore or verify reads (restore.cc).
class ShardFiles;

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(CheckpointerOptions o, std::unique_ptr<StagingRing> ring)
      : o_(std::move(o)), ring_(std::move(ring)) {
    for (unsigned i = 1; i < o_.stage_threads; ++i)
      helpers_.push_back(std::make_unique<CopyHelper>());
    stage_thread_ = std::thread([this] { stage_loop(); });
    repl_thread_ = std::thread([this] { replicate_loop(); });
    lease_thread_ = std::thread([this] { lease_loop(); });
  }

  ~CheckpointerImpl() override {
    flush();
    {
      MutexLock lk(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    stage_thread_.join();
    repl_thread_.join();
    lease_thread_.join();
  }

  const CheckpointerOptions& options() const override { return o_; }

  Status check_cancel() const {
    // Relaxed: a request to stop early; a late look only does a little more work.
    if (o_.cancel && o_.cancel->load(std::memory_order_relaxed))
      return fail(Code::kCancelled, "checkpoint work of series " + o_.series + " was cancelled");
    return ok();
  }

  Result<std::shared_ptr<SaveHandle>> save(uint64_t step,
                                           std::span<const TensorView> tensors) override;
  void flush() override {
    UniqueLock lk(mu_);
    cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return active_ == 0; });
  }

  Result<std::vector<StepInfo>> list() override;
  Result<uint64_t> latest() override;
  Result<Manifest> manifest(uint64_t step) override;
  Result<RestoreReport> restore(uint64_t step, std::span<const TensorDest> dests) override;
  using Checkpointer::verify;
  Result<VerifyReport> verify(uint64_t step, const VerifyOptions& options) override;
  Result<GcReport> gc() override;
  Result<SyncReport> sync(const SyncOptions& options) override;
  // Copies committed step `step` (manifest `m`) from tier `src` to tier `dst` as a save
  // would (shards, records, manifest last). Returns the shard bytes copied.
  Result<uint64_t> copy_step(uint64_t step, const Manifest& m, size_t src, size_t to,
                             const SyncOptions& options);

 private:
  // Staging: fills the job's segments from the tensors (the caller's thread).
  Status stage(SaveJob& job, std::span<const TensorView> views) SLUICE_REQUIRES(save_mu_);
  void stage_loop();
  void replicate_loop();
  // The two queues of jobs: the stage writer's and the replicator's.
  enum class Queue { kStage, kReplicate };
  // The next job of a queue; null once stopping with the queue empty (the loops end).
  std::shared_ptr<SaveJob> take(Queue which) SLUICE_EXCLUDES(mu_);
  // Writes the job's shard from the ring to tier i; the chunk checksums on success.
  Result<std::vector<TensorEntry>> write_from_ring(SaveJob& job, size_t i);
  Status publish_record_and_commit(SaveJob& job, size_t i);
  // Rank 0: polls tier i until every rank's record of this run is there, naming its shard
  // as published, and fills m.shards (m.shards[0] is this rank's). One paged LIST of the
  // step a round, and one GET per record, whatever the world size.
  Status gather_records(SaveJob& job, size_t i, Manifest& m);
  // Before this rank publishes its shard of `step` on a tier: AlreadyExists if the step is
  // committed there. (Shards of other attempts are left alone: a concurrent save may own
  // them; gc removes them once stale.)
  Status check_not_committed(const Tier& tier, uint64_t step);
  // Waits until rank 0 committed the step on tier i, whole and naming this rank's shard of
  // save `save_id`.
  Status wait_for_commit(size_t i, uint64_t step, const std::string& save_id);
  Status gc_tier(size_t i, GcReport& report);
  void finish(SaveJob& job);
  // The job's marker on tier i (live.h): written now, then rewritten by the lease thread
  // until finish() removes it. Best effort: a tier that cannot take it fails on its own.
  void hold_step(const SaveJob& job, size_t i);
  void lease_loop();

  // Reads a shard's bytes [off, off + dst.size()) from tier i.
  Status read_shard(size_t i, const std::string& key, uint64_t off, std::span<std::byte> dst,
                    ShardFiles& files);
  // The manifest of a step that is whole on tier i (ckpt::read_whole_step); `sizes` is a
  // listing of that tier's objects under the step, taken here when null.
  Result<Manifest> manifest_on(size_t i, uint64_t step,
                               const std::map<std::string, uint64_t>* sizes = nullptr);
  // Reads one chunk from the first tier in `holds` where it is intact; returns that tier.
  // `why` collects the failures of earlier tiers.
  Result<size_t> read_chunk(uint64_t step, const ShardRecord& shard, const TensorEntry& tensor,
                            size_t chunk, const std::vector<int>& holds, std::span<std::byte> dst,
                            ShardFiles& files, std::string& why);

  CheckpointerOptions o_;
  std::unique_ptr<StagingRing> ring_;
  Mutex save_mu_;  // one caller stages at a time; taken before mu_
  std::vector<std::unique_ptr<CopyHelper>> helpers_ SLUICE_GUARDED_BY(save_mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<SaveJob>> stage_q_ SLUICE_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<SaveJob>> repl_q_ SLUICE_GUARDED_BY(mu_);
  std::set<uint64_t> active_steps_ SLUICE_GUARDED_BY(mu_);
  size_t active_ SLUICE_GUARDED_BY(mu_) = 0;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::set<std::pair<size_t, std::string>> live_ SLUICE_GUARDED_BY(mu_);  // (tier, marker key)
  std::thread stage_thread_, repl_thread_, lease_thread_;
};

}  // namespace detail
using namespace detail;

}  // namespace sluice::ckpt
