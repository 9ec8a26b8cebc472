// sluice/stream/dataset.h: a dataset under a store prefix, and the loader that streams it.
//
//   auto store = open_store("cache+s3://bucket/").value();   // through the tiered cache
//   auto ds = Dataset::open(std::move(store), "imagenet/train/", {}).value();
//   Loader loader(ds, {.seed = 7, .rank = r, .world = w});
//   while (auto batch = loader.next_batch(256).value(); !batch.empty()) { ... }
//   std::string token = loader.state();    // saved with the checkpoint
//   Loader resumed(ds, {.seed = 7, .rank = r, .world = w, .resume = token});
//
// A dataset is either WebDataset tar shards (samples grouped by basename inside each
// ".tar" object; see tar.h) or plain objects (one sample per key, the files of one basename
// grouping into fields, as in a shard). Dataset::open lists the prefix once and reads each
// shard's index ("<shard>.idx", written by `sluice dataset pack`), scanning a shard's tar
// headers where it has none; with DatasetOptions::catalog_dir the node's other opens read
// what the first learned instead.
//
// The order of an epoch is a function of (seed, epoch, sample position) only:
//   1. the shards are shuffled by (seed, epoch);
//   2. walking that order, shards are grouped into windows of at least `shuffle_window`
//      samples; the samples of each window are shuffled by (seed, epoch, window), so every
//      window mixes several shards (a bounded shuffle);
//   3. the epoch is the windows one after another: positions 0 .. N-1.
// Consumers (world ranks x workers each): rank r reads positions start + r, start + r + W,
// start + r + 2W, ... (W ranks; `start` the position the loader started the epoch at: 0,
// or a resume token's): the rank's stream. The rank's workers take its stream in blocks of
// `block` samples, round-robin: worker w takes blocks w, w + workers, w + 2 * workers, ...
// So a DataLoader whose workers each make batches of `block` samples, and which takes one
// batch from each worker in turn, hands the main process the rank's stream in order (block
// 1: the workers take its samples round-robin). Every sample is read exactly once per epoch
// across the job. When N - start is not a multiple of W, the first (N - start) mod W ranks
// read one sample more than the others; nothing is dropped or repeated.
//
// Resume: state() returns a token (epoch, position) where position is the job-wide count of
// samples consumed in the epoch, assuming every rank has consumed its stream up to the last
// sample this loader delivered, as far as every other rank has (synchronous training
// steps). A loader opened with that token, for any number of ranks and workers, continues
// with exactly the positions not consumed yet; with the same number of ranks each one reads
// exactly what the uninterrupted run would have read. (A worker's own loader cannot know
// what the other workers delivered: where workers feed one consumer, count what it took and
// make the token from that, as sluice.data's DataLoader does. At the end of an uneven epoch,
// take the token at a step all ranks share: see docs/dataset.md.)
//
// Reads: a background thread reads ahead, within `memory_bytes`, the samples this consumer
// will take next, in slices of whole windows (two slices read at once, each at most a
// quarter of the budget), with up to `inflight` requests in flight; ranges of one shard
// that lie close together are read with one request. From a cache that keeps no chunks in
// RAM (cache::ReadAhead::keeps_chunks), a chunk a slice takes only some samples of is read
// whole into scratch memory (an eighth of the budget at most) and the samples copied out.
// Where the store is a cache::TieredCache, the
// loader declares each coming window's ranges to it (the cache fetches ahead and evicts by the
// declared order); at the end of an epoch the next epoch's first window is read ahead like any
// other, so there is no dip at the epoch boundary. A store answering Unavailable (S3 SlowDown, 503)
// is backed off exponentially with jitter and the window in flight is halved, then grows back.
//
// Errors: a shard whose bytes are not a valid tar (or do not match its index) is Corruption
// naming the shard and offset; with `skip_corrupt` its samples are skipped and counted
// (LoaderStats::skipped_samples) instead.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/mem/target.h"
#include "sluice/store/store.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::stream {

enum class Format { kAuto, kTar, kObjects };

struct DatasetOptions {
  // kAuto: tar shards when the prefix holds ".tar" objects and nothing else but their
  // ".idx" indexes; plain objects otherwise.
  Format format = Format::kAuto;
  // Skip shards that cannot be scanned (counted in Dataset::skipped_shards) instead of
  // failing open.
  bool skip_corrupt = false;
  // Requests in flight while reading indexes and scanning shards.
  unsigned inflight = 16;
  // A node-local directory for dataset catalogs (docs/formats/dataset-catalog.md): the
  // listing and every shard's sample table, written by the first open and read by the
  // next ones within catalog_ttl, so the workers and ranks of a node list the dataset
  // once. Opens of one dataset wait for each other on a lock while one builds it.
  // Empty: list and read the indexes on every open.
  std::string catalog_dir;
  std::chrono::seconds catalog_ttl{600};
  // Names the store in the catalog's identity; empty: its identity() (URI and endpoint).
  // Give the endpoint too for a store that cannot say it (a node+ store reads through the
  // daemon's), or catalogs of s3://bucket on two servers would mix.
  std::string store_id;
};

struct ShardInfo {
  std::string key;  // the object's key in the store
  uint64_t size = 0;
  std::string etag;
  uint64_t first = 0;    // the dataset-wide number of its first sample
  uint64_t samples = 0;  // how many it holds
  bool indexed = false;  // its samples came from an index (false: scanned)
};

class Dataset {
 public:
  static Result<std::shared_ptr<Dataset>> open(std::shared_ptr<store::Store> store,
                                               std::string prefix, DatasetOptions options = {});

  Format format() const { return format_; }  // kTar or kObjects
  const std::string& prefix() const { return prefix_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }
  uint64_t samples() const { return samples_.size(); }
  uint64_t bytes() const { return bytes_; }  // of the shards (or objects)
  uint64_t skipped_shards() const { return skipped_shards_; }
  // Names this opening's listing left out (a local symlink leading out of the dataset's
  // folder: store.h's ListPage), for the caller to report; empty when a catalog was reused.
  const std::vector<store::SkippedKey>& left_out() const { return left_out_; }
  // true when open read the node's catalog instead of listing the store.
  bool from_catalog() const { return from_catalog_; }
  // A fingerprint of the dataset's layout (shards, sizes, sample counts): what the order
  // of an epoch depends on. Tokens of versions before v3 carry only this.
  uint64_t fingerprint() const { return fingerprint_; }
  // The dataset's content identity: its layout and, for every shard, its etag and its
  // sample table (keys and byte ranges). Unlike the fingerprint it changes when a shard is
  // rewritten, regenerated or replaced with the same names, sizes and counts, so a resume
  // token (v3) that carries it is never applied to other content. It leaves out the route
  // the dataset is read by (the store's URI, a cache in front of it: the same content by
  // every route) and the prefix (shard keys count from it); sluice.data's state
  // names the location beside it. Etags are the store's own, except that of a local file's
  // only its size and mtime count: its device, inode and ctime differ on another node of a
  // shared file system, on a copy staged to a node's disk, after a chmod. Computed on the
  // first call (it walks every sample: no cost to an open that makes or checks no token).
  uint64_t identity() const;
  // Whether sample numbers go by (shard, offset), as pack and shard scans number them (an
  // index written by another tool may not): reads of a set of samples then sort by number.
  bool numbered_in_place() const { return numbered_in_place_; }
  store::Store& store() const { return *store_; }
  const DatasetOptions& options() const { return options_; }

  // A sample's place: its shard, its key, and the byte range (tar) or its objects.
  struct SampleRef {
    uint32_t shard = 0;               // tar: index into shards(); objects: first object
    uint32_t objects = 1;             // objects format: how many consecutive objects (fields)
    uint64_t offset = 0, length = 0;  // tar: the range in the shard; objects: total bytes
  };
  const SampleRef& sample(uint64_t n) const { return samples_[n]; }
  const std::string& sample_key(uint64_t n) const { return keys_[n]; }

 private:
  Dataset() = default;
  std::shared_ptr<store::Store> store_;
  std::string prefix_;
  DatasetOptions options_;
  Format format_ = Format::kTar;
  std::vector<ShardInfo> shards_;  // tar shards, or objects (one per field object)
  std::vector<SampleRef> samples_;
  std::vector<std::string> keys_;
  uint64_t bytes_ = 0, skipped_shards_ = 0, fingerprint_ = 0;
  mutable std::once_flag identity_once_;
  mutable uint64_t identity_ = 0;
  bool from_catalog_ = false, numbered_in_place_ = true;
  std::vector<store::SkippedKey> left_out_;
};

// One field of a sample: its name ("jpg") and bytes (valid while the Sample's `hold`, in it
// or in a copy of it, lives).
struct Field {
  std::string name;
  std::span<const std::byte> data;
};

struct Sample {
  std::string_view key;  // valid while the Dataset lives
  uint64_t epoch = 0;
  uint64_t position = 0;  // in the epoch's order
  uint64_t index = 0;     // the dataset-wide sample number (Dataset::sample)
  // Held, with the bytes, by `hold`: the loader keeps one list of fields a slice, not one
  // allocation a sample (which cost small samples a tenth of their time in malloc and free).
  std::span<const Field> fields;
  std::shared_ptr<const void> hold;  // keeps the fields and their bytes alive
  const Field* field(std::string_view name) const;
  uint64_t bytes() const;
};

struct LoaderOptions {
  uint64_t seed = 0;
  uint64_t epoch = 0;   // the first epoch (a resume token overrides it)
  uint64_t epochs = 1;  // epochs to read from the first one; 0: without end
  unsigned rank = 0, world = 1;
  unsigned worker = 0, workers = 1;
  // Samples a worker takes from its rank's stream at a time (a DataLoader's batch size; see
  // the header comment). At least 1.
  uint64_t block = 1;
  std::string resume;  // a token from state(); empty: start at the epoch's beginning
  bool shuffle = true;
  // Samples mixed at once (whole shards, at least). 0: as many as a quarter of
  // memory_bytes (one slice) holds at the dataset's mean sample size, so each window is
  // read once. A resume token
  // carries the window; a loader resumed with 0 takes the token's.
  uint64_t shuffle_window = 0;
  uint64_t memory_bytes = uint64_t{256} << 20;  // read ahead, at most
  unsigned inflight = 32;                       // requests in flight, at most
  // Ranges of one shard closer than this are read with one request; where requests are
  // cheap (a cache, Store::cheap_requests) at most 64 KiB apart.
  uint64_t coalesce_gap = uint64_t{1} << 20;
  bool skip_corrupt = false;
  telemetry::Registry* registry = nullptr;  // where sluice_stream_* metrics go; may be null
};

struct LoaderStats {
  uint64_t samples = 0, bytes = 0;        // delivered to the caller
  uint64_t requests = 0, read_bytes = 0;  // sent to the store (coalesced ranges included)
  uint64_t throttled = 0;                 // Unavailable answers backed off
  uint64_t skipped_samples = 0;
  // Slices that were parts of a shuffle window larger than a slice (a shard larger than a
  // quarter of memory_bytes): each part reads the window's chunks again. The first slice,
  // about one block by design, is not counted.
  uint64_t window_parts = 0;
  double first_batch_seconds = 0;  // from construction to the first sample
  double stall_seconds = 0;        // the caller waited on data
  double elapsed_seconds = 0;      // since construction
};

class Loader {
 public:
  // Fails (in the first next()) with InvalidArgument on a bad token or partition.
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next sample; nullopt at the end of the last epoch.
  Result<std::optional<Sample>> next();
  // Up to `n` samples (fewer at the end of the last epoch; empty after it). Samples of
  // an epoch's end and the next epoch's start may share a batch.
  Result<std::vector<Sample>> next_batch(size_t n);

  // The resume token for what has been consumed so far (see the header comment).
  std::string state() const;
  LoaderStats stats() const;

  // The epoch order, for tests and tools: the dataset-wide sample number at `position` of
  // `epoch`.
  static uint64_t order_at(const Dataset& ds, uint64_t seed, uint64_t epoch, bool shuffle,
                           uint64_t window, uint64_t position);
  // The shuffle window a loader with these options uses (0: no shuffle): the options' own,
  // else the automatic one (resume tokens carry it).
  static uint64_t shuffle_window_for(const Dataset& ds, const LoaderOptions& options);
  // The memory_bytes at which, with the automatic window, no window is larger than a slice
  // (LoaderStats::window_parts stays 0): four times the largest shard.
  static uint64_t memory_for_whole_windows(const Dataset& ds);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A batch copied into a memory target: every field laid end to end, sample by sample, field
// by field; offsets[i] is where the i-th field starts (one more entry: the total).
struct TargetBatch {
  mem::Allocation memory;
  std::vector<uint64_t> offsets;
};
// Copies a batch into memory of `target` (host, or device memory through the target's
// pinned staging buffers), and returns once the copies are done.
Result<TargetBatch> copy_batch(std::span<const Sample> batch, mem::Target& target);

// A resume token's parts, for tools (`sluice dataset read --resume`). Format:
// docs/dataset.md, "Resume tokens".
struct ResumePoint {
  uint64_t epoch = 0, position = 0, samples = 0, fingerprint = 0, seed = 0;
  uint64_t window = 0;  // the shuffle window; 0: not shuffled
  // The dataset's content identity (Dataset::identity); v3 tokens carry it, older ones do
  // not (0 when parsed from one).
  uint64_t identity = 0;
  // The form the token was parsed from: 1 (no checksum), 2 (no identity) or 3. make_token
  // writes v3 whatever this says.
  unsigned version = 3;
};
Result<ResumePoint> parse_token(std::string_view token);
std::string make_token(const ResumePoint& point);

}  // namespace sluice::stream
