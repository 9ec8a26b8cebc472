// src/cache/tiered_cache_impl.h: TieredCache::Impl and its types, shared by the cache's files.
//
// The state of a cache lives here; its methods are defined in the file they belong to:
// tiered_cache.cc (construction, what the cache knows of objects), fill.cc (misses, runs,
// single-flight, NVMe writes), prefetch.cc (declared reads), maintenance.cc (pins, evict,
// warm).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/disk_tier.h"
#include "cache/ram_tier.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cache {

// Shared by this layer's files only; in `detail`, so no other file's type of the same
// name in this namespace is ever taken for one of these.
namespace detail {

using Clock = std::chrono::steady_clock;
using ChunkResult = Result<std::shared_ptr<const Chunk>>;

struct ObjectMeta {
  store::ObjectInfo info;
  std::optional<Clock::time_point> checked;  // last stat or listing; none: restored
};

// Where a flight's chunk came from: the backing store, or a tier (a part read's flight).
enum class Served { kBacking, kRam, kDisk };

// A fill in progress: the first miss on a chunk reads it, later ones wait here.
struct Flight {
  ChunkKey key;
  std::shared_future<ChunkResult> result;
  Served served = Served::kBacking;  // written before `result` is set, read after
};

struct Metrics {
  explicit Metrics(telemetry::Registry& r)
      : ram_hits(r.counter("sluice_cache_hits_total", {{"tier", "ram"}},
                           "Chunk reads served by a tier")),
        disk_hits(r.counter("sluice_cache_hits_total", {{"tier", "nvme"}})),
        ram_hit_bytes(
            r.counter("sluice_cache_hit_bytes_total", {{"tier", "ram"}}, "Bytes served by a tier")),
        disk_hit_bytes(r.counter("sluice_cache_hit_bytes_total", {{"tier", "nvme"}})),
        misses(r.counter("sluice_cache_misses_total", {}, "Chunk reads sent to the backing store")),
        miss_bytes(
            r.counter("sluice_cache_miss_bytes_total", {}, "Bytes read from the backing store")),
        ram_evictions(r.counter("sluice_cache_evictions_total",
                                {{"tier", "ram"}, {"reason", "capacity"}},
                                "Chunks dropped from a tier, by reason")),
        disk_evictions(
            r.counter("sluice_cache_evictions_total", {{"tier", "nvme"}, {"reason", "capacity"}})),
        stale(r.counter("sluice_cache_evictions_total", {{"tier", "any"}, {"reason", "stale"}})),
        corrupt(
            r.counter("sluice_cache_evictions_total", {{"tier", "nvme"}, {"reason", "corrupt"}})),
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

}  // namespace detail
using namespace detail;

struct TieredCache::Impl {
  Impl(std::unique_ptr<store::Store> b, CacheOptions o);
  ~Impl();

  static size_t round_up(uint64_t n);

  std::unique_ptr<store::Store> backing;
  CacheOptions options;
  std::string store_id;  // options.store_id, or the backing store's identity()
  std::unique_ptr<telemetry::Registry> own_registry;
  telemetry::Registry* registry;
  Metrics m;
  BufferPool pool;  // full-size chunk buffers; declared before the tiers that hold them
  // Idle chunk buffers the pool keeps without a prefaulted RAM tier: enough to recycle a
  // full NVMe write queue.
  size_t base_idle() const { return 16 + options.disk_write_queue_bytes / options.chunk_size; }
  // Allocates and touches the RAM tier's chunk buffers into `pool` (options.prefault_ram),
  // on `prefaulter`, until done or pf_quit.
  void prefault_ram();
  std::thread prefaulter;
  std::unique_ptr<RamTier> ram;
  std::unique_ptr<DiskTier> disk;

  mutable Mutex meta_mu;  // taken after wq_mu, never before it
  std::map<std::string, ObjectMeta, std::less<>> meta SLUICE_GUARDED_BY(meta_mu);

  Mutex flight_mu;
  std::unordered_map<ChunkId, std::shared_ptr<Flight>> flights SLUICE_GUARDED_BY(flight_mu);

  Mutex pins_file_mu;  // one writer of DIR/pins at a time; taken before pin_mu
  mutable Mutex pin_mu;
  std::vector<std::string> pinned_prefixes SLUICE_GUARDED_BY(pin_mu);  // this store's
  std::vector<std::string> other_pins SLUICE_GUARDED_BY(pin_mu);  // other stores' lines of DIR/pins

  // NVMe writes happen behind fills, on one thread, so a cold read does not wait for them.
  Mutex wq_mu;
  CondVar wq_cv;
  CondVar wq_room;  // a queued write finished
  std::deque<std::shared_ptr<const Chunk>> wq SLUICE_GUARDED_BY(wq_mu);
  uint64_t wq_bytes SLUICE_GUARDED_BY(wq_mu) = 0;
  uint64_t wq_reserved SLUICE_GUARDED_BY(wq_mu) = 0;  // room prefetchers hold (wait_for_write_room)
  bool stopping SLUICE_GUARDED_BY(wq_mu) = false;
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
  Mutex pf_mu;
  CondVar pf_cv;
  std::deque<Planned> pf_queue SLUICE_GUARDED_BY(pf_mu);  // at most kMaxQueuedPrefetch
  static constexpr size_t kMaxQueuedPrefetch = 4 * kMaxDeclaredChunks;
  struct Ahead {
    uint64_t position = 0, bytes = 0;
    bool fetching = true;  // its fill has not returned: a read now is a late hit
  };
  std::map<ChunkId, Ahead> pf_ahead_chunks SLUICE_GUARDED_BY(pf_mu);
  // Where each queued chunk is in the declared order, and how far the reader has passed
  // (positions below pf_passed): a chunk the reader passed before a prefetcher took it is
  // not fetched (it was read already) and not counted as waste.
  std::map<ChunkId, uint64_t> pf_queued SLUICE_GUARDED_BY(pf_mu);
  uint64_t pf_passed SLUICE_GUARDED_BY(pf_mu) = 0;
  uint64_t pf_ahead SLUICE_GUARDED_BY(pf_mu) = 0;
  uint64_t pf_position SLUICE_GUARDED_BY(pf_mu) = 0;
  bool pf_stopping SLUICE_GUARDED_BY(pf_mu) = false;
  // Set once anything is declared, so reads without prefetch skip pf_mu. Relaxed is enough:
  // a read that misses the flag just leaves its chunk to be settled by a later read.
  std::atomic<bool> pf_active{false};
  // Set once, when the cache closes. Read relaxed under wq_mu: it is set before ~Impl takes
  // and drops wq_mu, so a waiter that holds the lock after that sees it.
  std::atomic<bool> pf_quit{false};
  std::vector<std::thread> prefetchers;

  // What the cache knows of objects (tiered_cache.cc).
  void bound_meta(const std::unordered_set<std::string_view>& busy) SLUICE_REQUIRES(meta_mu);
  std::unordered_set<std::string_view> busy_keys(std::vector<std::shared_ptr<const Chunk>>& hold);
  void learn(const store::ObjectInfo& info);
  bool current_version(const ChunkKey& key);
  uint64_t forget(const std::string& key);
  Result<store::ObjectInfo> current(std::string_view key, bool force);
  void restore_meta();

  // Prefetch of declared reads (prefetch.cc).
  void start_prefetch(std::vector<Planned> planned);
  void prefetch_loop();
  bool wait_for_write_room(uint64_t len);
  void release_write_room(uint64_t len);
  void release_locked(ChunkId id) SLUICE_REQUIRES(pf_mu);
  void settle_prefetch(const ChunkKey& key, bool hit);

  // Pins (maintenance.cc).
  std::string pins_path() const;
  void load_pins();
  Status save_pins();
  bool pinned(const std::string& key) const;

  // Defined below, as round_up is: fills and prefetch both use it.
  uint64_t chunk_length(uint64_t object_size, uint64_t index) const;

  // Fills and the NVMe writes behind them (fill.cc).
  Result<std::shared_ptr<Chunk>> new_chunk(const ChunkKey& key, uint64_t length,
                                           const store::ObjectInfo& info);
  void enqueue_disk_write(std::shared_ptr<const Chunk> c);
  void write_loop();
  void store_on_disk(const ChunkView& v, uint64_t lane = 0);
  std::shared_ptr<const Chunk> queued(const ChunkKey& key);
  std::unexpected<Error> ended_early(const store::ObjectInfo& info, uint64_t at) const;
  ChunkResult fetch(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length);
  // `hit_bytes`: what a reader takes from the chunk, counted as a hit of the tier that
  // turns out to hold it (0 for a prefetch or a warm, which read nothing for anyone).
  ChunkResult fill(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length,
                   uint64_t hit_bytes = 0);
  Result<std::shared_ptr<const Chunk>> resident(const store::ObjectInfo& info, const ChunkKey& key,
                                                uint64_t length, uint64_t hit_bytes,
                                                Served* served = nullptr);
  Result<bool> from_disk(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length,
                         uint64_t within, std::span<std::byte> out);
  Result<bool> from_tiers(const store::ObjectInfo& info, const ChunkKey& key, uint64_t length,
                          uint64_t within, std::span<std::byte> out);

  // One chunk of a run claimed by claim_run.
  struct Claim {
    ChunkKey key;
    uint64_t length = 0;
    std::promise<ChunkResult> promise;
  };
  static constexpr uint64_t kMaxRunBytes = 64 << 20;

  std::vector<Claim> claim_run(const store::ObjectInfo& info, uint64_t index, uint64_t end);
  ChunkResult copy_chunk(const ChunkKey& key, std::span<const std::byte> bytes,
                         const store::ObjectInfo& info);
  static uint64_t this_threads_lane();
  bool write_through(std::span<const std::byte> bytes) const;

  // A chunk of a run written to NVMe while the run's backing read still streams in.
  struct Early {
    bool begun = false;  // admission asked (once): a refusal is final for this fill
    std::optional<DiskTier::Pending> pending;
    Status put = ok();
  };

  void write_landed(const store::ObjectInfo& info, std::vector<Claim>& run,
                    std::span<const std::byte> out, std::vector<Early>& early, uint64_t start,
                    uint64_t end, size_t& next, uint64_t& pos);
  void finish_early(const Claim& c, Early& e, std::span<const std::byte> bytes, bool read_ok,
                    const store::ObjectInfo& info);
  Status fill_run(const store::ObjectInfo& info, std::vector<Claim>& run, std::span<std::byte> out,
                  bool split, bool to_disk = false);
  Result<size_t> read_version(const store::ObjectInfo& info, uint64_t offset,
                              std::span<std::byte> dst, bool split = true);
  bool resident_now(const ChunkKey& key);

  // Evict and warm (maintenance.cc).
  template <class Match>
  uint64_t drop_queued(const Match& match);
  // Drops every matching chunk: RAM, queued NVMe writes, NVMe. Returns how many entries went.
  template <class Match>
  uint64_t drop(const Match& match);
  Result<TieredCache::Warmed> warm_version(const store::ObjectInfo& info, uint64_t offset,
                                           uint64_t length);
};

inline size_t TieredCache::Impl::round_up(uint64_t n) {
  return static_cast<size_t>((n + 4095) & ~uint64_t{4095});
}

inline uint64_t TieredCache::Impl::chunk_length(uint64_t object_size, uint64_t index) const {
  uint64_t start = index * options.chunk_size;
  return std::min<uint64_t>(options.chunk_size, object_size - start);
}

}  // namespace sluice::cache
