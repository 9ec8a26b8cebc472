// The embedded cache's control plane (sluice/cache/control.h).
#include "sluice/cache/control.h"

#include <limits>
#include <map>

namespace sluice::cache {

namespace {

// The source of a cache opened only to look after its directory (status, a listing of every
// store, verify): every call says there is none.
class NoBackingStore final : public store::Store {
 public:
  Result<store::ObjectInfo> stat(std::string_view key) override { return none(key); }
  Result<size_t> read(std::string_view key, uint64_t, std::span<std::byte>,
                      const store::ReadOptions&) override {
    return none(key);
  }
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions&) override {
    return none(key);
  }
  Result<store::ListPage> list(const store::ListOptions& o) override { return none(o.prefix); }
  Status remove(std::string_view key) override { return none(key); }
  std::string uri() const override { return "none://"; }

 private:
  static std::unexpected<Error> none(std::string_view key) {
    return fail(Code::kUnavailable,
                "'" + std::string(key) + "': the cache directory was opened without its source");
  }
};

}  // namespace

DirectoryControl::DirectoryControl(CacheOptions options, OpenStore open_store)
    : options_(std::move(options)), open_store_(std::move(open_store)) {}

DirectoryControl::~DirectoryControl() = default;

Result<std::shared_ptr<TieredCache>> DirectoryControl::open(std::string_view store_uri) {
  MutexLock lock(mu_);
  if (cache_ && open_uri_ == store_uri) return cache_;
  if (cache_ && cache_.use_count() > 1)
    return fail(Code::kUnavailable,
                "the cache directory " + options_.directory + " is held open for " +
                    (open_uri_.empty() ? std::string("looking") : open_uri_) +
                    " by a store still in use; it cannot be opened for " +
                    (store_uri.empty() ? std::string("looking") : std::string(store_uri)));
  cache_.reset();  // the directory's lock is released before it is taken again
  CacheOptions o = options_;
  std::unique_ptr<store::Store> backing;
  if (store_uri.empty()) {
    o.ram_bytes = 0;
    // Looking must not evict: a directory filled under a larger size keeps it all.
    o.disk_bytes = std::numeric_limits<uint64_t>::max() / 2;
    o.store_id = "none://";
    backing = std::make_unique<NoBackingStore>();
  } else {
    SLUICE_ASSIGN_OR_RETURN(backing, open_store_(std::string(store_uri)));
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<TieredCache> c,
                          TieredCache::open(std::move(backing), std::move(o)));
  cache_ = std::move(c);
  open_uri_ = std::string(store_uri);
  return cache_;
}

Result<ControlStatus> DirectoryControl::status() {
  SLUICE_ASSIGN_OR_RETURN(auto c, open(""));
  ControlStatus st{c->stats(), std::nullopt};
  // Opened only to look, the tier has no limit; the one its readers keep it within is this.
  st.stats.disk.capacity = options_.disk_bytes;
  return st;
}

Result<ChunkListing> DirectoryControl::chunks(std::string_view store_uri, std::string_view prefix) {
  SLUICE_ASSIGN_OR_RETURN(auto c, open(store_uri));
  return ChunkListing{c->chunks(prefix, store_uri.empty()), false};
}

Result<Warmed> DirectoryControl::warm(std::string_view store_uri, std::string_view key,
                                      uint64_t offset, uint64_t length) {
  if (store_uri.empty()) return fail(Code::kInvalidArgument, "warm: no store named");
  SLUICE_ASSIGN_OR_RETURN(auto c, open(store_uri));
  SLUICE_ASSIGN_OR_RETURN(TieredCache::Warmed w, c->warm(key, offset, length));
  return Warmed{w.info.size, w.end, w.fetched, w.not_kept, w.info.etag};
}

Result<uint64_t> DirectoryControl::evict(std::string_view store_uri, std::string_view prefix) {
  if (store_uri.empty()) return fail(Code::kInvalidArgument, "evict: no store named");
  SLUICE_ASSIGN_OR_RETURN(auto c, open(store_uri));
  return c->evict(prefix);
}

Result<uint64_t> DirectoryControl::pin(std::string_view store_uri, std::string_view prefix,
                                       bool pinned) {
  if (store_uri.empty()) return fail(Code::kInvalidArgument, "pin: no store named");
  SLUICE_ASSIGN_OR_RETURN(auto c, open(store_uri));
  return c->pin(prefix, pinned);
}

Result<VerifyReport> DirectoryControl::verify() {
  SLUICE_ASSIGN_OR_RETURN(auto c, open(""));
  return c->verify();
}

Result<std::shared_ptr<store::Store>> DirectoryControl::store(std::string_view store_uri) {
  if (store_uri.empty()) return fail(Code::kInvalidArgument, "no store named");
  SLUICE_ASSIGN_OR_RETURN(auto c, open(store_uri));
  return std::shared_ptr<store::Store>(std::move(c));
}

std::vector<StoreHolding> holdings_by_store(const std::vector<CachedChunk>& chunks) {
  std::map<std::string, std::pair<StoreHolding, std::string>> by_store;  // with its last key
  for (const CachedChunk& c : chunks) {
    auto& [h, last_key] = by_store[c.store];
    h.store = c.store;
    ++h.chunks;
    h.bytes += c.length;
    h.pinned_chunks += c.pinned;
    if (h.objects == 0 || c.key != last_key) ++h.objects, last_key = c.key;
  }
  std::vector<StoreHolding> out;
  for (auto& [_, held] : by_store) out.push_back(std::move(held.first));
  return out;
}

}  // namespace sluice::cache
