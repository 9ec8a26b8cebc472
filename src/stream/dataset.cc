// Dataset: the listing and sample tables of a dataset; see stream/dataset.h.
#include "sluice/stream/dataset.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "sluice/stream/tar.h"
#include "stream/backoff.h"

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

// Runs fn(i) for i in [0, n) on up to `threads` threads; the first error wins.
Status parallel_for(size_t n, unsigned threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::optional<Error> first;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      auto st = fn(i);
      if (!st) {
        std::lock_guard lock(mu);
        if (!first) first = st.error();
        next.store(n);
      }
    }
  };
  std::vector<std::jthread> pool;
  for (unsigned t = 1; t < std::min<size_t>(threads, n); ++t) pool.emplace_back(work);
  work();
  pool.clear();
  if (first) return std::unexpected(*first);
  return ok();
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.ends_with(suffix);
}

}  // namespace

Result<std::shared_ptr<Dataset>> Dataset::open(std::shared_ptr<store::Store> store,
                                               std::string prefix, DatasetOptions options) {
  if (!store) return fail(Code::kInvalidArgument, "dataset: no store");
  SLUICE_ASSIGN_OR_RETURN(auto listing,
                          retry_unavailable([&] { return store->list_all(prefix); }, [] {}));
  auto ds = std::shared_ptr<Dataset>(new Dataset());
  ds->store_ = std::move(store);
  ds->prefix_ = prefix;
  ds->options_ = options;

  std::vector<const store::ObjectInfo*> tars;
  std::unordered_map<std::string, const store::ObjectInfo*> by_key;
  bool other = false;
  for (const auto& o : listing) by_key[o.key] = &o;
  for (const auto& o : listing) {
    if (ends_with(o.key, ".tar"))
      tars.push_back(&o);
    else if (!(ends_with(o.key, kIndexSuffix) &&
               by_key.contains(o.key.substr(0, o.key.size() - kIndexSuffix.size()))))
      other = true;
  }
  Format format = options.format;
  if (format == Format::kAuto) format = !tars.empty() && !other ? Format::kTar : Format::kObjects;
  ds->format_ = format;
  if (listing.empty())
    return fail(Code::kNotFound,
                "dataset " + ds->store_->uri() + " prefix '" + prefix + "': no objects");

  if (format == Format::kTar) {
    if (tars.empty())
      return fail(Code::kNotFound,
                  "dataset " + ds->store_->uri() + " prefix '" + prefix + "': no .tar shards");
    std::vector<std::vector<ShardIndex::Entry>> tables(tars.size());
    std::vector<bool> indexed(tars.size()), skipped(tars.size());
    auto load = [&](size_t i) -> Status {
      const auto& info = *tars[i];
      auto idx = by_key.find(info.key + std::string(kIndexSuffix));
      if (idx != by_key.end()) {
        if (idx->second->size > kMaxIndexBytes)
          return fail(Code::kCorruption, "shard index " + idx->first + " is too large");
        SLUICE_ASSIGN_OR_RETURN(
            auto bytes, retry_unavailable([&] { return ds->store_->get(idx->first); }, [] {}));
        SLUICE_ASSIGN_OR_RETURN(auto index, decode_index(bytes, idx->first));
        if (index.shard_size != info.size)
          return fail(Code::kCorruption, "shard index " + idx->first + " was written for " +
                                             std::to_string(index.shard_size) +
                                             " bytes; the shard has " + std::to_string(info.size) +
                                             " (repack it, or delete the index)");
        tables[i] = std::move(index.samples);
        indexed[i] = true;
        return ok();
      }
      auto samples = scan_shard(*ds->store_, info);
      if (!samples) {
        if (options.skip_corrupt && samples.error().code() == Code::kCorruption) {
          skipped[i] = true;
          return ok();
        }
        return std::unexpected(samples.error());
      }
      for (auto& s : *samples) tables[i].push_back({std::move(s.key), s.offset, s.length});
      return ok();
    };
    SLUICE_RETURN_IF_ERROR(parallel_for(tars.size(), std::max(1u, options.inflight), load));
    for (size_t i = 0; i < tars.size(); ++i) {
      const auto& info = *tars[i];
      if (skipped[i]) {
        ++ds->skipped_shards_;
        continue;
      }
      ShardInfo si{info.key,         info.size, info.etag, ds->samples_.size(),
                   tables[i].size(), indexed[i]};
      uint32_t shard = static_cast<uint32_t>(ds->shards_.size());
      for (auto& e : tables[i]) {
        ds->samples_.push_back(SampleRef{shard, 1, e.offset, e.length});
        ds->keys_.push_back(std::move(e.key));
      }
      ds->bytes_ += info.size;
      ds->shards_.push_back(std::move(si));
    }
  } else {
    // One sample per basename: consecutive objects with the same key are its fields.
    std::string key, field;
    for (const auto& o : listing) {
      std::string_view rel = std::string_view(o.key).substr(prefix.size());
      if (!split_sample_name(rel, key, field)) key.assign(rel);
      uint32_t shard = static_cast<uint32_t>(ds->shards_.size());
      ds->shards_.push_back(ShardInfo{o.key, o.size, o.etag, ds->samples_.size(), 1, false});
      if (!ds->keys_.empty() && ds->keys_.back() == key) {
        auto& s = ds->samples_.back();
        ++s.objects;
        s.length += o.size;
        ds->shards_.back().first = ds->samples_.size() - 1;
        ds->shards_.back().samples = 0;  // a further field of the sample before
      } else {
        ds->samples_.push_back(SampleRef{shard, 1, 0, o.size});
        ds->keys_.push_back(key);
      }
      ds->bytes_ += o.size;
    }
  }
  // The fingerprint covers what the order depends on: the format, and each shard's key,
  // size and sample count.
  std::string layout(1, format == Format::kTar ? 't' : 'o');
  for (const auto& s : ds->shards_)
    layout += s.key + '\0' + std::to_string(s.size) + ':' + std::to_string(s.samples) + '\n';
  ds->fingerprint_ = XXH3_64bits(layout.data(), layout.size());
  if (ds->samples_.empty())
    return fail(Code::kNotFound,
                "dataset " + ds->store_->uri() + " prefix '" + prefix + "': no samples");
  if (ds->samples_.size() > (uint64_t{1} << 40))
    return fail(Code::kInvalidArgument, "dataset: too many samples");
  return ds;
}

}  // namespace sluice::stream
