// ShardPacker: samples into tar shards with indexes; see stream/pack.h.
#include "sluice/stream/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "sluice/core/fd.h"
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

namespace {

// A file's bytes, which must still be the size it was listed at.
Result<std::vector<std::byte>> read_file(const std::string& path, uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return fail_errno(errno, "open " + path);
  std::vector<std::byte> data(size);
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd.get(), data.data() + got, size - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read " + path);
    if (n == 0) return fail(Code::kConflict, path + " shrank while it was packed");
    got += static_cast<size_t>(n);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat " + path);
  if (static_cast<uint64_t>(st.st_size) != size)
    return fail(Code::kConflict, path + " changed size while it was packed (" +
                                     std::to_string(size) + " bytes when listed, " +
                                     std::to_string(st.st_size) + " now)");
  return data;
}

}  // namespace

Result<SampleFiles> find_sample_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return fail(Code::kNotFound, "pack: " + dir + " is not a directory");
  SampleFiles t;
  t.directory = dir;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    std::string rel = fs::relative(it->path(), dir, ec).generic_string();
    std::string key, field;
    if (!split_sample_name(rel, key, field)) {
      ++t.skipped;
      continue;
    }
    uint64_t size = it->file_size(ec);
    if (ec) break;
    t.samples[key].push_back({rel, size});
    t.bytes += size;
    ++t.files;
  }
  if (ec) return fail_errno(ec.value(), "walk " + dir);
  if (t.samples.empty())
    return fail(Code::kNotFound,
                "pack: no sample files under " + dir + " (a sample file is NAME.EXT)");
  for (auto& [key, fields] : t.samples)
    std::sort(fields.begin(), fields.end(),
              [](const SampleFiles::File& x, const SampleFiles::File& y) { return x.rel < y.rel; });
  return t;
}

Result<PackReport> pack_directory(const SampleFiles& tree, store::Store& store, std::string prefix,
                                  const PackDirectoryOptions& o) {
  const std::string dest = o.destination.empty() ? store.uri() : o.destination;
  // A dataset is everything under its prefix: packing into a used one would mix datasets.
  SLUICE_ASSIGN_OR_RETURN(store::ListPage existing,
                          store.list(store::ListOptions{.prefix = prefix, .max_keys = 1}));
  if (!existing.objects.empty())
    return fail(Code::kAlreadyExists, "pack: " + dest + " already holds objects (" +
                                          existing.objects.front().key +
                                          "); pack into an empty prefix");
  ShardPacker packer(store, prefix, o.pack);
  uint64_t packed_bytes = 0;
  auto pack_all = [&]() -> Status {
    std::vector<std::vector<std::byte>> data;
    std::vector<PackFile> parts;
    for (const auto& [key, fields] : tree.samples) {
      if (o.cancel && o.cancel->load()) return fail(Code::kCancelled, "pack interrupted");
      data.clear();
      parts.clear();
      for (const auto& f : fields) {
        SLUICE_ASSIGN_OR_RETURN(auto bytes, read_file(tree.directory + "/" + f.rel, f.size));
        data.push_back(std::move(bytes));
        packed_bytes += f.size;
      }
      for (size_t i = 0; i < fields.size(); ++i) parts.push_back({fields[i].rel, data[i]});
      SLUICE_RETURN_IF_ERROR(packer.add(key, parts));
      if (o.on_progress) o.on_progress(packer.samples(), tree.samples.size(), packed_bytes);
    }
    return packer.finish();
  };
  if (Status done = pack_all(); !done) {
    if (packer.shards() == 0) return std::unexpected(done.error());
    return std::unexpected(done.error().with_context(
        "pack published " + std::to_string(packer.shards()) + " whole shards (" +
        std::to_string(packer.samples()) + " samples) under " + dest +
        " before it failed: that dataset is incomplete; remove it and pack again"));
  }
  return PackReport{packer.shards(), packer.samples(), tree.files,
                    tree.bytes,      packer.bytes(),   tree.skipped};
}

}  // namespace sluice::stream
