// sluice/ckpt/checkpointer.h: asynchronous, tiered, verified checkpoints.
//
//   ckpt::CheckpointerOptions o;
//   o.series = "llama-8b"; o.rank = rank; o.world = world;
//   o.tiers.push_back(ckpt::open_tier("file:///nvme/ckpt").value());   // fastest first
//   o.tiers.push_back(ckpt::open_tier("s3://bucket/ckpt", so).value());  // durable last
//   auto cp = ckpt::Checkpointer::open(std::move(o)).value();
//   auto h = cp->save(step, tensors).value();   // returns once the bytes are staged
//   ... training goes on ...
//   h->wait();                                  // every required tier committed, or why not
//   cp->restore(cp->latest().value(), dests);   // nearest copy that verifies, per chunk
//
// What a save guarantees:
// - `save` returns as soon as every byte is copied into the staging memory, which is
//   allocated once when the Checkpointer opens (`staging_bytes`) and reused. A state larger
//   than the staging streams through it: `save` then returns when the last byte is staged.
//   The caller may change its tensors as soon as `save` returns.
// - The staged bytes go to the first tier (through io::FileHandle, io_uring and O_DIRECT
//   for a local directory); every later tier is copied from a committed tier. Each tier's
//   copy commits on its own: shards, then each rank's shard record, then the manifest,
//   written by rank 0 once every rank's record is there (exclusive create, durable). A
//   step without a manifest is not a checkpoint: never listed, never restored, removed by
//   `gc` once older than `incomplete_grace`.
// - Saves run one at a time in the order they were made; a save of a step already
//   committed on a tier fails there with AlreadyExists.
// - Before a save starts, each local tier's free space is checked against the shard
//   (NoSpace at once rather than half-way).
// - After a tier commits, its retention policy runs (see Retention): the newest committed
//   checkpoint is never removed, nor a step still being written.
//
// What a restore guarantees: every byte handed back matched its chunk's checksum. Each
// chunk is read from the first tier whose committed copy has it intact; a missing or
// corrupt chunk is read again from the next tier, and the report says so.
//
// Threads: save, restore, list and gc may be called from any thread; saves are queued to
// one background writer. Destroying the Checkpointer waits for queued saves to finish.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/ckpt/manifest.h"
#include "sluice/core/status.h"
#include "sluice/io/file_handle.h"
#include "sluice/mem/target.h"
#include "sluice/store/store.h"

namespace sluice::ckpt {

// How many committed checkpoints a tier keeps: the newest `keep_last`, and every step that
// is a multiple of `keep_every` (0: none). The newest committed one is always kept.
// keep_last 0 keeps everything. A step with a key under a pinned prefix is never removed
// (nor are the leftovers of saves in it): `pinned`, when set, is asked at each gc for the
// prefixes, as the tier's keys are spelled ("" pins the whole tier); an error from it
// leaves the tier untouched and is gc's error. client::open_checkpointer sets it from the
// ledger's pins (sluice gc pin), so every caller's retention honours them.
struct Retention {
  unsigned keep_last = 0;
  uint64_t keep_every = 0;
  std::function<Result<std::vector<std::string>>()> pinned;
};

// One place a checkpoint's copy rests: a store, and for a local directory its path, so
// shards are written and read through the data path instead of the store's writers.
struct Tier {
  std::string name;                     // for reports: "local", "s3", the URI
  std::shared_ptr<store::Store> store;  // the tier's root
  std::string local_dir;                // set for file:// tiers
  bool required = true;                 // a save succeeds only once this tier committed
  Retention retention;
};

// Opens a tier by URI: a directory (plain path or file://; created if missing when
// `create`, else NotFound) or any store URI open_store knows (s3://bucket/prefix,
// mem://name, sluiced://member@host:port/folder). Readers pass create = false, so a
// mistyped path is an error rather than an empty tier.
Result<Tier> open_tier(std::string_view uri, const store::StoreOptions& options = {},
                       bool create = true);

// A tensor to save: `bytes` bytes at `data`, in host memory (target null) or in the memory
// of `target` (a device: copied to staging through the target's copy engine). A tensor
// whose bytes are not in memory (a file) has a `source` instead, called to fill staging
// with bytes [offset, offset + dst.size()); the staging threads call it for disjoint ranges
// at once, so it must be thread-safe. An error from it fails the save.
struct TensorView {
  std::string name;
  std::string dtype = "uint8";
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
  mem::Target* target = nullptr;
  std::function<Status(uint64_t offset, std::span<std::byte> dst)> source;
  uint32_t mode = 0;  // permission bits of a file's bytes, recorded in the manifest; 0: none
};

// Where a restored tensor goes: bytes [offset, offset + bytes) of the saved tensor (the
// whole tensor by default: offset 0, bytes its size). A part must start at a multiple of
// the checkpoint's chunk size and end at one or at the tensor's end, so every chunk read
// is whole and checked; restoring a large tensor part by part bounds the memory a caller
// needs. `rank` picks the shard (ranks of a tensor-parallel job may save tensors of the
// same name); -1 looks in this Checkpointer's rank's shard first, then in any shard
// holding the name once.
struct TensorDest {
  std::string name;
  int rank = -1;
  void* data = nullptr;
  uint64_t bytes = 0;
  mem::Target* target = nullptr;
  uint64_t offset = 0;
};

struct CheckpointerOptions {
  std::string series;
  unsigned rank = 0, world = 1;
  // Names this run of the job, the same on every rank (a launcher's job id and restart
  // count, or an id rank 0 broadcasts): rank 0 commits only records carrying it, so a
  // record left by a crashed earlier run at the same step is never mixed in. Required when
  // world > 1.
  std::string run_id;
  std::vector<Tier> tiers;  // fastest first; at least one
  // Host memory the staging takes, allocated and touched once at open. Rounded up to a
  // multiple of 2 * segment_bytes.
  uint64_t staging_bytes = uint64_t{1} << 30;
  uint64_t segment_bytes = uint64_t{16} << 20;  // the unit staged and written at once
  uint64_t chunk_size = uint64_t{4} << 20;      // checksum granularity (a multiple of 4 KiB)
  // Threads copying into staging during save: the caller's and stage_threads - 1 helpers.
  unsigned stage_threads = 2;
  unsigned restore_parallel = 8;  // chunk reads in flight during a restore
  // How long rank 0 waits for every rank's record before failing the commit.
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(10)};
  // How old an uncommitted step's newest object must be before gc removes it.
  std::chrono::seconds incomplete_grace{std::chrono::hours(1)};
  bool gc_after_save = true;  // run retention on each tier after it commits
  // When this becomes true (Ctrl-C in a tool), work stops at the next segment or chunk:
  // saves abort their writers (no temporary file or open upload is left) and report
  // Cancelled on every tier not yet committed; save() and restore() return Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  std::shared_ptr<io::Context> io;  // null: a default context
};

enum class TierState { kPending, kWriting, kCommitted, kFailed, kSkipped };
const char* to_string(TierState s);

struct TierProgress {
  std::string tier;
  TierState state = TierState::kPending;
  uint64_t bytes_done = 0;
  std::optional<Error> error;
};

struct SaveProgress {
  uint64_t step = 0;
  uint64_t bytes_total = 0;  // this rank's shard
  uint64_t bytes_staged = 0;
  std::vector<TierProgress> tiers;
  bool finished = false;  // every tier committed, failed or was skipped
};

class SaveHandle {
 public:
  virtual ~SaveHandle() = default;
  virtual SaveProgress progress() const = 0;
  // Waits until every tier is done; OK when every required tier committed, else the first
  // required tier's error.
  virtual Status wait() = 0;
  // Waits until the tier at `index` committed or failed.
  virtual Status wait_tier(size_t index) = 0;
};

struct StepInfo {
  uint64_t step = 0;
  std::vector<std::string> tiers;  // the tiers holding a committed copy (their names)
  uint64_t bytes = 0;
  int64_t created_ns = 0;
};

struct RestoreReport {
  uint64_t bytes = 0;
  std::vector<uint64_t> bytes_by_tier;  // same order as the tiers
  uint64_t chunks_failed_over = 0;      // chunks read again from a later tier
  std::vector<std::string> problems;    // one line per chunk that failed on some tier
  double seconds = 0;
};

struct VerifyReport {
  uint64_t chunks = 0, bad_chunks = 0;
  std::vector<std::string> problems;
};

struct VerifyOptions {
  int tier = -1;  // an index into CheckpointerOptions::tiers; -1: every tier holding the step
  // Called as chunks are checked: the tier, and its bytes (tensor bytes) checked and in all.
  // From the reading threads, one call at a time.
  std::function<void(const std::string& tier, uint64_t done, uint64_t total)> on_progress;
  // When it becomes true, verify stops at the next chunk and fails with Cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

struct SyncReport {
  struct Copied {
    uint64_t step = 0;
    std::string tier;
    uint64_t bytes = 0;
  };
  std::vector<Copied> copied;         // one entry per step and tier it was copied to
  std::vector<std::string> problems;  // steps that could not be copied, and why
  bool cancelled = false;             // stopped by SyncOptions::cancel
  uint64_t steps = 0;                 // committed steps looked at (of SyncOptions::step, if set)
};

enum class SyncPhase { kVerifying, kCopying };
std::string_view to_string(SyncPhase phase);  // "verifying", "copying"

// Where a sync is: checking a step's source copy (tensor bytes), or copying it to a tier
// (shard bytes).
struct SyncProgress {
  uint64_t step = 0;
  SyncPhase phase = SyncPhase::kVerifying;
  std::string tier;  // the tier checked, or copied to
  uint64_t done = 0, total = 0;
};

// What sync copies, and how it reports. A tier is an index into CheckpointerOptions::tiers.
struct SyncOptions {
  std::optional<uint64_t> step;  // one step; none: every committed step
  std::vector<size_t> fill;      // only these tiers get copies; empty: every tier lacking one
  // Called as bytes are checked and copied, from the reading and copying threads, one call
  // at a time.
  std::function<void(const SyncProgress&)> on_progress;
  // When it becomes true, sync stops at the next chunk or part: what was committed stays
  // committed, a tier's copy cut short has no manifest (gc removes it), and the report says
  // cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

struct GcReport {
  std::vector<uint64_t> removed_steps;  // committed checkpoints removed
  std::vector<uint64_t> removed_incomplete;
  uint64_t objects_removed = 0;
};

class Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> open(CheckpointerOptions options);
  virtual ~Checkpointer() = default;

  // Stages `tensors` and queues the write; see the guarantees above. Fails at once on bad
  // input (names empty or repeated, null data) or a local tier without room.
  virtual Result<std::shared_ptr<SaveHandle>> save(uint64_t step,
                                                   std::span<const TensorView> tensors) = 0;
  // Waits for every queued save.
  virtual void flush() = 0;

  // Committed steps on any tier, ascending.
  virtual Result<std::vector<StepInfo>> list() = 0;
  // The newest committed step whose manifest reads and verifies on some tier.
  virtual Result<uint64_t> latest() = 0;
  // The manifest of a committed step, from the first tier that has a valid one.
  virtual Result<Manifest> manifest(uint64_t step) = 0;
  // Restores the named tensors (of any rank's shard) into `dests`.
  virtual Result<RestoreReport> restore(uint64_t step, std::span<const TensorDest> dests) = 0;
  // Reads every chunk of a step on one tier (or every tier holding it: tier < 0) and
  // checks it. NotFound when no tier looked at holds the step; Cancelled when stopped.
  virtual Result<VerifyReport> verify(uint64_t step, const VerifyOptions& options) = 0;
  Result<VerifyReport> verify(uint64_t step, int tier = -1) {
    return verify(step, VerifyOptions{.tier = tier});
  }
  // Applies each tier's retention and removes stale incomplete steps.
  virtual Result<GcReport> gc() = 0;
  // Copies committed checkpoints (one step, or every one) to the tiers that lack them: after
  // a save whose later tiers failed or were cut short by a crash, or when a tier is added.
  // Each copy is checked against the manifest's chunk checksums on its source first, then
  // committed on the new tier as a save would (shards, records, manifest last). Steps that
  // cannot be copied are named in the report; the call fails only when listing fails.
  // Tiers left out of `fill` are still read from. Only the source copies are checked
  // (and only of steps some tier lacks): `verify` checks every copy.
  virtual Result<SyncReport> sync(const SyncOptions& options = {}) = 0;

  virtual const CheckpointerOptions& options() const = 0;
};

}  // namespace sluice::ckpt
