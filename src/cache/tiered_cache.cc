// TieredCache: a read goes chunk by chunk to the RAM tier, the NVMe tier, then (one fill
// per chunk at a time) the backing store; see tiered_cache.h for the contract.
#include "sluice/cache/tiered_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <thread>
#include <unordered_set>

#include "cache/disk_tier.h"
#include "cache/ram_tier.h"
#include "sluice/core/fd.h"
#include "sluice/io/file_handle.h"
#include "sluice/store/serving_peer.h"
#include "sluice/store/wrapper.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cache {

namespace {

using Clock = std::chrono::steady_clock;
using ChunkResult = Result<std::shared_ptr<const Chunk>>;

struct ObjectMeta {
  store::ObjectInfo info;
  std::optional<Clock::time_point> checked;  // last stat or listing; none: restored
};

// A fill in progress: the first miss on a chunk reads it, later ones wait here.
struct Flight {
  ChunkKey key;
  std::shared_future<ChunkResult> result;
};

struct Metrics {
  explicit Metrics(telemetry::Registry& r)
      : ram_hits(r.counter("sluice_cache_hits_total", {{"tier", "ram"}},
                           "Chunk reads served by a tier")),
        disk_hits(r.counter("sluice_cache_hits_total", {{"tier", "disk"}})),
        ram_hit_bytes(
            r.counter("sluice_cache_hit_bytes_total", {{"tier", "ram"}}, "Bytes served by a tier")),
        disk_hit_bytes(r.counter("sluice_cache_hit_bytes_total", {{"tier", "disk"}})),
        misses(r.counter("sluice_cache_misses_total", {}, "Chunk reads sent to the backing store")),
        miss_bytes(
            r.counter("sluice_cache_miss_bytes_total", {}, "Bytes read from the backing store")),
        ram_evictions(r.counter("sluice_cache_evictions_total",
                                {{"tier", "ram"}, {"reason", "capacity"}},
                                "Chunks dropped from a tier, by reason")),
        disk_evictions(
            r.counter("sluice_cache_evictions_total", {{"tier", "disk"}, {"reason", "capacity"}})),
        stale(r.counter("sluice_cache_evictions_total", {{"tier", "any"}, {"reason", "stale"}})),
        corrupt(
            r.counter("sluice_cache_evictions_total", {{"tier", "disk"}, {"reason", "corrupt"}})),
        commanded(
            r.counter("sluice_cache_evictions_total", {{"tier", "any"}, {"reason", "command"}})),
        checksum_failures(r.counter("sluice_cache_checksum_failures_total", {},
                                    "NVMe chunks whose checksum did not match")),
        joins(r.counter("sluice_cache_singleflight_joins_total", {},
                        "Misses that waited for another reader's fill")),
        disk_skipped(r.counter("sluice_cache_disk_writes_skipped_total", {},
                               "Fills not written to NVMe: write queue full or write failed")),
        prefetched(r.counter("sluice_cache_prefetched_total", {},
                             "Chunks fetched ahead of a declared read")),
        prefetch_hits(r.counter("sluice_cache_prefetch_hits_total", {},
                                "Prefetched chunks later read from a tier")),
        prefetch_wasted(r.counter("sluice_cache_prefetch_wasted_total", {},
                                  "Prefetched chunks evicted or skipped before their read")),
        fill_ns(r.histogram("sluice_cache_fill_seconds", {},
                            "Time to fill a chunk from the backing store", 1e-9)) {}
  telemetry::Counter &ram_hits, &disk_hits, &ram_hit_bytes, &disk_hit_bytes, &misses, &miss_bytes;
  telemetry::Counter &ram_evictions, &disk_evictions, &stale, &corrupt, &commanded;
  telemetry::Counter &checksum_failures, &joins, &disk_skipped;
  telemetry::Counter &prefetched, &prefetch_hits, &prefetch_wasted;
  telemetry::Histogram& fill_ns;
};

std::function<bool(const ChunkKey&)> key_is(std::string store, std::string key) {
  return [store = std::move(store), key = std::move(key)](const ChunkKey& c) {
    return c.store == store && c.key == key;
  };
}

std::function<bool(const ChunkKey&)> key_under(std::string store, std::string prefix) {
  return [store = std::move(store), prefix = std::move(prefix)](const ChunkKey& c) {
    return c.store == store && c.key.starts_with(prefix);
  };
}

}  // namespace

struct TieredCache::Impl {
  Impl(std::unique_ptr<store::Store> b, CacheOptions o)
      : backing(std::move(b)),
        options(std::move(o)),
        store_id(options.store_id.empty() ? backing->identity() : options.store_id),
        own_registry(options.registry ? nullptr : std::make_unique<telemetry::Registry>()),
        registry(options.registry ? options.registry : own_registry.get()),
        m(*registry),
        // Enough idle buffers to recycle a full NVMe write queue: fresh memory is slow to touch.
        pool(round_up(options.chunk_size),
             16 + options.disk_write_queue_bytes / options.chunk_size),
        ram(std::make_unique<RamTier>(options.ram_bytes, options.policy, &m.ram_evictions)) {}

  static size_t round_up(uint64_t n) { return static_cast<size_t>((n + 4095) & ~uint64_t{4095}); }

  std::unique_ptr<store::Store> backing;
  CacheOptions options;
  std::string store_id;  // options.store_id, or the backing store's identity()
  std::unique_ptr<telemetry::Registry> own_registry;
  telemetry::Registry* registry;
  Metrics m;
  BufferPool pool;  // full-size chunk buffers; declared before the tiers that hold them
  std::unique_ptr<RamTier> ram;
  std::unique_ptr<DiskTier> disk;

  std::mutex meta_mu;                                   // taken after wq_mu, never before it
  std::map<std::string, ObjectMeta, std::less<>> meta;  // guarded by meta_mu

  std::mutex flight_mu;
  std::unordered_map<ChunkId, std::shared_ptr<Flight>> flights;  // guarded by flight_mu

  std::mutex pins_file_mu;  // one writer of DIR/pins at a time; taken before pin_mu
  mutable std::mutex pin_mu;
  std::vector<std::string> pinned_prefixes;  // this store's; guarded by pin_mu
  std::vector<std::string> other_pins;       // other stores' lines of DIR/pins; pin_mu

  // NVMe writes happen behind fills, on one thread, so a cold read does not wait for them.
  std::mutex wq_mu;
  std::condition_variable wq_cv;
  std::condition_variable wq_room;              // a queued write finished
  std::deque<std::shared_ptr<const Chunk>> wq;  // guarded by wq_mu
  uint64_t wq_bytes = 0;                        // guarded by wq_mu
  uint64_t wq_reserved = 0;  // guarded by wq_mu; room prefetchers hold (wait_for_write_room)
  bool stopping = false;     // guarded by wq_mu
  std::thread writer;

  // Prefetch of declared reads. Chunks wait in `pf_queue` in declared order; threads fetch
  // them while the bytes fetched and not yet read (`pf_ahead`) stay within prefetch_bytes.
  // A read of a prefetched chunk releases it (a hit if a tier still had it, else waste) and
  // every one declared before it (skipped: waste), so an abandoned order cannot hold the
  // budget.
  struct Planned {
    store::ObjectInfo info;
    uint64_t index = 0;
    uint64_t position = 0;  // in the declared order
  };
  std::mutex pf_mu;
  std::condition_variable pf_cv;
  std::deque<Planned> pf_queue;  // guarded by pf_mu; at most kMaxQueuedPrefetch
  static constexpr size_t kMaxQueuedPrefetch = 4 * kMaxDeclaredChunks;
  struct Ahead {
    uint64_t position = 0, bytes = 0;
    bool fetching = true;  // its fill has not returned: a read now is a late hit
  };
  std::map<ChunkId, Ahead> pf_ahead_chunks;  // guarded by pf_mu
  // Where each queued chunk is in the declared order, and how far the reader has passed
  // (positions below pf_passed): a chunk the reader passed before a prefetcher took it is
  // not fetched (it was read already) and not counted as waste.
  std::map<ChunkId, uint64_t> pf_queued;  // guarded by pf_mu
  uint64_t pf_passed = 0;                 // guarded by pf_mu
  uint64_t pf_ahead = 0;                  // guarded by pf_mu
  uint64_t pf_position = 0;               // guarded by pf_mu
  bool pf_stopping = false;               // guarded by pf_mu
  // Set once anything is declared, so reads without prefetch skip pf_mu. Relaxed is enough:
  // a read that misses the flag just leaves its chunk to be settled by a later read.
  std::atomic<bool> pf_active{false};
  std::atomic<bool> pf_quit{false};  // set once, when the cache closes
  std::vector<std::thread> prefetchers;

  ~Impl() {
    pf_quit = true;
    {
      std::lock_guard lock(wq_mu);  // a prefetcher waiting for write room sees pf_quit
    }
    wq_room.notify_all();
    {
      std::lock_guard lock(pf_mu);
      pf_stopping = true;
    }
    pf_cv.notify_all();
    for (std::thread& t : prefetchers) t.join();
    {
      std::lock_guard lock(wq_mu);
      stopping = true;
    }
    wq_cv.notify_all();
    if (writer.joinable()) writer.join();
  }

  void start_prefetch(std::vector<Planned> planned) {
    if (options.prefetch_bytes == 0 || options.prefetch_threads == 0 || planned.empty()) return;
    {
      std::lock_guard lock(pf_mu);
      for (Planned& p : planned) {
        p.position = pf_position++;
        // The earliest position of a chunk declared twice (a later epoch): reading it then
        // passes only what came before its first place.
        pf_queued.try_emplace(ChunkKey{store_id, p.info.key, p.info.etag, p.index}.id(),
                              p.position);
        pf_queue.push_back(std::move(p));
      }
      // Declarations nobody reads (a killed job, a client of the daemon that only declares)
      // must not pile up: past the bound, the oldest planned chunks are forgotten.
      while (pf_queue.size() > kMaxQueuedPrefetch) {
        const Planned& old = pf_queue.front();
        auto q = pf_queued.find(ChunkKey{store_id, old.info.key, old.info.etag, old.index}.id());
        if (q != pf_queued.end() && q->second == old.position) pf_queued.erase(q);
        pf_queue.pop_front();
      }
      if (prefetchers.empty()) {
        for (unsigned i = 0; i < options.prefetch_threads; ++i) {
          prefetchers.emplace_back([this] { prefetch_loop(); });
        }
      }
    }
    pf_active = true;
    pf_cv.notify_all();
  }

  void prefetch_loop() {
    std::unique_lock lock(pf_mu);
    for (;;) {
      pf_cv.wait(lock, [&] {
        if (pf_stopping) return true;
        if (pf_queue.empty()) return false;
        if (pf_queue.front().position < pf_passed) return true;  // skipped below, no budget
        uint64_t len = chunk_length(pf_queue.front().info.size, pf_queue.front().index);
        return pf_ahead == 0 || pf_ahead + len <= options.prefetch_bytes;
      });
      if (pf_stopping) return;
      Planned p = std::move(pf_queue.front());
      pf_queue.pop_front();
      ChunkKey key{store_id, p.info.key, p.info.etag, p.index};
      if (auto q = pf_queued.find(key.id()); q != pf_queued.end() && q->second == p.position)
        pf_queued.erase(q);
      if (p.position < pf_passed) continue;  // the reader is past it: it read it already
      uint64_t len = chunk_length(p.info.size, p.index);
      if (ram->contains(key) || (disk && disk->contains(key)) ||
          pf_ahead_chunks.contains(key.id())) {
        continue;  // there already (or on its way): nothing to fetch
      }
      pf_ahead_chunks[key.id()] = Ahead{p.position, len, true};
      pf_ahead += len;
      lock.unlock();
      ChunkResult r = fail(Code::kCancelled, "the cache is closing");
      if (wait_for_write_room(len)) {
        r = fill(p.info, key, len);  // offers the chunk to both tiers
        release_write_room(len);
      }
      if (r) m.prefetched.add();
      lock.lock();
      if (!r) {
        release_locked(key.id());  // a failed prefetch holds nothing
      } else if (auto it = pf_ahead_chunks.find(key.id()); it != pf_ahead_chunks.end()) {
        it->second.fetching = false;
      }
    }
  }

  // Without a RAM tier a prefetched chunk lives only in the NVMe write queue until it is
  // written, and one the full queue refuses was fetched for nothing (and is fetched again
  // when read). So a prefetcher reserves room in the queue's first half before it fetches,
  // and waits for it: where the disk is slower than the network, the disk sets the pace. A
  // chunk larger than half the queue goes when the queue is empty. false: the cache is
  // closing (nothing reserved).
  bool wait_for_write_room(uint64_t len) {
    if (!disk || options.ram_bytes > 0) return true;
    const uint64_t need = round_up(len);
    std::unique_lock lock(wq_mu);
    wq_room.wait(lock, [&] {
      return stopping || pf_quit.load(std::memory_order_relaxed) || wq_bytes + wq_reserved == 0 ||
             wq_bytes + wq_reserved + need <= options.disk_write_queue_bytes / 2;
    });
    if (stopping || pf_quit.load(std::memory_order_relaxed)) return false;
    wq_reserved += need;
    return true;
  }
  // After the fill: its chunk is queued (counted in wq_bytes) or was not kept.
  void release_write_room(uint64_t len) {
    if (!disk || options.ram_bytes > 0) return;
    {
      std::lock_guard lock(wq_mu);
      wq_reserved -= round_up(len);
    }
    wq_room.notify_all();
  }

  void release_locked(ChunkId id) {
    auto it = pf_ahead_chunks.find(id);
    if (it == pf_ahead_chunks.end()) return;
    pf_ahead -= it->second.bytes;
    pf_ahead_chunks.erase(it);
  }

  // A read of chunk `id` (served from a tier: `hit`) settles its prefetch, if any, and
  // passes the declared chunks more than prefetch_reorder_chunks before it: those not
  // fetched yet never will be, those fetched and never read are waste and free their
  // budget (so an abandoned order cannot hold it, whoever reads next).
  void settle_prefetch(const ChunkKey& key, bool hit) {
    if (!pf_active.load(std::memory_order_relaxed)) return;  // no prefetch declared
    if (store::ServingPeer::active()) return;                // another node's read
    const ChunkId id = key.id();
    {
      std::lock_guard lock(pf_mu);
      std::optional<uint64_t> position;
      if (auto q = pf_queued.find(id); q != pf_queued.end())
        position = q->second;  // read before a prefetcher took it
      if (auto it = pf_ahead_chunks.find(id); it != pf_ahead_chunks.end()) {
        position = std::min(position.value_or(it->second.position), it->second.position);
        // Still being fetched: the read joins that fill. Fetched between the reader's miss
        // and now: the fill offered it to the tiers first, and the read takes it there.
        hit = hit || it->second.fetching || ram->contains(key) || (disk && disk->contains(key));
        (hit ? m.prefetch_hits : m.prefetch_wasted).add();
        release_locked(id);
      }
      if (!position) return;  // not declared
      const uint64_t slack = options.prefetch_reorder_chunks;
      const uint64_t passed = *position + 1 > slack ? *position + 1 - slack : 0;
      pf_passed = std::max(pf_passed, passed);
      for (auto j = pf_ahead_chunks.begin(); j != pf_ahead_chunks.end();) {
        if (j->second.position < passed) {  // declared well before this one and never read
          m.prefetch_wasted.add();
          pf_ahead -= j->second.bytes;
          j = pf_ahead_chunks.erase(j);
        } else {
          ++j;
        }
      }
    }
    pf_cv.notify_all();
  }

  // DIR/pins: one line per pinned prefix, "<store id>\t<prefix>", for every store.
  std::string pins_path() const { return options.directory + "/pins"; }

  void load_pins() {
    if (options.directory.empty()) return;
    std::ifstream in(pins_path());
    std::string line;
    std::lock_guard lock(pin_mu);
    while (std::getline(in, line)) {
      size_t tab = line.find('\t');
      if (tab == std::string::npos) continue;
      std::string store = line.substr(0, tab), prefix = line.substr(tab + 1);
      if (store == store_id) {
        pinned_prefixes.push_back(prefix);
      } else {
        other_pins.push_back(line);
      }
      // Every store's pins hold in the NVMe tier, whichever store this cache reads.
      if (disk) (void)disk->pin_if(key_under(store, prefix), true);
    }
  }

  // Writes DIR/pins from the pins now: one writer at a time (two at once interleaved their
  // bytes in pins.new), the state read under that writer's turn (so the file ends as the
  // last state), made durable before and after the rename.
  Status save_pins() {
    if (options.directory.empty()) return ok();
    std::lock_guard one_writer(pins_file_mu);
    std::string text;
    {
      std::lock_guard lock(pin_mu);
      for (const std::string& l : other_pins) text += l + "\n";
      for (const std::string& p : pinned_prefixes) text += store_id + "\t" + p + "\n";
    }
    std::string tmp = pins_path() + ".new";
    {
      UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (!fd.valid()) return fail_errno(errno, "create " + tmp);
      SLUICE_RETURN_IF_ERROR(write_full(fd.get(), std::as_bytes(std::span(text)), tmp));
      if (::fdatasync(fd.get()) != 0) return fail_errno(errno, "fdatasync " + tmp);
    }
    if (::rename(tmp.c_str(), pins_path().c_str()) != 0) return fail_errno(errno, "rename " + tmp);
    UniqueFd dir(::open(options.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return fail_errno(errno, "open " + options.directory);
    return sync_directory(dir.get(), options.directory);
  }

  bool pinned(const std::string& key) const {
    std::lock_guard lock(pin_mu);
    return std::any_of(pinned_prefixes.begin(), pinned_prefixes.end(),
                       [&](const std::string& p) { return key.starts_with(p); });
  }

  uint64_t chunk_length(uint64_t object_size, uint64_t index) const {
    uint64_t start = index * options.chunk_size;
    return std::min<uint64_t>(options.chunk_size, object_size - start);
  }

  // Keeps `meta` within max_objects: past it, forgets the longest-unchecked eighth (those
  // restored unchecked first), but never an object with a chunk waiting for its NVMe write
  // (the write checks the version against `meta`) or the one just learned. Called with
  // meta_mu held; `busy` are those keys (the queue's taken before meta_mu).
  void bound_meta(const std::unordered_set<std::string_view>& busy) {
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
  std::unordered_set<std::string_view> busy_keys(std::vector<std::shared_ptr<const Chunk>>& hold) {
    std::unordered_set<std::string_view> busy;
    {
      std::lock_guard lock(meta_mu);
      if (meta.size() < options.max_objects) return busy;
    }
    std::lock_guard lock(wq_mu);
    hold.assign(wq.begin(), wq.end());  // keeps the strings the views point at alive
    for (const std::shared_ptr<const Chunk>& c : hold) busy.insert(c->key.key);
    return busy;
  }

  // Records what the backing store says an object is; drops chunks of another version.
  void learn(const store::ObjectInfo& info) {
    bool changed = false;
    std::vector<std::shared_ptr<const Chunk>> hold;
    std::unordered_set<std::string_view> busy = busy_keys(hold);
    {
      std::lock_guard lock(meta_mu);
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

  bool current_version(const ChunkKey& key) {
    std::lock_guard lock(meta_mu);
    auto it = meta.find(key.key);
    return it != meta.end() && it->second.info.etag == key.etag;
  }

  // Forgets an object entirely (written or removed through the cache, or gone).
  uint64_t forget(const std::string& key) {
    {
      std::lock_guard lock(meta_mu);
      meta.erase(key);
    }
    auto match = key_is(store_id, key);
    return ram->drop_if(match) + (disk ? disk->drop_if(match) : 0);
  }

  // What the cache believes `key` is now, revalidated when older than revalidate_after.
  Result<store::ObjectInfo> current(std::string_view key, bool force) {
    {
      std::lock_guard lock(meta_mu);
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

  Result<std::shared_ptr<Chunk>> new_chunk(const ChunkKey& key, uint64_t length,
                                           const store::ObjectInfo& info) {
    auto c = std::make_shared<Chunk>();
    c->key = key;
    c->length = length;
    c->object_size = info.size;
    c->object_mtime_ns = info.mtime_ns;
    if (length == options.chunk_size) {
      SLUICE_ASSIGN_OR_RETURN(c->buf, pool.acquire());
    } else {  // a short last chunk or a small object: only what it needs
      SLUICE_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::allocate(round_up(length)));
      c->buf = PooledBuffer(nullptr, std::move(b));
    }
    return c;
  }

  void enqueue_disk_write(std::shared_ptr<const Chunk> c) {
    if (!disk) return;
    {
      std::lock_guard lock(wq_mu);
      // Counted as the memory it holds: a 1 KiB object's buffer is 4 KiB.
      if (stopping || wq_bytes + round_up(c->length) > options.disk_write_queue_bytes) {
        m.disk_skipped.add();
        return;
      }
      wq_bytes += round_up(c->length);
      wq.push_back(std::move(c));
    }
    wq_cv.notify_one();
  }

  void write_loop() {
    std::unique_lock lock(wq_mu);
    for (;;) {
      wq_cv.wait(lock, [&] { return stopping || !wq.empty(); });
      if (wq.empty()) return;  // stopping, and every queued write done
      // It stays queued (and readable by queued()) until it is on NVMe.
      std::shared_ptr<const Chunk> c = wq.front();
      lock.unlock();
      // A version dropped while its write waited is not written: the drop (forget, learn)
      // saw only the tiers, not this queue.
      store_on_disk(c->view());
      lock.lock();
      wq.pop_front();
      wq_bytes -= round_up(c->length);
      wq_room.notify_all();
    }
  }

  // Drops the queued NVMe writes of chunks that `match`, so an evict is not undone by writes
  // that were waiting; the one being written is waited for (the caller then drops it from
  // the NVMe tier). Returns the writes dropped.
  template <class Match>
  uint64_t drop_queued(const Match& match) {
    std::unique_lock lock(wq_mu);
    uint64_t n = 0;
    for (auto it = wq.empty() ? wq.end() : std::next(wq.begin()); it != wq.end();) {
      if (match((*it)->key)) {
        wq_bytes -= round_up((*it)->length);
        it = wq.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    if (n > 0) wq_room.notify_all();
    if (!wq.empty() && match(wq.front()->key)) {
      const std::shared_ptr<const Chunk> writing = wq.front();
      wq_room.wait(lock, [&] { return wq.empty() || wq.front() != writing; });
    }
    return n;
  }

  // Writes a chunk to NVMe unless its version was dropped meanwhile. Forget and learn change
  // the metadata before they drop chunks, so checking it before and after the write closes
  // the window; a drop during the write itself is caught by DiskTier::write (its entry is
  // gone).
  void store_on_disk(const ChunkView& v, uint64_t lane = 0) {
    if (!current_version(v.key)) {
      m.disk_skipped.add();  // its version dropped, or (rarely) forgotten by the bound
      return;
    }
    auto w = disk->write(v, pinned(v.key.key), lane);
    if (!w) m.disk_skipped.add();
    // Dropped between the check and the write's admission: drop it now.
    if (w && *w && !current_version(v.key)) {
      (void)disk->drop_if([&](const ChunkKey& k) { return k == v.key; });
    }
  }

  // A chunk filled and waiting for its NVMe write: without a RAM tier, the one place it is
  // between its fill and its write, and a reader then must not fetch it again.
  std::shared_ptr<const Chunk> queued(const ChunkKey& key) {
    std::lock_guard lock(wq_mu);
    for (const std::shared_ptr<const Chunk>& c : wq) {
      if (c->key == key) return c;
    }
    return nullptr;
  }

  std::unexpected<Error> ended_early(const store::ObjectInfo& info, uint64_t at) const {
    return fail(Code::kCorruption, "'" + info.key + "' in " + backing->uri() + " ended at byte " +
                                       std::to_string(at) + ", before its size " +
                                       std::to_string(info.size) + "; nothing cached");
  }

  // Reads one chunk from the backing store, pinned to the version in `info`.
  ChunkResult fetch(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length) {
    uint64_t t0 = telemetry::now_ns();
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Chunk> c, new_chunk(key, length, info));
    store::ReadOptions ro;
    ro.if_match = info.etag;
    ro.object_size = info.size;
    std::optional<uint64_t> hashed;  // by a backend that checked the bytes (a peer's chunk)
    ro.hooks.xxh3 = &hashed;
    auto dst = std::span<std::byte>(c->buf.data(), length);
    SLUICE_ASSIGN_OR_RETURN(size_t n,
                            backing->read_full(key.key, key.index * options.chunk_size, dst, ro));
    if (n != length) return ended_early(info, key.index * options.chunk_size + n);
    c->xxh3 = hashed ? *hashed : checksum(c->bytes());
    m.misses.add();
    m.miss_bytes.add(length);
    m.fill_ns.record(telemetry::now_ns() - t0);
    return std::shared_ptr<const Chunk>(std::move(c));
  }

  // The chunk from the backing store, with one fill per chunk at a time.
  ChunkResult fill(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length) {
    // Loops only when a fill it joined wrote the chunk through to NVMe (see below).
    for (;;) {
      ChunkId id = key.id();
      std::promise<ChunkResult> mine;
      std::shared_ptr<Flight> joined;
      {
        std::lock_guard lock(flight_mu);
        auto it = flights.find(id);
        if (it != flights.end() && it->second->key == key) {
          joined = it->second;
        } else if (it == flights.end()) {
          flights.emplace(id, std::make_shared<Flight>(Flight{key, mine.get_future().share()}));
        } else {
          return fetch(info, key, length);  // an id collision: no sharing, no caching risk
        }
      }
      if (joined) {
        m.joins.add();
        ChunkResult r = joined->result.get();
        // Null: the fill wrote the chunk to NVMe straight from its reader's buffer (or the
        // NVMe tier refused it): look again, in the tiers or with a fill of this reader's.
        if (r && !*r) continue;
        return r;
      }
      // A fill that ended between the caller's look at the tiers and this claim left the
      // chunk in a tier: take it from there rather than read the backing store again.
      Result<std::shared_ptr<const Chunk>> have = resident(info, key, length);
      if (have && *have) {
        mine.set_value(*have);
        std::lock_guard lock(flight_mu);
        flights.erase(id);
        return *have;
      }
      ChunkResult r = fetch(info, key, length);
      if (r) {
        bool pin = pinned(key.key);
        (void)ram->offer(*r, pin);  // the tiers decide whether to keep it
        enqueue_disk_write(*r);
      }
      mine.set_value(r);
      std::lock_guard lock(flight_mu);
      flights.erase(id);
      return r;
    }
  }

  // The whole chunk if a tier (or the NVMe write queue) holds it now; null if none does.
  Result<std::shared_ptr<const Chunk>> resident(const store::ObjectInfo& info, const ChunkKey& key,
                                                uint64_t length) {
    std::shared_ptr<const Chunk> c = ram->find(key);
    if (c || !disk) return c;
    if ((c = queued(key))) return c;
    std::optional<DiskTier::Entry> e = disk->find(key);
    if (!e || e->length != length) return c;
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Chunk> read, new_chunk(key, length, info));
    if (!disk->read(*e, std::span<std::byte>(read->buf.data(), length))) return c;
    read->xxh3 = e->xxh3;
    return std::shared_ptr<const Chunk>(std::move(read));
  }

  // From the NVMe tier into `out` (bytes [within, within + out.size()) of the chunk).
  // false: not there (or corrupt, now dropped): the caller goes to the backing store.
  Result<bool> from_disk(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length,
                         uint64_t within, std::span<std::byte> out) {
    if (!disk) return false;
    std::optional<DiskTier::Entry> e = disk->find(key);
    if (!e) return false;
    // A chunk cut at another chunk size (or a record that lies) never fills this buffer.
    if (e->length != length) {
      (void)disk->drop_if([&](const ChunkKey& k) { return k == key; });
      return false;
    }
    std::shared_ptr<Chunk> c;
    std::span<std::byte> into = out;
    bool whole = within == 0 && out.size() == length;
    if (!whole || options.ram_bytes > 0) {  // through a buffer the RAM tier can keep
      SLUICE_ASSIGN_OR_RETURN(c, new_chunk(key, length, info));
      into = std::span<std::byte>(c->buf.data(), length);
    }
    Status s = disk->read(*e, into);
    if (!s) {
      if (s.error().code() == Code::kCorruption) {
        m.checksum_failures.add();
        m.corrupt.add();
      }
      return false;  // evicted meanwhile, or corrupt and dropped: refetch
    }
    m.disk_hits.add();
    m.disk_hit_bytes.add(out.size());
    if (c) {
      c->xxh3 = e->xxh3;
      std::memcpy(out.data(), c->buf.data() + within, out.size());
      (void)ram->offer(std::move(c), pinned(key.key));
    }
    return true;
  }

  // From the RAM tier, else the NVMe tier; false when neither holds the chunk.
  Result<bool> from_tiers(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length,
                          uint64_t within, std::span<std::byte> out) {
    std::shared_ptr<const Chunk> c = ram->find(key);
    if (!c && disk) c = queued(key);
    if (c) {
      std::memcpy(out.data(), c->buf.data() + within, out.size());
      m.ram_hits.add();
      m.ram_hit_bytes.add(out.size());
      return true;
    }
    return from_disk(info, key, length, within, out);
  }

  // A run of whole chunks from `index` that no tier holds and no fill is reading, ending
  // before byte `end`: claimed (a flight each), so readers that want them wait for the
  // one backing read of the run. Empty when the first chunk is already being read.
  struct Claim {
    ChunkKey key;
    uint64_t length = 0;
    std::promise<ChunkResult> promise;
  };
  static constexpr uint64_t kMaxRunBytes = 64 << 20;

  std::vector<Claim> claim_run(const store::ObjectInfo& info, uint64_t index, uint64_t end) {
    std::vector<Claim> run;
    uint64_t bytes = 0;
    // How far the run may go within one fill group, found before the lock is taken (the
    // group may cost a hash per peer).
    uint64_t last = index;
    if (options.fill_group) {
      const uint64_t group = options.fill_group(info.key, index);
      const uint64_t max_chunks = std::max<uint64_t>(1, kMaxRunBytes / options.chunk_size);
      while (last + 1 < index + max_chunks &&
             (last + 1) * options.chunk_size < std::min(end, info.size) &&
             options.fill_group(info.key, last + 1) == group)
        ++last;
    } else {
      last = std::numeric_limits<uint64_t>::max();
    }
    std::lock_guard lock(flight_mu);  // then a tier's lock: never the other way round
    for (uint64_t i = index; i * options.chunk_size < info.size && i <= last; ++i) {
      uint64_t length = chunk_length(info.size, i);
      if (i * options.chunk_size + length > end || (i > index && bytes + length > kMaxRunBytes))
        break;
      ChunkKey key{store_id, info.key, info.etag, i};
      if (flights.contains(key.id())) break;
      // The first chunk too: its fill may have ended since the caller looked.
      if (resident_now(key)) break;
      Claim c{std::move(key), length, {}};
      flights.emplace(c.key.id(),
                      std::make_shared<Flight>(Flight{c.key, c.promise.get_future().share()}));
      run.push_back(std::move(c));
      bytes += length;
    }
    return run;
  }

  // A chunk the tiers can keep, copied from bytes just read. On failure (no memory) the read
  // still has its bytes; only waiters for this chunk see the error.
  ChunkResult copy_chunk(const ChunkKey& key, std::span<const std::byte> bytes,
                         const store::ObjectInfo& info) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Chunk> c, new_chunk(key, bytes.size(), info));
    c->xxh3 = copy_and_checksum(std::span<std::byte>(c->buf.data(), c->buf.size()), bytes);
    return std::shared_ptr<const Chunk>(std::move(c));
  }

  // The NVMe lane of the calling thread: readers on different threads append an object's
  // chunks to different segments (cp's parts never wait on one another's extending
  // writes), and one thread's runs share one. Lane 0 is the write-behind queue's.
  static uint64_t this_threads_lane() {
    static std::atomic<uint64_t> next{1};
    thread_local const uint64_t lane = next.fetch_add(1, std::memory_order_relaxed);
    return lane;
  }

  // Whether a chunk just read into a reader's buffer goes to NVMe from there, before the
  // read returns, rather than through a copy and the write queue: when no RAM tier would
  // keep the copy (the CLI's embedded cache) and the bytes start 4 KiB-aligned (O_DIRECT).
  // The copy into fresh memory cost more than the write's wait where reads run in parallel.
  bool write_through(std::span<const std::byte> bytes) const {
    return disk && options.ram_bytes == 0 && reinterpret_cast<uintptr_t>(bytes.data()) % 4096 == 0;
  }

  // A chunk of a run written to NVMe while the run's backing read still streams in.
  struct Early {
    bool begun = false;  // admission asked (once): a refusal is final for this fill
    std::optional<DiskTier::Pending> pending;
    Status put = ok();
  };

  // Writes the chunks of a run whose bytes have landed (the backing read's on_landed):
  // without it every chunk of a run waited for the whole run, and since parallel reads of
  // one server tend to finish together, the disk then sat idle through the downloads and
  // the downloads through the disk writes. A retry that lands from its start again is
  // written again; nothing is recorded here: fill_run finishes each chunk once the read has
  // succeeded, after checking that what was written is what the read returned.
  void write_landed(const store::ObjectInfo& info, std::vector<Claim>& run,
                    std::span<const std::byte> out, std::vector<Early>& early, uint64_t start,
                    uint64_t end, size_t& next, uint64_t& pos) {
    if (end < start + pos) {  // a retry: the bytes written so far arrive again
      next = 0;
      pos = 0;
    }
    for (; next < run.size() && start + pos + run[next].length <= end; ++next) {
      Claim& c = run[next];
      Early& e = early[next];
      std::span<const std::byte> bytes = out.subspan(pos, c.length);
      pos += c.length;
      if (!e.begun) {
        e.begun = true;
        if (!current_version(c.key)) continue;
        auto p = disk->begin(ChunkView{c.key, bytes, 0, info.size, info.mtime_ns},
                             pinned(c.key.key), this_threads_lane());
        if (p && *p) e.pending = std::move(*p);
        if (!p || !*p) m.disk_skipped.add();
      }
      if (e.pending) e.put = disk->put_bytes(*e.pending, bytes);
    }
  }

  // Records (or gives back) a chunk of a run once its read has ended. The bytes the read
  // returned are hashed here whatever happened while it streamed: a chunk written early
  // whose bytes differ (a retry not seen as one) is written again in its place first.
  void finish_early(const Claim& c, Early& e, std::span<const std::byte> bytes, bool read_ok,
                    const store::ObjectInfo& info) {
    if (!read_ok || (e.begun && !e.pending)) {  // failed, or refused at admission
      if (e.pending)
        (void)disk->finish(std::move(*e.pending), fail(Code::kCancelled, "read failed"));
      e.pending.reset();
      return;
    }
    const uint64_t xxh3 = checksum(bytes);
    if (!e.pending) {  // never landed early (a backend that does not stream)
      store_on_disk(ChunkView{c.key, bytes, xxh3, info.size, info.mtime_ns}, this_threads_lane());
      return;
    }
    if (!e.put || e.pending->entry.xxh3 != xxh3) e.put = disk->put_bytes(*e.pending, bytes, xxh3);
    auto w = disk->finish(std::move(*e.pending), std::move(e.put));
    e.pending.reset();
    if (!w || !*w) {
      m.disk_skipped.add();
    } else if (!current_version(c.key)) {  // dropped meanwhile: drop it now
      (void)disk->drop_if([&](const ChunkKey& k) { return k == c.key; });
    }
  }

  // One backing read for a claimed run, straight into `out` (no bounce); then each chunk is
  // written to NVMe from there (write_through, as its bytes land where the backing read
  // streams) or copied out for the tiers, and handed to whoever waits for it (null when
  // written through: waiters look in the tiers again). `split` is the reader's
  // ReadOptions::split: a reader that keeps its own reads in parallel (cp's parts) gets one
  // backing request per run, as it would without the cache.
  // `to_disk`: written through to NVMe even with a RAM tier (a warm: the point is NVMe, and
  // the write queue would drop what it has no room for).
  Status fill_run(const store::ObjectInfo& info, std::vector<Claim>& run, std::span<std::byte> out,
                  bool split, bool to_disk = false) {
    uint64_t t0 = telemetry::now_ns();
    uint64_t start = run.front().key.index * options.chunk_size;
    store::ReadOptions ro;
    ro.if_match = info.etag;
    ro.object_size = info.size;
    ro.split = split;
    // A run starts 4 KiB-aligned; so does every chunk of it when chunks are whole pages.
    const bool through = (to_disk ? disk && reinterpret_cast<uintptr_t>(out.data()) % 4096 == 0
                                  : write_through(out)) &&
                         options.chunk_size % 4096 == 0;
    std::vector<Early> early(through ? run.size() : 0);
    size_t next = 0;
    uint64_t landed_pos = 0;
    if (through)
      ro.hooks.on_landed = [&](uint64_t end) {
        write_landed(info, run, out, early, start, end, next, landed_pos);
      };
    auto n = backing->read_full(info.key, start, out, ro);
    Status s = !n                 ? Status(std::unexpected(n.error()))
               : *n != out.size() ? Status(ended_early(info, start + *n))
                                  : ok();
    uint64_t pos = 0;
    for (size_t i = 0; i < run.size(); ++i) {
      Claim& c = run[i];
      std::span<const std::byte> bytes = out.subspan(pos, c.length);
      ChunkResult r = std::shared_ptr<const Chunk>();  // null: waiters look in the tiers
      if (through) {
        finish_early(c, early[i], bytes, bool(s), info);
      } else if (s && write_through(bytes)) {  // a chunk size that is not whole pages
        store_on_disk(ChunkView{c.key, bytes, checksum(bytes), info.size, info.mtime_ns},
                      this_threads_lane());
      }
      if (!s) {
        r = std::unexpected(s.error());
      } else if (!through && !write_through(bytes)) {
        r = copy_chunk(c.key, bytes, info);
        if (r) {
          (void)ram->offer(*r, pinned(c.key.key));  // the tiers decide whether to keep it
          enqueue_disk_write(*r);
        }
      }
      // The flight ends before its waiters wake: one that finds null looks again, and
      // must not find this flight again.
      {
        std::lock_guard lock(flight_mu);
        flights.erase(c.key.id());
      }
      c.promise.set_value(r);
      pos += c.length;
    }
    if (s) {
      m.misses.add(run.size());
      m.miss_bytes.add(out.size());
      m.fill_ns.record(telemetry::now_ns() - t0);
    }
    return s;
  }

  // Reads [offset, offset + dst.size()) of one version chunk by chunk: each from a tier, or
  // whole missing chunks in runs of one backing read, or (a part of a chunk) by a fill.
  Result<size_t> read_version(const store::ObjectInfo& info, uint64_t offset,
                              std::span<std::byte> dst, bool split = true) {
    if (offset >= info.size) return size_t{0};
    uint64_t n = std::min<uint64_t>(dst.size(), info.size - offset);
    for (uint64_t pos = offset; pos < offset + n;) {
      uint64_t index = pos / options.chunk_size;
      uint64_t within = pos - index * options.chunk_size;
      uint64_t length = chunk_length(info.size, index);
      uint64_t take = std::min(length - within, offset + n - pos);
      std::span<std::byte> out = dst.subspan(pos - offset, take);
      ChunkKey key{store_id, info.key, info.etag, index};
      SLUICE_ASSIGN_OR_RETURN(bool done, from_tiers(info, key, length, within, out));
      settle_prefetch(key, done);
      if (!done && take == length) {
        std::vector<Claim> run = claim_run(info, index, offset + n);
        if (!run.empty()) {
          uint64_t bytes = 0;
          for (const Claim& c : run) bytes += c.length;
          SLUICE_RETURN_IF_ERROR(fill_run(info, run, dst.subspan(pos - offset, bytes), split));
          pos += bytes;
          continue;
        }
      }
      if (!done) {
        SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Chunk> c, fill(info, key, length));
        std::memcpy(out.data(), c->buf.data() + within, out.size());
      }
      pos += take;
    }
    return static_cast<size_t>(n);
  }

  // Whether a tier (or the NVMe write queue) holds the chunk now.
  bool resident_now(const ChunkKey& key) {
    return ram->contains(key) || (disk && (disk->contains(key) || queued(key)));
  }

  // TieredCache::warm for one version: whole chunks from the one holding `offset`.
  Result<TieredCache::Warmed> warm_version(const store::ObjectInfo& info, uint64_t offset,
                                           uint64_t length) {
    TieredCache::Warmed w{info, 0, 0};
    if (offset >= info.size || length == 0) {
      w.end = std::min(offset, info.size);
      return w;
    }
    const uint64_t cs = options.chunk_size;
    const uint64_t last = (offset + std::min(length, info.size - offset) - 1) / cs;
    w.end = std::min(info.size, (last + 1) * cs);
    AlignedBuffer scratch;  // one run's bytes: 4 KiB-aligned, so NVMe writes go from it
    for (uint64_t index = offset / cs; index <= last;) {
      const uint64_t len = chunk_length(info.size, index);
      ChunkKey key{store_id, info.key, info.etag, index};
      if (resident_now(key)) {
        ++index;
        continue;
      }
      std::vector<Claim> run = claim_run(info, index, w.end);
      if (run.empty()) {  // being read by someone else (or just arrived): wait for it
        SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Chunk> c, fill(info, key, len));
        if (!resident_now(key)) w.not_kept += len;
        ++index;
        continue;
      }
      uint64_t bytes = 0;
      for (const Claim& c : run) bytes += c.length;
      if (scratch.size() < bytes) {
        scratch = AlignedBuffer();  // the old run's memory goes before the new one comes
        auto b = AlignedBuffer::allocate(bytes);
        if (!b) {
          for (Claim& c : run) {
            {
              std::lock_guard lock(flight_mu);
              flights.erase(c.key.id());
            }
            c.promise.set_value(std::unexpected(b.error()));
          }
          return std::unexpected(b.error());
        }
        scratch = std::move(*b);
      }
      SLUICE_RETURN_IF_ERROR(
          fill_run(info, run, std::span(scratch.data(), bytes), true, /*to_disk=*/true));
      w.fetched += bytes;
      for (const Claim& c : run) {
        if (!resident_now(c.key)) w.not_kept += c.length;
      }
      index += run.size();
    }
    return w;
  }

  // Seeds what the cache knows of objects from the NVMe tier's records, unchecked.
  void restore_meta() {
    if (!disk) return;
    std::lock_guard lock(meta_mu);
    for (const DiskTier::Entry& e : disk->entries()) {
      if (e.key.store != store_id) continue;
      store::ObjectInfo info{e.key.key, e.object_size, e.object_mtime_ns, e.key.etag};
      meta.try_emplace(e.key.key, ObjectMeta{info, std::nullopt});
      bound_meta({});  // nothing is queued yet
    }
  }
};

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

Result<std::unique_ptr<TieredCache>> TieredCache::open(std::unique_ptr<store::Store> backing,
                                                       CacheOptions options) {
  if (!backing) return fail(Code::kInvalidArgument, "cache: no backing store");
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

Result<TieredCache::Warmed> TieredCache::warm(std::string_view key, uint64_t offset,
                                              uint64_t length) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  for (int attempt = 0;; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(key, attempt > 0));
    Result<Warmed> r = impl_->warm_version(info, offset, length);
    // The object changed under the warm: start over once on the version there now.
    if (!r && r.error().code() == Code::kConflict && attempt == 0) continue;
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

Status TieredCache::declare(std::span<const PlannedRead> order) {
  std::vector<ChunkId> ids;
  std::vector<Impl::Planned> planned;
  for (const PlannedRead& r : order) {
    SLUICE_RETURN_IF_ERROR(store::validate_key(r.key));
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(r.key, false));
    if (r.offset >= info.size) continue;
    uint64_t end = r.length == 0 || r.length > info.size - r.offset
                       ? info.size
                       : r.offset + r.length;  // never wraps: a huge length means the end
    for (uint64_t i = r.offset / impl_->options.chunk_size; i * impl_->options.chunk_size < end;
         ++i) {
      // Each declared chunk costs memory until it is read: a bound per call, so neither a
      // runaway caller nor a client of the daemon can make the cache hold an endless plan.
      if (ids.size() == kMaxDeclaredChunks)
        return fail(Code::kInvalidArgument, "a declaration of more than " +
                                                std::to_string(kMaxDeclaredChunks) +
                                                " chunks: declare fewer reads at once");
      ids.push_back(ChunkKey{impl_->store_id, info.key, info.etag, i}.id());
      planned.push_back(Impl::Planned{info, i, 0});
    }
  }
  impl_->ram->declare(ids);
  if (impl_->disk) impl_->disk->declare(ids);
  impl_->start_prefetch(std::move(planned));
  return ok();
}

Result<std::optional<ChunkExtent>> TieredCache::locate(std::string_view key, uint64_t offset) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  if (!impl_->disk) return std::optional<ChunkExtent>();
  SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(key, false));
  if (offset >= info.size) return std::optional<ChunkExtent>();
  uint64_t index = offset / impl_->options.chunk_size;
  const ChunkKey chunk{impl_->store_id, info.key, info.etag, index};
  std::optional<DiskTier::Entry> e = impl_->disk->find(chunk);
  if (!e) return std::optional<ChunkExtent>();
  ChunkExtent x;
  x.path = impl_->disk->path_of(e->file_id);
  x.fd.reset(::open(x.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!x.fd.valid()) return std::optional<ChunkExtent>();  // evicted just now
  // The caller reads it from there: a prefetched chunk is used (and frees its budget).
  impl_->settle_prefetch(chunk, true);
  x.file_offset = DiskTier::offset_of(e->file_id);
  x.length = e->length;
  x.object_offset = index * impl_->options.chunk_size;
  x.xxh3 = e->xxh3;
  x.etag = info.etag;
  return std::optional<ChunkExtent>(std::move(x));
}

Result<uint64_t> TieredCache::pin(std::string_view prefix, bool pinned) {
  if (prefix.find_first_of("\t\n") != std::string_view::npos) {
    return fail(Code::kInvalidArgument, "pin: a prefix cannot hold a tab or a newline");
  }
  {
    std::lock_guard lock(impl_->pin_mu);
    auto& v = impl_->pinned_prefixes;
    if (pinned) {
      if (std::find(v.begin(), v.end(), prefix) == v.end()) v.emplace_back(prefix);
    } else {
      std::erase(v, std::string(prefix));
    }
  }
  SLUICE_RETURN_IF_ERROR(impl_->save_pins());
  auto match = key_under(impl_->store_id, std::string(prefix));
  uint64_t n = impl_->ram->pin_if(match, pinned);
  if (impl_->disk) n += impl_->disk->pin_if(match, pinned);
  if (!pinned) {
    // Unpinning "ds/val/" must not unpin what a pin on "ds/" still covers.
    std::vector<std::string> still;
    {
      std::lock_guard lock(impl_->pin_mu);
      for (const std::string& p : impl_->pinned_prefixes) {
        if (prefix.starts_with(p)) still.push_back(p);
      }
    }
    for (const std::string& p : still) {
      auto covered = key_under(impl_->store_id, p);
      (void)impl_->ram->pin_if(covered, true);
      if (impl_->disk) (void)impl_->disk->pin_if(covered, true);
    }
  }
  return n;
}

Result<uint64_t> TieredCache::evict(std::string_view prefix) {
  auto match = key_under(impl_->store_id, std::string(prefix));
  uint64_t n = impl_->ram->drop_if(match);
  if (impl_->disk) n += impl_->drop_queued(match) + impl_->disk->drop_if(match);
  impl_->m.commanded.add(n);
  return n;
}

Result<VerifyReport> TieredCache::verify() {
  VerifyReport rep;
  if (!impl_->disk) return rep;
  AlignedBuffer buf;
  for (const DiskTier::Entry& e : impl_->disk->entries()) {
    if (buf.size() < e.length) {
      SLUICE_ASSIGN_OR_RETURN(buf, AlignedBuffer::allocate(Impl::round_up(e.length)));
    }
    Status s = impl_->disk->read(e, std::span<std::byte>(buf.data(), e.length));
    if (!s && s.error().code() == Code::kNotFound) continue;  // evicted meanwhile
    ++rep.chunks;
    rep.bytes += e.length;
    if (!s) {
      impl_->m.checksum_failures.add();
      impl_->m.corrupt.add();
      rep.corrupt.push_back(s.error().message());
    }
  }
  return rep;
}

std::vector<CachedChunk> TieredCache::chunks(std::string_view prefix, bool all_stores) const {
  auto wanted = [&](const ChunkKey& k) {
    return (all_stores || k.store == impl_->store_id) && k.key.starts_with(prefix);
  };
  std::map<std::tuple<std::string, std::string, std::string, uint64_t>, CachedChunk> all;
  for (const RamTier::Entry& e : impl_->ram->entries()) {
    const ChunkKey& k = e.chunk->key;
    if (!wanted(k)) continue;
    CachedChunk& c = all[{k.store, k.key, k.etag, k.index}];
    c = CachedChunk{k.store,         k.key, k.etag,    k.index,
                    e.chunk->length, true,  c.on_disk, c.pinned || e.pinned};
  }
  if (impl_->disk) {
    for (const DiskTier::Entry& e : impl_->disk->entries()) {
      const ChunkKey& k = e.key;
      if (!wanted(k)) continue;
      CachedChunk& c = all[{k.store, k.key, k.etag, k.index}];
      c = CachedChunk{k.store,  k.key,    k.etag, k.index,
                      e.length, c.in_ram, true,   c.pinned || e.pinned};
    }
  }
  std::vector<CachedChunk> out;
  for (auto& [k, c] : all) out.push_back(std::move(c));
  return out;
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
    std::lock_guard lock(impl_->meta_mu);
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
