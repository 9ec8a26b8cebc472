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
// whole and indexed, and nothing half-written is left.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

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

class ShardPacker {
 public:
  ShardPacker(store::Store& store, std::string prefix, PackOptions options = {});
  ~ShardPacker();
  ShardPacker(const ShardPacker&) = delete;
  ShardPacker& operator=(const ShardPacker&) = delete;

  // Appends one sample; its files' names must give `key` (split_sample_name).
  Status add(std::string_view key, std::span<const PackFile> files);
  // Publishes the open shard and its index.
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
};

}  // namespace sluice::stream
