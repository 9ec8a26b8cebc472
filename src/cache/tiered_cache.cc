// TieredCache: a read goes chunk by chunk to the RAM tier, the NVMe tier, then (one fill
// per chunk at a time) the backing store; see tiered_cache.h for the contract. This file:
// opening a cache, what it knows of objects, the Store methods, stats.
#include "cache/tiered_cache_impl.h"

#include <fcntl.h>

#include "sluice/io/file_handle.h"
#include "sluice/store/wrapper.h"

namespace sluice::cache {

namespace {

std::function<bool(const ChunkKey&)> key_is(std::string store, std::string key) {
  return [store = std::move(store), key = std::move(key)](const ChunkKey& c) {
    return c.store == store && c.key == key;
  };
}

}  // namespace

TieredCache::Impl::Impl(std::unique_ptr<store::Store> b, CacheOptions o)
    : backing(std::move(b)),
      options(std::move(o)),
      store_id(options.store_id.empty() ? backing->identity() : options.store_id),
      own_registry(options.registry ? nullptr : std::make_unique<telemetry::Registry>()),
      registry(options.registry ? options.registry : own_registry.get()),
      m(*registry),
      // Enough idle buffers to recycle a full NVMe write queue, and a prefaulted RAM tier's
      // buffers: fresh memory is slow to touch.
      pool(round_up(options.chunk_size),
           base_idle() + (options.prefault_ram ? options.ram_bytes / options.chunk_size : 0)),
      ram(std::make_unique<RamTier>(options.ram_bytes, options.policy, &m.ram_evictions)) {}

void TieredCache::Impl::prefault_ram() {
  const auto start = std::chrono::steady_clock::now();
  auto added = pool.reserve(options.ram_bytes / options.chunk_size, pf_quit);
  if (!options.prefaulted || pf_quit) return;  // closing: nothing to say
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!added) {
    options.prefaulted(0, took,
                       Status(std::unexpected(added.error().with_context(
                           "cache: allocating the RAM tier's buffers"))));
  } else {
    options.prefaulted(*added * pool.buffer_size(), took, ok());
  }
}

TieredCache::Impl::~Impl() {
  pf_quit = true;
  if (prefaulter.joinable()) prefaulter.join();
  {
    MutexLock lock(wq_mu);  // a prefetcher waiting for write room sees pf_quit
  }
  wq_room.notify_all();
  {
    MutexLock lock(pf_mu);
    pf_stopping = true;
  }
  pf_cv.notify_all();
  for (std::thread& t : prefetchers) t.join();
  {
    MutexLock lock(wq_mu);
    stopping = true;
  }
  wq_cv.notify_all();
  if (writer.joinable()) writer.join();
}

// Keeps `meta` within max_objects: past it, forgets the longest-unchecked eighth (those
// restored unchecked first), but never an object with a chunk waiting for its NVMe write
// (the write checks the version against `meta`) or the one just learned. Called with
// meta_mu held; `busy` are those keys (the queue's taken before meta_mu).
void TieredCache::Impl::bound_meta(const std::unordered_set<std::string_view>& busy) {
  // Offline, what the cache knows cannot be asked again: it is kept whole.
  if (options.offline || meta.size() <= options.max_objects) return;
  using It = decltype(meta)::iterator;
  std::vector<It> all;
  all.reserve(meta.size());
  for (It it = meta.begin(); it != meta.end(); ++it) {
    if (!busy.contains(it->first)) all.push_back(it);
  }
  size_t n = std::min(all.size(), meta.size() - options.max_objects + options.max_objects / 8);
  auto older = [](const It& a, const It& b) { return a->second.checked < b->second.checked; };
  std::nth_element(all.begin(), all.begin() + n, all.end(), older);
  for (size_t i = 0; i < n; ++i) meta.erase(all[i]);
}

// The keys with a chunk in the NVMe write queue, when `meta` is about to outgrow its
// bound; empty otherwise (the common case costs no walk of the queue).
std::unordered_set<std::string_view> TieredCache::Impl::busy_keys(
    std::vector<std::shared_ptr<const Chunk>>& hold) {
  std::unordered_set<std::string_view> busy;
  {
    MutexLock lock(meta_mu);
    if (meta.size() < options.max_objects) return busy;
  }
  MutexLock lock(wq_mu);
  hold.assign(wq.begin(), wq.end());  // keeps the strings the views point at alive
  for (const std::shared_ptr<const Chunk>& c : hold) busy.insert(c->key.key);
  return busy;
}

// Records what the backing store says an object is; drops chunks of another version.
void TieredCache::Impl::learn(const store::ObjectInfo& info) {
  bool changed = false;
  std::vector<std::shared_ptr<const Chunk>> hold;
  std::unordered_set<std::string_view> busy = busy_keys(hold);
  {
    MutexLock lock(meta_mu);
    auto it = meta.find(info.key);
    if (it == meta.end()) {
      meta.emplace(info.key, ObjectMeta{info, Clock::now()});
      busy.insert(info.key);  // about to be read, and its chunks queued
      bound_meta(busy);
      return;
    }
    changed = it->second.info.etag != info.etag;
    it->second = ObjectMeta{info, Clock::now()};
  }
  if (!changed) return;
  auto old = [&](const ChunkKey& c) {
    return c.store == store_id && c.key == info.key && c.etag != info.etag;
  };
  uint64_t n = ram->drop_if(old) + (disk ? disk->drop_if(old) : 0);
  m.stale.add(n);
}

bool TieredCache::Impl::current_version(const ChunkKey& key) {
  MutexLock lock(meta_mu);
  auto it = meta.find(key.key);
  return it != meta.end() && it->second.info.etag == key.etag;
}

// Forgets an object entirely (written or removed through the cache, or gone).
uint64_t TieredCache::Impl::forget(const std::string& key) {
  {
    MutexLock lock(meta_mu);
    meta.erase(key);
  }
  auto match = key_is(store_id, key);
  return ram->drop_if(match) + (disk ? disk->drop_if(match) : 0);
}

// What the cache believes `key` is now, revalidated when older than revalidate_after.
Result<store::ObjectInfo> TieredCache::Impl::current(std::string_view key, bool force) {
  {
    MutexLock lock(meta_mu);
    auto it = meta.find(key);
    if (it != meta.end() && !force) {
      const ObjectMeta& om = it->second;
      if (options.offline ||
          (om.checked && Clock::now() - *om.checked < options.revalidate_after)) {
        return om.info;
      }
    }
  }
  auto st = backing->stat(key);
  if (!st) {
    if (st.error().code() == Code::kNotFound) m.stale.add(forget(std::string(key)));
    return st;
  }
  learn(*st);
  return st;
}

// Seeds what the cache knows of objects from the NVMe tier's records, unchecked.
void TieredCache::Impl::restore_meta() {
  if (!disk) return;
  MutexLock lock(meta_mu);
  for (const DiskTier::Entry& e : disk->entries()) {
    if (e.key.store != store_id) continue;
    store::ObjectInfo info{e.key.key, e.object_size, e.object_mtime_ns, e.key.etag};
    meta.try_emplace(e.key.key, ObjectMeta{info, std::nullopt});
    bound_meta({});  // nothing is queued yet
  }
}

namespace {

// A Writer through the cache: once it commits, the cached copy of the key is dropped.
class InvalidatingWriter final : public store::Writer {
 public:
  InvalidatingWriter(std::unique_ptr<store::Writer> w, TieredCache::Impl& cache, std::string key)
      : w_(std::move(w)), cache_(cache), key_(std::move(key)) {}
  Status append(std::span<const std::byte> data) override { return w_->append(data); }
  Status commit() override {
    Status s = w_->commit();
    cache_.m.stale.add(cache_.forget(key_));
    return s;
  }
  void abort() override { w_->abort(); }
  uint64_t size() const override { return w_->size(); }
  bool positional() const override { return w_->positional(); }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    return w_->write_at(offset, data);
  }

 private:
  std::unique_ptr<store::Writer> w_;
  TieredCache::Impl& cache_;
  std::string key_;
};

}  // namespace

Result<uint64_t> chunk_size_for(const CacheOptions& options) {
  if (options.chunk_size != 0) return options.chunk_size;
  std::optional<uint64_t> recorded;
  if (!options.directory.empty()) {
    SLUICE_ASSIGN_OR_RETURN(recorded, DiskTier::recorded_chunk_size(options.directory));
  }
  return recorded.value_or(kDefaultChunkSize);
}

Result<std::unique_ptr<TieredCache>> TieredCache::open(std::unique_ptr<store::Store> backing,
                                                       CacheOptions options) {
  if (!backing) return fail(Code::kInvalidArgument, "cache: no backing store");
  SLUICE_ASSIGN_OR_RETURN(options.chunk_size, chunk_size_for(options));
  if (options.chunk_size < (64 << 10) || options.chunk_size > (1ULL << 30)) {
    return fail(Code::kInvalidArgument, "cache: chunk size " + std::to_string(options.chunk_size) +
                                            " is outside 64 KiB to 1 GiB");
  }
  if (options.max_objects == 0) return fail(Code::kInvalidArgument, "cache: max_objects is 0");
  auto impl = std::make_unique<Impl>(std::move(backing), std::move(options));
  CacheOptions& o = impl->options;
  if (!o.directory.empty()) {
    if (!o.io) {
      SLUICE_ASSIGN_OR_RETURN(o.io, io::Context::open({}));
    }
    DiskTier::Options d{o.directory, o.disk_bytes, o.chunk_size,
                        o.policy,    o.io,         &impl->m.disk_evictions};
    if (o.admit_chunk)
      d.admit = [f = o.admit_chunk](const ChunkKey& k, uint64_t b) { return f(k.store, k.key, b); };
    if (o.chunk_adopted)
      d.adopt = [f = o.chunk_adopted](const ChunkKey& k, uint64_t b) {
        return f(k.store, k.key, b);
      };
    d.freed = o.chunk_freed;
    SLUICE_ASSIGN_OR_RETURN(impl->disk, DiskTier::open(std::move(d)));
    impl->restore_meta();
    impl->load_pins();
    impl->writer = std::thread([p = impl.get()] { p->write_loop(); });
  }
  if (o.prefault_ram && o.ram_bytes >= o.chunk_size)
    impl->prefaulter = std::thread([p = impl.get()] { p->prefault_ram(); });
  return std::unique_ptr<TieredCache>(new TieredCache(std::move(impl)));
}

TieredCache::TieredCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TieredCache::~TieredCache() = default;

Result<store::ObjectInfo> TieredCache::stat(std::string_view key) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  return impl_->current(key, false);
}

Result<size_t> TieredCache::read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                                 const store::ReadOptions& options) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  for (int attempt = 0;; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(key, attempt > 0));
    if (!options.if_match.empty() && options.if_match != info.etag) {
      return fail(Code::kConflict, "'" + std::string(key) + "' changed: etag " + info.etag +
                                       ", not " + options.if_match);
    }
    if (options.object_size && *options.object_size != info.size && attempt == 0) continue;
    Result<size_t> r = impl_->read_version(info, offset, dst, options.split);
    // The object changed under the read: start over once on the version there now.
    if (!r && r.error().code() == Code::kConflict && attempt == 0 && options.if_match.empty()) {
      continue;
    }
    return r;
  }
}

Result<std::unique_ptr<store::Writer>> TieredCache::create(std::string_view key,
                                                           const store::WriteOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<store::Writer> w, impl_->backing->create(key, options));
  return std::unique_ptr<store::Writer>(
      std::make_unique<InvalidatingWriter>(std::move(w), *impl_, std::string(key)));
}

Result<store::ListPage> TieredCache::list(const store::ListOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(store::ListPage page, impl_->backing->list(options));
  for (const store::ObjectInfo& o : page.objects) impl_->learn(o);  // a listing revalidates
  return page;
}

Status TieredCache::remove(std::string_view key) {
  Status s = impl_->backing->remove(key);
  if (store::validate_key(key)) impl_->m.stale.add(impl_->forget(std::string(key)));
  return s;
}

std::string TieredCache::uri() const {
  return "cache+" + impl_->backing->uri();
}

std::string TieredCache::identity() const {
  return "cache+" + impl_->backing->identity();
}

void* TieredCache::find_capability(const std::type_info& type) {
  if (type == typeid(ReadAhead)) return static_cast<ReadAhead*>(this);
  if (type == typeid(TieredCache)) return this;
  return nullptr;  // not the backing store's: what it offers is not offered through a cache
}

uint64_t TieredCache::chunk_size() const {
  return impl_->options.chunk_size;
}

bool TieredCache::keeps_chunks() const {
  // Room for the chunks a slice's reads are in at once, and then some: a RAM tier of one or
  // two chunks would drop each before its other parts came.
  return impl_->options.ram_bytes >= 16 * impl_->options.chunk_size;
}

Result<std::optional<ChunkExtent>> TieredCache::locate(std::string_view key, uint64_t offset,
                                                       std::string_view etag) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  if (!impl_->disk) return std::optional<ChunkExtent>();
  SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(key, false));
  if (offset >= info.size || (!etag.empty() && etag != info.etag))
    return std::optional<ChunkExtent>();
  uint64_t index = offset / impl_->options.chunk_size;
  const ChunkKey chunk{impl_->store_id, info.key, info.etag, index};
  std::optional<DiskTier::Entry> e = impl_->disk->find(chunk);
  const uint64_t start = index * impl_->options.chunk_size;
  if (!e || e->length != std::min(impl_->options.chunk_size, info.size - start))
    return std::optional<ChunkExtent>();
  ChunkExtent x;
  x.path = impl_->disk->path_of(e->file_id);
  x.fd.reset(::open(x.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!x.fd.valid()) return std::optional<ChunkExtent>();  // evicted just now
  // The caller reads it from there: a hit of the NVMe tier, and a prefetched chunk is used
  // (and frees its budget).
  impl_->settle_prefetch(chunk, true);
  impl_->m.disk_hits.add();
  impl_->m.disk_hit_bytes.add(e->length);
  x.file_offset = DiskTier::offset_of(e->file_id);
  x.length = e->length;
  x.object_offset = index * impl_->options.chunk_size;
  x.xxh3 = e->xxh3;
  x.etag = info.etag;
  return std::optional<ChunkExtent>(std::move(x));
}

CacheStats TieredCache::stats() const {
  const Impl& i = *impl_;
  CacheStats s;
  s.ram = TierStats{i.ram->bytes(), i.ram->capacity(), i.ram->chunk_count(), i.m.ram_hits.value(),
                    i.m.ram_hit_bytes.value()};
  if (i.disk) {
    s.disk = TierStats{i.disk->bytes(), i.disk->capacity(), i.disk->chunk_count(),
                       i.m.disk_hits.value(), i.m.disk_hit_bytes.value()};
    s.io_path = i.disk->io_path();
  }
  s.misses = i.m.misses.value();
  s.miss_bytes = i.m.miss_bytes.value();
  s.evictions = i.m.ram_evictions.value() + i.m.disk_evictions.value();
  s.checksum_failures = i.m.checksum_failures.value();
  s.stale_drops = i.m.stale.value();
  s.singleflight_joins = i.m.joins.value();
  s.disk_writes_skipped = i.m.disk_skipped.value();
  s.prefetched = i.m.prefetched.value();
  s.prefetch_hits = i.m.prefetch_hits.value();
  s.prefetch_wasted = i.m.prefetch_wasted.value();
  {
    MutexLock lock(i.meta_mu);
    s.objects_known = i.meta.size();
  }
  s.directory = i.options.directory;
  s.policy = std::string(policy_name(i.options.policy));
  return s;
}

const CacheOptions& TieredCache::options() const {
  return impl_->options;
}

void register_scheme() {
  for (const std::string& scheme : store::registered_schemes()) {
    if (scheme.starts_with("cache+")) continue;
    store::register_scheme(
        "cache+" + scheme,
        [](std::string_view uri,
           const store::StoreOptions& so) -> Result<std::unique_ptr<store::Store>> {
          std::string_view inner = uri.substr(6);  // after "cache+"
          SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> backing,
                                  store::open_store(inner, so));
          const CacheOptions* co = so.backend.get<CacheOptions>();
          CacheOptions o = co ? *co : CacheOptions{};
          if (!o.registry) o.registry = so.registry;
          SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<TieredCache> c,
                                  TieredCache::open(std::move(backing), o));
          return std::unique_ptr<store::Store>(std::move(c));
        });
  }
}

}  // namespace sluice::cache
