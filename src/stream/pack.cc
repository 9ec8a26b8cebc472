// ShardPacker: samples into tar shards with indexes; see stream/pack.h.
#include "sluice/stream/pack.h"

#include <cstdio>

namespace sluice::stream {

ShardPacker::ShardPacker(store::Store& store, std::string prefix, PackOptions options)
    : store_(store), prefix_(std::move(prefix)), options_(std::move(options)) {}

ShardPacker::~ShardPacker() {
  if (writer_) writer_->abort();
}

Status ShardPacker::open_shard() {
  char name[64];
  std::snprintf(name, sizeof name, "-%06llu.tar", static_cast<unsigned long long>(shards_));
  key_ = prefix_ + options_.name + name;
  SLUICE_ASSIGN_OR_RETURN(writer_, store_.create(key_, {.overwrite = false}));
  tar_.emplace([this](std::span<const std::byte> b) { return writer_->append(b); });
  index_ = {};
  return ok();
}

Status ShardPacker::close_shard() {
  SLUICE_RETURN_IF_ERROR(tar_->finish());
  index_.shard_size = tar_->bytes();
  if (auto c = writer_->commit(); !c)
    return std::unexpected(c.error().with_context("commit " + key_));
  writer_.reset();
  bytes_ += tar_->bytes();
  tar_.reset();
  ++shards_;
  return store_.put(key_ + std::string(kIndexSuffix), encode_index(index_), {.overwrite = false});
}

Status ShardPacker::add(std::string_view key, std::span<const PackFile> files) {
  if (failed_) return fail(Code::kCancelled, "packer: an earlier add failed");
  auto st = [&]() -> Status {
    std::string k, field;
    uint64_t need = 0;
    for (const auto& f : files) {
      if (!split_sample_name(f.name, k, field) || k != key)
        return fail(Code::kInvalidArgument, "pack: file '" + std::string(f.name) +
                                                "' is not a field of sample '" + std::string(key) +
                                                "'");
      need += tar_file_bytes(f.name, f.data.size());
    }
    if (files.empty())
      return fail(Code::kInvalidArgument, "pack: sample '" + std::string(key) + "' has no files");
    // Two zero blocks end the archive.
    if (tar_ && !index_.samples.empty() &&
        tar_->bytes() + need + 2 * kTarBlock > options_.shard_bytes)
      SLUICE_RETURN_IF_ERROR(close_shard());
    if (!tar_) SLUICE_RETURN_IF_ERROR(open_shard());
    uint64_t start = tar_->bytes();
    for (const auto& f : files)
      if (auto added = tar_->add(f.name, f.data); !added)
        return std::unexpected(added.error().with_context("write " + key_));
    index_.samples.push_back({std::string(key), start, tar_->bytes() - start});
    ++samples_;
    return ok();
  }();
  if (!st) {
    failed_ = true;
    if (writer_) writer_->abort();
  }
  return st;
}

Status ShardPacker::finish() {
  if (failed_) return fail(Code::kCancelled, "packer: an earlier add failed");
  if (!tar_) return ok();
  auto st = close_shard();
  if (!st) {
    failed_ = true;
    if (writer_) writer_->abort();
  }
  return st;
}

}  // namespace sluice::stream
