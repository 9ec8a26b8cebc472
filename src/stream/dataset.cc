// Dataset: the listing and sample tables of a dataset; see stream/dataset.h.
#include "sluice/stream/dataset.h"

#include <xxhash.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "core/parallel.h"
#include "sluice/core/fd.h"
#include "sluice/stream/pack.h"
#include "sluice/stream/tar.h"
#include "stream/backoff.h"
#include "stream/catalog.h"

namespace sluice::stream {
namespace {

// Scans a shard's tar headers through the store, reading it in large windows.
Result<std::vector<TarSample>> scan_shard(store::Store& store, const store::ObjectInfo& info) {
  constexpr size_t kWindow = size_t{8} << 20;
  std::vector<std::byte> buf;
  uint64_t buf_off = 0;
  store::ReadOptions ro{.if_match = info.etag, .object_size = info.size};
  ByteSource source = [&](uint64_t off, size_t n) -> Result<std::span<const std::byte>> {
    if (off < buf_off || off + n > buf_off + buf.size()) {
      buf.resize(std::min<uint64_t>(std::max(n, kWindow), info.size - std::min(off, info.size)));
      SLUICE_ASSIGN_OR_RETURN(
          size_t got,
          retry_unavailable([&] { return store.read_full(info.key, off, buf, ro); }, [] {}));
      buf.resize(got);
      buf_off = off;
    }
    uint64_t rel = off - buf_off;
    return std::span<const std::byte>(buf).subspan(rel, std::min<uint64_t>(n, buf.size() - rel));
  };
  return parse_tar(source, 0, info.size, info.key);
}

// A shard's etag as the content identity takes it. A local file's etag is
// "<dev>-<inode>-<size>-<mtime>-<ctime>" (docs/stores.md): the device differs on each node
// that mounts the same shared file system, the inode on a copy (files staged to each node's
// disk), the ctime on a chmod. The identity takes the size and mtime: what a rewrite
// changes (with the sample table's keys and ranges beside it).
std::string_view content_etag(std::string_view etag, bool local_file) {
  if (!local_file || std::count(etag.begin(), etag.end(), '-') != 4) return etag;
  const size_t size_at = etag.find('-', etag.find('-') + 1) + 1;
  return etag.substr(size_at, etag.rfind('-') - size_at);
}

// Lists the prefix and learns each shard's samples (from its index, or by scanning it).
Result<Catalog> build_catalog(store::Store& store, const std::string& prefix,
                              const DatasetOptions& options) {
  std::vector<store::SkippedKey> left_out;
  SLUICE_ASSIGN_OR_RETURN(auto listing, retry_unavailable(
                                            [&] {
                                              left_out.clear();
                                              return store.list_all(prefix, &left_out);
                                            },
                                            [] {}));
  if (listing.empty())
    return fail(Code::kNotFound, "dataset " + store.uri() + " prefix '" + prefix + "': no objects");
  // The listing is untrusted: a key outside the prefix asked for is a broken store.
  for (const auto& o : listing)
    if (!o.key.starts_with(prefix) || o.key.size() == prefix.size())
      return fail(Code::kCorruption, "dataset " + store.uri() + ": the listing of '" + prefix +
                                         "' holds '" + o.key + "', which is outside it");
  // What `sluice gc run` moved to the trash is not part of the dataset any more.
  std::erase_if(listing, [&](const store::ObjectInfo& o) {
    std::string_view rel = std::string_view(o.key).substr(prefix.size());
    return rel.starts_with(".sluice-trash/") ||
           rel.find("/.sluice-trash/") != std::string_view::npos;
  });
  // The completion record of a packed dataset is not one of its objects.
  const std::string completion_key = prefix + std::string(kCompletionKey);
  std::optional<store::ObjectInfo> completion;
  std::erase_if(listing, [&](const store::ObjectInfo& o) {
    if (o.key != completion_key) return false;
    completion = o;
    return true;
  });
  if (listing.empty())
    return fail(Code::kNotFound, "dataset " + store.uri() + " prefix '" + prefix + "': no objects");
  std::vector<const store::ObjectInfo*> tars;
  std::unordered_map<std::string, const store::ObjectInfo*> by_key;
  bool other = false;
  for (const auto& o : listing) by_key[o.key] = &o;
  // An index decides nothing about the format, not even one whose shard is gone: a stray
  // ".tar.idx" must not turn a tar dataset into plain objects.
  for (const auto& o : listing) {
    if (o.key.ends_with(".tar"))
      tars.push_back(&o);
    else if (!o.key.ends_with(".tar" + std::string(kIndexSuffix)))
      other = true;
  }
  Format format = options.format;
  if (format == Format::kAuto) format = !tars.empty() && !other ? Format::kTar : Format::kObjects;
  Catalog c;
  c.left_out = std::move(left_out);
  c.tar = format == Format::kTar;
  if (!c.tar) {
    c.objects = std::move(listing);
    return c;
  }
  if (tars.empty())
    return fail(Code::kNotFound,
                "dataset " + store.uri() + " prefix '" + prefix + "': no .tar shards");
  c.tables.resize(tars.size());
  auto load = [&](size_t i) -> Status {
    const auto& info = *tars[i];
    auto& table = c.tables[i];
    auto idx = by_key.find(info.key + std::string(kIndexSuffix));
    if (idx != by_key.end()) {
      auto index = [&]() -> Result<ShardIndex> {
        if (idx->second->size > kMaxIndexBytes)
          return fail(Code::kCorruption, "shard index " + idx->first + " is too large");
        SLUICE_ASSIGN_OR_RETURN(auto bytes,
                                retry_unavailable([&] { return store.get(idx->first); }, [] {}));
        SLUICE_ASSIGN_OR_RETURN(auto decoded, decode_index(bytes, idx->first));
        if (decoded.shard_size != info.size)
          return fail(Code::kCorruption, "shard index " + idx->first + " was written for " +
                                             std::to_string(decoded.shard_size) +
                                             " bytes; the shard has " + std::to_string(info.size) +
                                             " (repack it, or delete the index)");
        return decoded;
      }();
      if (index) {
        table.samples = std::move(index->samples);
        table.indexed = true;
        return ok();
      }
      // With skip_corrupt a bad index is only advice lost: the shard is scanned instead.
      if (!options.skip_corrupt || index.error().code() != Code::kCorruption)
        return std::unexpected(index.error());
    }
    auto samples = scan_shard(store, info);
    if (!samples) {
      if (options.skip_corrupt && samples.error().code() == Code::kCorruption) {
        table.skipped = true;
        return ok();
      }
      return std::unexpected(samples.error());
    }
    for (auto& s : *samples) table.samples.push_back({std::move(s.key), s.offset, s.length});
    return ok();
  };
  SLUICE_RETURN_IF_ERROR(parallel_for(tars.size(), std::max(1u, options.inflight), load));
  for (const auto* t : tars) c.objects.push_back(*t);
  // A dataset a packer wrote is whole only once its record says so, and only as the record
  // describes it; one without a record was not written by a packer.
  if (!completion) return c;
  const std::string where = "dataset " + store.uri() + " prefix '" + prefix + "'";
  if (completion->size > 256)
    return fail(Code::kCorruption, where + ": its completion record is too large");
  SLUICE_ASSIGN_OR_RETURN(auto text,
                          retry_unavailable([&] { return store.get(completion->key); }, [] {}));
  SLUICE_ASSIGN_OR_RETURN(
      PackSummary sum,
      decode_completion(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                        completion->key));
  if (!sum.complete)
    return fail(Code::kCorruption,
                where +
                    " is not complete: its pack did not finish (killed?), or is still "
                    "running; pack the source again into an empty prefix");
  uint64_t samples = 0, bytes = 0;
  bool skipped = false;
  for (size_t i = 0; i < tars.size(); ++i) {
    samples += c.tables[i].samples.size();
    bytes += tars[i]->size;
    skipped |= c.tables[i].skipped;
  }
  if (sum.shards != tars.size() || (!skipped && (sum.samples != samples || sum.bytes != bytes)))
    return fail(Code::kCorruption,
                where + " holds " + std::to_string(tars.size()) + " shards, " +
                    std::to_string(samples) + " samples, " + std::to_string(bytes) +
                    " bytes; its completion record says " + std::to_string(sum.shards) + ", " +
                    std::to_string(sum.samples) + ", " + std::to_string(sum.bytes) +
                    ": shards were added, lost or replaced since it was packed");
  return c;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// The catalog from the node's catalog directory when a fresh one is there, else built and
// written there. Workers of a node opening the same dataset at once take turns on a lock:
// one builds, the others then read what it wrote.
Result<Catalog> node_catalog(store::Store& store, const std::string& prefix,
                             const DatasetOptions& options, bool& reused) {
  reused = false;
  std::string identity = (options.store_id.empty() ? store.identity() : options.store_id) + "\n" +
                         prefix + "\n" + std::to_string(static_cast<int>(options.format)) +
                         (options.skip_corrupt ? "\nskip" : "");
  std::string base =
      options.catalog_dir + "/" + hex64(XXH3_64bits(identity.data(), identity.size()));
  std::error_code ec;
  std::filesystem::create_directories(options.catalog_dir, ec);
  if (ec)
    return fail_errno(ec.value(), "create the dataset catalog directory " + options.catalog_dir);
  UniqueFd lock(::open((base + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) return fail_errno(errno, "open " + base + ".lock");
  while (::flock(lock.get(), LOCK_EX) != 0)
    if (errno != EINTR) return fail_errno(errno, "lock " + base + ".lock");
  const std::string path = base + ".catalog";
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      st.st_size < static_cast<off_t>(kMaxIndexBytes) &&
      std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime) <
          options.catalog_ttl) {
    std::ifstream in(path, std::ios::binary);
    std::vector<std::byte> bytes(static_cast<size_t>(st.st_size));
    if (in.read(reinterpret_cast<char*>(bytes.data()), st.st_size)) {
      auto c = decode_catalog(bytes, identity, path);
      if (c) {
        reused = true;
        return c;
      }  // a damaged or foreign catalog is rebuilt below
    }
  }
  SLUICE_ASSIGN_OR_RETURN(Catalog c, build_catalog(store, prefix, options));
  // Best effort: a catalog that cannot be written only costs the next open a listing.
  auto bytes = encode_catalog(c, identity);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
  }
  return c;
}

}  // namespace

uint64_t Dataset::identity() const {
  // The layout's walk with each shard's etag and sample table, folded a shard at a time
  // (each shard's hash seeded with the one before) rather than built as one string of every
  // sample. Keys count from the prefix: the location is not content.
  std::call_once(identity_once_, [this] {
    const bool local = store_->uri().find("file://") != std::string::npos;
    uint64_t identity = 0;
    std::string part;
    for (const auto& s : shards_) {
      part.assign(std::string_view(s.key).substr(prefix_.size()));
      part += '\0' + std::to_string(s.size) + '\0' + std::string(content_etag(s.etag, local)) +
              '\0' + std::to_string(s.samples) + '\n';
      for (uint64_t n = s.first; n < s.first + s.samples; ++n) {
        const SampleRef& r = samples_[n];
        part += keys_[n] + '\0' + std::to_string(r.offset) + ':' + std::to_string(r.length) + '\n';
      }
      identity = XXH3_64bits_withSeed(part.data(), part.size(), identity);
    }
    identity_ = identity;
  });
  return identity_;
}

Result<std::shared_ptr<Dataset>> Dataset::open(std::shared_ptr<store::Store> store,
                                               std::string prefix, DatasetOptions options) {
  if (!store) return fail(Code::kInvalidArgument, "dataset: no store");
  auto ds = std::shared_ptr<Dataset>(new Dataset());
  Catalog cat;
  if (options.catalog_dir.empty()) {
    SLUICE_ASSIGN_OR_RETURN(cat, build_catalog(*store, prefix, options));
  } else {
    SLUICE_ASSIGN_OR_RETURN(cat, node_catalog(*store, prefix, options, ds->from_catalog_));
  }
  ds->left_out_ = std::move(cat.left_out);
  ds->store_ = std::move(store);
  ds->prefix_ = prefix;
  ds->options_ = options;
  const Format format = cat.tar ? Format::kTar : Format::kObjects;
  ds->format_ = format;
  if (cat.tar) {
    for (size_t i = 0; i < cat.objects.size(); ++i) {
      const auto& info = cat.objects[i];
      auto& table = cat.tables[i];
      if (table.skipped) {
        ++ds->skipped_shards_;
        continue;
      }
      ShardInfo si{info.key,     info.size, info.etag, ds->samples_.size(), table.samples.size(),
                   table.indexed};
      uint32_t shard = static_cast<uint32_t>(ds->shards_.size());
      for (auto& e : table.samples) {
        ds->samples_.push_back(SampleRef{shard, 1, e.offset, e.length});
        ds->keys_.push_back(std::move(e.key));
      }
      ds->bytes_ += info.size;
      ds->shards_.push_back(std::move(si));
    }
  } else {
    // One sample per key: every object of a basename is a field of it (wherever the
    // listing put it), in key order; "__" basenames are metadata, as in shards.
    std::map<std::string, std::vector<const store::ObjectInfo*>> by_sample;
    std::string key, field;
    for (const auto& o : cat.objects) {
      std::string_view rel = std::string_view(o.key).substr(prefix.size());
      size_t slash = rel.rfind('/');
      if (rel.substr(slash == std::string_view::npos ? 0 : slash + 1).starts_with("__")) continue;
      if (!split_sample_name(rel, key, field)) key.assign(rel);
      by_sample[key].push_back(&o);
    }
    for (auto& [sample_key, objects] : by_sample) {
      uint32_t shard = static_cast<uint32_t>(ds->shards_.size());
      SampleRef ref{shard, static_cast<uint32_t>(objects.size()), 0, 0};
      for (size_t i = 0; i < objects.size(); ++i) {
        const auto* o = objects[i];
        // The sample's first object carries it (samples = 1); its other fields none.
        ds->shards_.push_back(
            ShardInfo{o->key, o->size, o->etag, ds->samples_.size(), i == 0 ? 1u : 0u, false});
        ref.length += o->size;
        ds->bytes_ += o->size;
      }
      ds->samples_.push_back(ref);
      ds->keys_.push_back(sample_key);
    }
  }
  // The fingerprint covers what the order depends on: the format, and each shard's key,
  // size and sample count.
  std::string layout(1, format == Format::kTar ? 't' : 'o');
  for (const auto& s : ds->shards_)
    layout += s.key + '\0' + std::to_string(s.size) + ':' + std::to_string(s.samples) + '\n';
  ds->fingerprint_ = XXH3_64bits(layout.data(), layout.size());
  for (size_t n = 1; n < ds->samples_.size() && ds->numbered_in_place_; ++n) {
    const SampleRef &x = ds->samples_[n - 1], &y = ds->samples_[n];
    ds->numbered_in_place_ = std::tie(x.shard, x.offset) < std::tie(y.shard, y.offset);
  }
  if (ds->samples_.empty())
    return fail(Code::kNotFound,
                "dataset " + ds->store_->uri() + " prefix '" + prefix + "': no samples");
  if (ds->samples_.size() > (uint64_t{1} << 40))
    return fail(Code::kInvalidArgument, "dataset: too many samples");
  return ds;
}

}  // namespace sluice::stream
