// Fills: misses read from the backing store in runs, one fill per chunk, the NVMe writes.
#include "cache/tiered_cache_impl.h"

#include <cstring>
#include <limits>

namespace sluice::cache {

Result<std::shared_ptr<Chunk>> TieredCache::Impl::new_chunk(const ChunkKey& key, uint64_t length,
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
    // ... and as much of a prefaulted RAM tier's idle memory is given back, so the two
    // together stay within the tier's size when small chunks fill it.
    if (options.prefault_ram) pool.shed(round_up(length), base_idle());
    c->buf = PooledBuffer(nullptr, std::move(b));
  }
  return c;
}

void TieredCache::Impl::enqueue_disk_write(std::shared_ptr<const Chunk> c) {
  if (!disk) return;
  {
    MutexLock lock(wq_mu);
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

void TieredCache::Impl::write_loop() {
  UniqueLock lock(wq_mu);
  for (;;) {
    wq_cv.wait(lock, [&]() SLUICE_REQUIRES(wq_mu) { return stopping || !wq.empty(); });
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

// Writes a chunk to NVMe unless its version was dropped meanwhile. Forget and learn change
// the metadata before they drop chunks, so checking it before and after the write closes
// the window; a drop during the write itself is caught by DiskTier::write (its entry is
// gone).
void TieredCache::Impl::store_on_disk(const ChunkView& v, uint64_t lane) {
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
std::shared_ptr<const Chunk> TieredCache::Impl::queued(const ChunkKey& key) {
  MutexLock lock(wq_mu);
  for (const std::shared_ptr<const Chunk>& c : wq) {
    if (c->key == key) return c;
  }
  return nullptr;
}

std::unexpected<Error> TieredCache::Impl::ended_early(const store::ObjectInfo& info,
                                                      uint64_t at) const {
  return fail(Code::kCorruption, "'" + info.key + "' in " + backing->uri() + " ended at byte " +
                                     std::to_string(at) + ", before its size " +
                                     std::to_string(info.size) + "; nothing cached");
}

// Reads one chunk from the backing store, pinned to the version in `info`.
ChunkResult TieredCache::Impl::fetch(const store::ObjectInfo& info, const ChunkKey& key,
                                     uint64_t length) {
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
ChunkResult TieredCache::Impl::fill(const store::ObjectInfo& info, const ChunkKey& key,
                                    uint64_t length, uint64_t hit_bytes) {
  // Loops only when a fill it joined wrote the chunk through to NVMe (see below).
  for (;;) {
    ChunkId id = key.id();
    std::promise<ChunkResult> mine;
    std::shared_ptr<Flight> joined, claimed;
    {
      MutexLock lock(flight_mu);
      auto it = flights.find(id);
      if (it != flights.end() && it->second->key == key) {
        joined = it->second;
      } else if (it == flights.end()) {
        claimed =
            flights.emplace(id, std::make_shared<Flight>(Flight{key, mine.get_future().share()}))
                .first->second;
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
      // A reader that shared a tier's read was served by that tier: its bytes count there
      // (the read itself counted once, by the reader that made it).
      if (r && hit_bytes && joined->served != Served::kBacking)
        (joined->served == Served::kDisk ? m.disk_hit_bytes : m.ram_hit_bytes).add(hit_bytes);
      return r;
    }
    // A fill that ended between the caller's look at the tiers and this claim left the
    // chunk in a tier: take it from there rather than read the backing store again.
    Result<std::shared_ptr<const Chunk>> have =
        resident(info, key, length, hit_bytes, &claimed->served);
    if (have && *have) {
      // A reader's chunk goes into RAM before the flight ends, so a reader that comes after
      // finds it there (a warm or a prefetch leaves RAM as it is).
      if (hit_bytes) (void)ram->offer(*have, pinned(key.key));
      mine.set_value(*have);
      MutexLock lock(flight_mu);
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
    MutexLock lock(flight_mu);
    flights.erase(id);
    return r;
  }
}

// The whole chunk if a tier (or the NVMe write queue) holds it now; null if none does.
Result<std::shared_ptr<const Chunk>> TieredCache::Impl::resident(const store::ObjectInfo& info,
                                                                 const ChunkKey& key,
                                                                 uint64_t length,
                                                                 uint64_t hit_bytes,
                                                                 Served* served) {
  // A reader served from here is a hit, counted as from_tiers counts one.
  std::shared_ptr<const Chunk> c = ram->find(key);
  if (!c && disk) c = queued(key);
  if (c) {
    if (served) *served = Served::kRam;
    if (hit_bytes) {
      m.ram_hits.add();
      m.ram_hit_bytes.add(hit_bytes);
    }
    return c;
  }
  if (!disk) return c;
  std::optional<DiskTier::Entry> e = disk->find(key);
  if (!e || e->length != length) return c;
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Chunk> read, new_chunk(key, length, info));
  if (Status s = disk->read(*e, std::span<std::byte>(read->buf.data(), length)); !s) {
    if (s.error().code() == Code::kCorruption) {  // dropped by the read: counted as from_disk does
      m.checksum_failures.add();
      m.corrupt.add();
    }
    return c;
  }
  read->xxh3 = e->xxh3;
  if (served) *served = Served::kDisk;
  if (hit_bytes) {
    m.disk_hits.add();
    m.disk_hit_bytes.add(hit_bytes);
  }
  return std::shared_ptr<const Chunk>(std::move(read));
}

// From the NVMe tier into `out` (bytes [within, within + out.size()) of the chunk).
// false: not there (or corrupt, now dropped): the caller goes to the backing store. A part
// read through fill() (a RAM tier to keep the chunk) goes there itself when the chunk is
// gone or corrupt, and is true.
Result<bool> TieredCache::Impl::from_disk(const store::ObjectInfo& info, const ChunkKey& key,
                                          uint64_t length, uint64_t within,
                                          std::span<std::byte> out) {
  if (!disk) return false;
  std::optional<DiskTier::Entry> e = disk->find(key);
  if (!e) return false;
  // A chunk cut at another chunk size (or a record that lies) never fills this buffer.
  if (e->length != length) {
    (void)disk->drop_if([&](const ChunkKey& k) { return k == key; });
    return false;
  }
  bool whole = within == 0 && out.size() == length;
  if (!whole && options.ram_bytes >= options.chunk_size) {
    // A part, where the RAM tier can keep the chunk: parts asked at once (a loader's slice
    // takes several samples of a chunk) share one read of it, as fills do, and later parts
    // find it in RAM. Read by each part, a first epoch of a 256 MiB shard with a 1 GiB RAM
    // tier ran at 0.44 GiB/s, against 1.52 with this (docs/performance.md).
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Chunk> got, fill(info, key, length, out.size()));
    std::memcpy(out.data(), got->buf.data() + within, out.size());
    return true;
  }
  std::shared_ptr<Chunk> c;
  std::span<std::byte> into = out;
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
Result<bool> TieredCache::Impl::from_tiers(const store::ObjectInfo& info, const ChunkKey& key,
                                           uint64_t length, uint64_t within,
                                           std::span<std::byte> out) {
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
std::vector<TieredCache::Impl::Claim> TieredCache::Impl::claim_run(const store::ObjectInfo& info,
                                                                   uint64_t index, uint64_t end) {
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
  MutexLock lock(flight_mu);  // then a tier's lock: never the other way round
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
ChunkResult TieredCache::Impl::copy_chunk(const ChunkKey& key, std::span<const std::byte> bytes,
                                          const store::ObjectInfo& info) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Chunk> c, new_chunk(key, bytes.size(), info));
  c->xxh3 = copy_and_checksum(std::span<std::byte>(c->buf.data(), c->buf.size()), bytes);
  return std::shared_ptr<const Chunk>(std::move(c));
}

// The NVMe lane of the calling thread: readers on different threads append an object's
// chunks to different segments (cp's parts never wait on one another's extending
// writes), and one thread's runs share one. Lane 0 is the write-behind queue's.
uint64_t TieredCache::Impl::this_threads_lane() {
  static std::atomic<uint64_t> next{1};  // relaxed: a lane only has to differ from others
  thread_local const uint64_t lane = next.fetch_add(1, std::memory_order_relaxed);
  return lane;
}

// Whether a chunk just read into a reader's buffer goes to NVMe from there, before the
// read returns, rather than through a copy and the write queue: when no RAM tier would
// keep the copy (the CLI's embedded cache) and the bytes start 4 KiB-aligned (O_DIRECT).
// The copy into fresh memory cost more than the write's wait where reads run in parallel.
bool TieredCache::Impl::write_through(std::span<const std::byte> bytes) const {
  return disk && options.ram_bytes == 0 && reinterpret_cast<uintptr_t>(bytes.data()) % 4096 == 0;
}

// Writes the chunks of a run whose bytes have landed (the backing read's on_landed):
// without it every chunk of a run waited for the whole run, and since parallel reads of
// one server tend to finish together, the disk then sat idle through the downloads and
// the downloads through the disk writes. A retry that lands from its start again is
// written again; nothing is recorded here: fill_run finishes each chunk once the read has
// succeeded, after checking that what was written is what the read returned.
void TieredCache::Impl::write_landed(const store::ObjectInfo& info, std::vector<Claim>& run,
                                     std::span<const std::byte> out, std::vector<Early>& early,
                                     uint64_t start, uint64_t end, size_t& next, uint64_t& pos) {
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
      auto p = disk->begin(ChunkView{c.key, bytes, 0, info.size, info.mtime_ns}, pinned(c.key.key),
                           this_threads_lane());
      if (p && *p) e.pending = std::move(*p);
      if (!p || !*p) m.disk_skipped.add();
    }
    if (e.pending) e.put = disk->put_bytes(*e.pending, bytes);
  }
}

// Records (or gives back) a chunk of a run once its read has ended. The bytes the read
// returned are hashed here whatever happened while it streamed: a chunk written early
// whose bytes differ (a retry not seen as one) is written again in its place first.
void TieredCache::Impl::finish_early(const Claim& c, Early& e, std::span<const std::byte> bytes,
                                     bool read_ok, const store::ObjectInfo& info) {
  if (!read_ok || (e.begun && !e.pending)) {  // failed, or refused at admission
    if (e.pending) (void)disk->finish(std::move(*e.pending), fail(Code::kCancelled, "read failed"));
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
Status TieredCache::Impl::fill_run(const store::ObjectInfo& info, std::vector<Claim>& run,
                                   std::span<std::byte> out, bool split, bool to_disk) {
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
      MutexLock lock(flight_mu);
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
Result<size_t> TieredCache::Impl::read_version(const store::ObjectInfo& info, uint64_t offset,
                                               std::span<std::byte> dst, bool split) {
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
      SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Chunk> c, fill(info, key, length, out.size()));
      std::memcpy(out.data(), c->buf.data() + within, out.size());
    }
    pos += take;
  }
  return static_cast<size_t>(n);
}

// Whether a tier (or the NVMe write queue) holds the chunk now.
bool TieredCache::Impl::resident_now(const ChunkKey& key) {
  return ram->contains(key) || (disk && (disk->contains(key) || queued(key)));
}

}  // namespace sluice::cache
