// ShardPacker: samples into tar shards with indexes; see stream/pack.h.
#include "sluice/stream/pack.h"

#include <charconv>
#include <cstdio>

#include "sluice/core/hash.h"

namespace sluice::stream {

std::string encode_completion(const PackSummary& s) {
  std::string body = std::string("sluice-dataset 1 ") + (s.complete ? "complete " : "packing ") +
                     std::to_string(s.shards) + " " + std::to_string(s.samples) + " " +
                     std::to_string(s.bytes);
  return body + " " + xxh3_hex(body) + "\n";
}

Result<PackSummary> decode_completion(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kCorruption, "completion record " + std::string(what) + " " +
                                       std::string(why) + ": the pack may not have finished");
  };
  if (text.size() > 256 || !text.ends_with('\n')) return bad("is malformed");
  text.remove_suffix(1);
  const size_t sp = text.rfind(' ');
  if (sp == std::string_view::npos || text.size() - sp - 1 != 16) return bad("is malformed");
  if (text.substr(sp + 1) != xxh3_hex(text.substr(0, sp))) return bad("fails its checksum");
  std::string_view rest = text.substr(0, sp);
  if (!rest.starts_with("sluice-dataset 1 ")) return bad("is of an unknown format or version");
  rest.remove_prefix(17);
  PackSummary out;
  if (rest.starts_with("complete "))
    out.complete = true;
  else if (!rest.starts_with("packing "))
    return bad("is malformed");
  rest.remove_prefix(out.complete ? 9 : 8);
  uint64_t v[3];
  for (int i = 0; i < 3; ++i) {
    const size_t end = i < 2 ? rest.find(' ') : rest.size();
    if (end == std::string_view::npos || end == 0) return bad("is malformed");
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + end, v[i]);
    if (ec != std::errc{} || p != rest.data() + end) return bad("is malformed");
    rest.remove_prefix(std::min(rest.size(), end + 1));
  }
  out.shards = v[0];
  out.samples = v[1];
  out.bytes = v[2];
  return out;
}

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
  if (!begun_) {  // before the first shard is published: it is never taken for a dataset
    const std::string record = encode_completion({});
    SLUICE_RETURN_IF_ERROR(store_.put(prefix_ + std::string(kCompletionKey),
                                      std::as_bytes(std::span(record)), {.overwrite = false}));
    begun_ = true;
  }
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
  auto st = tar_ ? close_shard() : ok();
  if (st) {
    const std::string record = encode_completion({true, shards_, samples_, bytes_});
    st = store_.put(prefix_ + std::string(kCompletionKey), std::as_bytes(std::span(record)));
  }
  if (!st) {
    failed_ = true;
    if (writer_) writer_->abort();
  }
  return st;
}

}  // namespace sluice::stream
