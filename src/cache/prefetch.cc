// Read-ahead: declared reads, the threads that prefetch them, and their budget.
#include "cache/tiered_cache_impl.h"

#include "sluice/store/serving_peer.h"

namespace sluice::cache {

void TieredCache::Impl::start_prefetch(std::vector<Planned> planned) {
  if (options.prefetch_bytes == 0 || options.prefetch_threads == 0 || planned.empty()) return;
  {
    MutexLock lock(pf_mu);
    for (Planned& p : planned) {
      p.position = pf_position++;
      // The earliest position of a chunk declared twice (a later epoch): reading it then
      // passes only what came before its first place.
      pf_queued.try_emplace(ChunkKey{store_id, p.info.key, p.info.etag, p.index}.id(), p.position);
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

void TieredCache::Impl::prefetch_loop() {
  UniqueLock lock(pf_mu);
  for (;;) {
    pf_cv.wait(lock, [&]() SLUICE_REQUIRES(pf_mu) {
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
    if (ram->contains(key) || (disk && disk->contains(key)) || pf_ahead_chunks.contains(key.id())) {
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
bool TieredCache::Impl::wait_for_write_room(uint64_t len) {
  if (!disk || options.ram_bytes > 0) return true;
  const uint64_t need = round_up(len);
  UniqueLock lock(wq_mu);
  wq_room.wait(lock, [&]() SLUICE_REQUIRES(wq_mu) {
    return stopping || pf_quit.load(std::memory_order_relaxed) || wq_bytes + wq_reserved == 0 ||
           wq_bytes + wq_reserved + need <= options.disk_write_queue_bytes / 2;
  });
  if (stopping || pf_quit.load(std::memory_order_relaxed)) return false;
  wq_reserved += need;
  return true;
}

// After the fill: its chunk is queued (counted in wq_bytes) or was not kept.
void TieredCache::Impl::release_write_room(uint64_t len) {
  if (!disk || options.ram_bytes > 0) return;
  {
    MutexLock lock(wq_mu);
    wq_reserved -= round_up(len);
  }
  wq_room.notify_all();
}

void TieredCache::Impl::release_locked(ChunkId id) {
  auto it = pf_ahead_chunks.find(id);
  if (it == pf_ahead_chunks.end()) return;
  pf_ahead -= it->second.bytes;
  pf_ahead_chunks.erase(it);
}

// A read of chunk `id` (served from a tier: `hit`) settles its prefetch, if any, and
// passes the declared chunks more than prefetch_reorder_chunks before it: those not
// fetched yet never will be, those fetched and never read are waste and free their
// budget (so an abandoned order cannot hold it, whoever reads next).
void TieredCache::Impl::settle_prefetch(const ChunkKey& key, bool hit) {
  if (!pf_active.load(std::memory_order_relaxed)) return;  // no prefetch declared
  if (store::ServingPeer::active()) return;                // another node's read
  const ChunkId id = key.id();
  {
    MutexLock lock(pf_mu);
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

}  // namespace sluice::cache
