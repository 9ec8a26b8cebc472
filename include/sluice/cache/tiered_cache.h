// sluice/cache/tiered_cache.h: RAM and NVMe tiers in front of any store.
//
//   CacheOptions o;
//   o.directory = "/nvme/sluice-cache";  o.ram_bytes = 8_GiB;  o.disk_bytes = 1_TiB;
//   auto cache = TieredCache::open(open_store("s3://bucket/data").value(), o).value();
//   cache->read("shard-0001.tar", offset, buffer);   // RAM, then NVMe, then the bucket
//
// A TieredCache is a Store. Objects are cut into chunks of `chunk_size` bytes (an object
// smaller than a chunk is one chunk); a read is served chunk by chunk from the RAM tier,
// else the NVMe tier, else one read of the backing store, after which the chunk may enter
// both tiers (each tier's EvictionPolicy decides). Writes, listings and removals go to the
// backing store; a write or a removal through the cache drops the cached copy of that key.
//
// Contract:
// - Never stale: every chunk is bound to its object's etag, and a chunk is only served for
//   the etag the cache believes current. That belief is refreshed by a stat of the backing
//   store when it is older than `revalidate_after` (or never, with `offline`); a changed
//   etag drops every chunk of the old version. All chunks of one read() come from one
//   version: reads of the backing store are pinned to it with if_match, and if the object
//   changes mid-read the read starts over once on the new version, then fails Conflict.
// - Never corrupt: every chunk carries an XXH3-64 checksum, verified on every read from the
//   NVMe tier. A mismatch drops the chunk, counts it (checksum_failures) and reads it from
//   the backing store again. Bytes from the backing store are checked against the object's
//   size: a short read is Corruption and is never cached.
// - Each tier's bytes stay within its limit: the RAM tier holds at most `ram_bytes` of
//   chunks, the NVMe tier at most `disk_bytes` (lengths rounded up to 4 KiB). Buffers of
//   reads in progress (at most one chunk per concurrent read) are outside both limits.
// - Single-flight: concurrent misses on one chunk make one backing read; the others wait
//   for it (singleflight_joins). A failed fill caches nothing and fails every waiter.
// - Persistent: the NVMe tier's chunk files and its index (docs/formats/cache-index.md)
//   survive a restart and kill -9 at any moment; a chunk whose index record was not written
//   is discarded at open. One process owns a cache directory at a time (a lock);
//   open() of a directory another process owns fails with Unavailable.
// - All methods may be called from many threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/policy.h"
#include "sluice/cache/read_ahead.h"
#include "sluice/core/fd.h"
#include "sluice/store/store.h"

namespace sluice::io {
class Context;
}
namespace sluice::telemetry {
class Registry;
}

namespace sluice::cache {

inline constexpr uint64_t kDefaultChunkSize = 4ULL << 20;

struct CacheOptions {
  // The NVMe tier's directory (created if missing). Empty: a RAM tier only. One directory
  // may hold the chunks of many backing stores (one node-wide budget); they are told
  // apart by store_id.
  std::string directory;
  // Names the backing store in chunk keys; empty: its identity() (the URI, and for S3 the
  // endpoint). Two caches over the same data reached by different URIs can share chunks
  // by giving the same id.
  std::string store_id;
  uint64_t ram_bytes = 1ULL << 30;
  // Allocate and touch the RAM tier's chunk buffers from the start, on a thread of their
  // own, and keep them for the cache's life, rather than allocate them on first use. A
  // daemon's choice (sluiced's default): fresh memory is slow to touch the first time, on
  // VMs whose host backs guest memory lazily several times slower (1.3-2.4 s a GiB of
  // huge pages here, against 0.13 s for memory the process had touched before), and that
  // cost fell on the first epoch's reads. Fills take the buffers as they are ready. Short
  // chunks (an object's last, small objects) are still allocated as they come.
  // `prefaulted` is called on that thread when it is done: the bytes, the seconds it took,
  // and an error if an allocation failed (the rest is then allocated on first use).
  bool prefault_ram = false;
  std::function<void(uint64_t bytes, double seconds, const Status& outcome)> prefaulted;
  uint64_t disk_bytes = 16ULL << 30;
  // 64 KiB to 1 GiB. 0: the size the directory's chunks were cut at (its index records it),
  // else kDefaultChunkSize; another size than the directory's is refused.
  uint64_t chunk_size = 0;
  PolicyKind policy = PolicyKind::kS3Fifo;
  // How old the cache's knowledge of an object (size, etag) may be before a read stats the
  // backing store again.
  std::chrono::milliseconds revalidate_after{1000};
  // Objects whose size and etag the cache remembers (about 300 bytes each): at most this
  // many, plus those with a chunk waiting for its NVMe write (at most
  // disk_write_queue_bytes / 4 KiB). Past it, the longest-unchecked eighth is forgotten;
  // their chunks stay, and the next read of one stats it again. Best effort at the edges: a
  // chunk whose object was forgotten before its NVMe write is not written (counted in
  // disk_writes_skipped), and chunks of an older version of a forgotten object are never
  // served but stay until evicted. Not applied `offline` (nothing can be asked again).
  size_t max_objects = 256 * 1024;
  // Trust what the cache knows and never stat for revalidation (objects not cached yet are
  // still looked up). For data known not to change.
  bool offline = false;
  // Bytes of NVMe writes queued behind fills (each chunk counted in whole 4 KiB pages); a
  // fill finding the queue full skips the NVMe tier for that chunk rather than wait. Without
  // a RAM tier, prefetch waits instead, for the queue to be under half full.
  uint64_t disk_write_queue_bytes = 256ULL << 20;
  // Prefetch of declared reads: bytes fetched ahead and not yet read, at most; threads.
  uint64_t prefetch_bytes = 256ULL << 20;
  unsigned prefetch_threads = 4;
  // How far reads may run out of the declared order (readers with several reads in flight):
  // a read passes the declared chunks more than this many before it (not prefetched any
  // more; fetched and unread ones count as waste). 0: strictly in order. The loader keeps
  // up to 32 requests of up to 16 MiB in flight over two slices, about 128 chunks of 4 MiB:
  // at 16, a cold epoch through sluiced counted 46 of 179 prefetched chunks as waste and
  // stopped prefetching them, though every one was read; at 256, none.
  uint64_t prefetch_reorder_chunks = 256;
  // The data path for the NVMe tier; null: one opened with defaults (io_uring where the
  // kernel has it, O_DIRECT where the file system allows it).
  std::shared_ptr<io::Context> io;
  // Where hit, miss, eviction and fill metrics go; null: a registry of the cache's own.
  telemetry::Registry* registry = nullptr;
  // Missing whole chunks of one read are filled by one backing read per run of chunks in
  // the same group (key, chunk index -> group); null: one group. The daemon groups by the
  // chunk's owner, so a fill waiting on a peer never holds a chunk another daemon waits
  // for (which could make two daemons wait on each other until the peer timeout).
  std::function<uint64_t(std::string_view key, uint64_t index)> fill_group;
  // Charging of the NVMe tier (the daemon's: ledger/cache_charger.h charges each chunk to
  // the team owning its object). `admit_chunk` is asked before a chunk is written to NVMe,
  // with the backing store's identity, the key and the chunk's bytes on disk (its length
  // rounded up to 4 KiB): nullopt keeps the chunk off NVMe (the read that fetched it still
  // succeeds); else a charge tag the cache keeps with the chunk, in memory (0: uncharged).
  // `chunk_adopted` gives the tag of each chunk found on NVMe at open, and cannot refuse.
  // `chunk_freed` is told a chunk's tag and bytes when it leaves NVMe, for every non-zero
  // tag. Called from readers' and the writer's threads, never under the cache's locks.
  // Null: every chunk may be kept, and nothing is told.
  std::function<std::optional<uint32_t>(std::string_view store, std::string_view key,
                                        uint64_t bytes)>
      admit_chunk;
  std::function<uint32_t(std::string_view store, std::string_view key, uint64_t bytes)>
      chunk_adopted;
  std::function<void(uint32_t tag, uint64_t bytes)> chunk_freed;
};

// Where a chunk lies in the NVMe tier, for a caller that reads it with its own data path
// (io::FileHandle into device memory). `fd` is open read-only on the chunk's segment, which
// holds chunks of this object version only. A chunk evicted meanwhile reads as zeros (its
// pages are freed): the caller must check `xxh3` over the bytes.
struct ChunkExtent {
  UniqueFd fd;
  std::string path;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t object_offset = 0;  // where the chunk starts in the object
  uint64_t xxh3 = 0;
  std::string etag;  // the version of the object the chunk belongs to
};

struct TierStats {
  uint64_t bytes = 0, capacity = 0, chunks = 0;
  uint64_t hits = 0, hit_bytes = 0;
};

struct CacheStats {
  TierStats ram, disk;
  uint64_t misses = 0, miss_bytes = 0;  // reads of the backing store
  uint64_t evictions = 0, checksum_failures = 0, stale_drops = 0;
  uint64_t singleflight_joins = 0, disk_writes_skipped = 0;
  uint64_t prefetched = 0, prefetch_hits = 0, prefetch_wasted = 0;
  uint64_t objects_known = 0;  // objects whose size and etag are remembered (max_objects)
  std::string directory, policy, io_path;
};

// The chunk size a cache opened with `options` uses: options.chunk_size, or (0) the size
// recorded in its directory, else kDefaultChunkSize.
Result<uint64_t> chunk_size_for(const CacheOptions& options);

struct CachedChunk {
  std::string store;  // the backing store's identity
  std::string key;
  std::string etag;
  uint64_t index = 0, length = 0;
  bool in_ram = false, on_disk = false, pinned = false;
};

struct VerifyReport {
  uint64_t chunks = 0, bytes = 0;
  std::vector<std::string> corrupt;  // "key chunk N: why"; each one was dropped
};

class TieredCache : public store::Store, public ReadAhead {
 public:
  static Result<std::unique_ptr<TieredCache>> open(std::unique_ptr<store::Store> backing,
                                                   CacheOptions options);
  ~TieredCache() override;

  // Store. stat answers from what the cache knows while it is fresh (see revalidate_after).
  Result<store::ObjectInfo> stat(std::string_view key) override;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options = {}) override;
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override;
  Result<store::ListPage> list(const store::ListOptions& options) override;
  Status remove(std::string_view key) override;
  std::string uri() const override;
  std::string identity() const override;
  // ReadAhead and TieredCache (stats, pin, warm) through any decorator.
  void* find_capability(const std::type_info& type) override;

  // Declares reads to come, in order: the cache fetches ahead (within prefetch_bytes) and,
  // under PolicyKind::kDeclared, evicts by the declared order. Appends to what was
  // declared before.
  Status declare(std::span<const PlannedRead> order) override;
  uint64_t chunk_size() const override;
  // With a RAM tier of 16 chunks at least (CacheOptions::ram_bytes).
  bool keeps_chunks() const override;
  // Where the chunk holding `offset` of `key` lies on NVMe; nullopt when it is not there.
  // The caller is taken to read it: a hit of the NVMe tier, and a declared chunk counts as
  // read (a prefetch hit).
  // `etag`, when given: nullopt unless the chunk is of that version.
  Result<std::optional<ChunkExtent>> locate(std::string_view key, uint64_t offset,
                                            std::string_view etag = {});

  // Makes the chunks holding [offset, offset + length) of `key` resident, as a read of them
  // would (the tiers decide what they keep), without copying a cached byte anywhere:
  // chunks a tier already holds are skipped, missing ones fetched in runs, one in flight
  // waited for. For `sluice cache warm` through the daemon, which would otherwise carry
  // every byte to a process that drops it.
  struct Warmed {
    store::ObjectInfo info;  // the version warmed
    uint64_t end = 0;        // where the chunks warmed end (the object's size at most)
    uint64_t fetched = 0;    // bytes read from the backing store for it
    uint64_t not_kept = 0;   // bytes of its chunks no tier kept (full of pinned chunks, a quota)
  };
  Result<Warmed> warm(std::string_view key, uint64_t offset, uint64_t length);

  // Pins (or unpins) every cached chunk of keys under `prefix`, and chunks of them cached
  // later: pinned chunks are never evicted. Pins persist in the cache directory (DIR/pins).
  // Returns the chunks pinned now.
  Result<uint64_t> pin(std::string_view prefix, bool pinned = true);
  // Drops every cached chunk of keys under `prefix` (pinned ones too) and the NVMe writes
  // queued for them, waiting for the one being written. Returns how many entries went (a
  // chunk in RAM and on NVMe counts in each tier; a queued write counts once). May wait for
  // the writer, which calls admit_chunk: the hooks must not call evict.
  Result<uint64_t> evict(std::string_view prefix);
  // Drops every chunk another backing store left in the directory (its store id is not this
  // cache's): one that serves a single store of its own cannot reach them, so they would
  // only take room and count as held. Returns the chunks dropped.
  uint64_t drop_other_stores();
  // Re-reads every NVMe chunk and checks its checksum; corrupt ones are dropped.
  Result<VerifyReport> verify();
  // Cached chunks of keys under `prefix` of this cache's backing store, or of every store
  // whose chunks share the directory.
  std::vector<CachedChunk> chunks(std::string_view prefix, bool all_stores = false) const;
  CacheStats stats() const;
  const CacheOptions& options() const;

  struct Impl;

 private:
  explicit TieredCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Registers "cache+<scheme>://" for every scheme open_store knows now (cache+s3://b/p,
// cache+file:///data): the backing store is opened with the rest of the URI and the same
// StoreOptions; CacheOptions come from options.backend.get<CacheOptions>() (a RAM-only
// cache with defaults when none is set).
void register_scheme();

}  // namespace sluice::cache
