// sluice/stream/pack.h: writing a dataset as WebDataset tar shards with their indexes.
//
//   ShardPacker packer(store, "datasets/train/", {.shard_bytes = 256_MiB});
//   packer.add("0001", {{"0001.jpg", jpeg}, {"0001.cls", label}});
//   ...
//   packer.finish();
//
// Samples are appended to the open shard ("<prefix><name>-000000.tar") until the next one
// would take it past `shard_bytes` (a sample larger than that gets a shard of its own); a
// sample never spans two shards. Each shard is published (Writer::commit) when it is full,
// then its index ("<shard>.idx", tar.h) beside it, both without overwriting. A packer that
// fails or is destroyed before finish() aborts the open shard: every published shard is
// whole and indexed, and nothing half-written is left. Before it publishes its first shard
// the packer writes the dataset's record ("<prefix>.sluice-dataset", without overwriting: one pack
// per prefix) saying it is being packed; finish() rewrites it, last, as complete with the shards,
// samples and bytes. A reader refuses a dataset whose record is not complete, or does not match
// what it finds, so a pack that was killed never passes for a whole dataset. (A dataset without a
// record was not written by a packer: read as it is.)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/store/store.h"
#include "sluice/stream/tar.h"

namespace sluice::stream {

struct PackOptions {
  uint64_t shard_bytes = uint64_t{256} << 20;
  std::string name = "shard";
};

// One file of a sample: its name in the archive ("0001.jpg") and bytes.
struct PackFile {
  std::string_view name;
  std::span<const std::byte> data;
};

// The record of a packed dataset, under its prefix; its text is
// "sluice-dataset 1 <packing|complete> <shards> <samples> <bytes> <XXH3-64 of the text
// before it, 16 hex>\n" (docs/formats/shard-index.md).
inline constexpr std::string_view kCompletionKey = ".sluice-dataset";
struct PackSummary {
  bool complete = false;
  uint64_t shards = 0, samples = 0, bytes = 0;
};
std::string encode_completion(const PackSummary& summary);
// Corruption naming `what` for anything but a whole, well-formed record.
Result<PackSummary> decode_completion(std::string_view text, std::string_view what);

class ShardPacker {
 public:
  ShardPacker(store::Store& store, std::string prefix, PackOptions options = {});
  ~ShardPacker();
  ShardPacker(const ShardPacker&) = delete;
  ShardPacker& operator=(const ShardPacker&) = delete;

  // Appends one sample; its files' names must give `key` (split_sample_name).
  Status add(std::string_view key, std::span<const PackFile> files);
  // Publishes the open shard and its index, then the completion record.
  Status finish();

  uint64_t shards() const { return shards_; }
  uint64_t samples() const { return samples_; }
  uint64_t bytes() const { return bytes_; }  // of published shards

 private:
  Status open_shard();
  Status close_shard();
  store::Store& store_;
  std::string prefix_;
  PackOptions options_;
  std::unique_ptr<store::Writer> writer_;
  std::optional<TarWriter> tar_;
  ShardIndex index_;
  std::string key_;  // the open shard's
  uint64_t shards_ = 0, samples_ = 0, bytes_ = 0;
  bool failed_ = false;
  bool begun_ = false;  // the "packing" record is written
};

// Packing a directory of sample files (`sluice dataset pack`): every regular file under it
// named NAME.EXT (split_sample_name) is a field of sample NAME; samples go in key order,
// each sample's files in name order.
struct SampleFiles {
  struct File {
    std::string rel;  // the path below the directory
    uint64_t size = 0;
  };
  std::string directory;
  std::map<std::string, std::vector<File>> samples;  // by sample key
  uint64_t files = 0, bytes = 0;
  uint64_t skipped = 0;  // regular files that are not sample files
};
// NotFound for what is not a directory, or holds no sample file.
Result<SampleFiles> find_sample_files(const std::string& directory);

struct PackDirectoryOptions {
  PackOptions pack;
  std::string destination;  // names the destination in messages (default: the store's URI)
  const std::atomic<bool>* cancel = nullptr;  // set: stops before the next sample (kCancelled)
  std::function<void(uint64_t samples_done, uint64_t samples, uint64_t bytes)> on_progress;
};

struct PackReport {
  uint64_t shards = 0, samples = 0;
  uint64_t files = 0, file_bytes = 0;  // the sample files packed
  uint64_t shard_bytes = 0;            // of the shards published
  uint64_t skipped_files = 0;          // not sample files
};

// Packs the files into `prefix` of `store`, which must hold nothing under it (a dataset is
// everything under its prefix: AlreadyExists). Conflict for a file that changes while it is
// packed. A pack that fails after it published shards says so: that dataset is incomplete.
Result<PackReport> pack_directory(const SampleFiles& files, store::Store& store, std::string prefix,
                                  const PackDirectoryOptions& options);

}  // namespace sluice::stream
