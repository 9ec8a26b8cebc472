// The RAM tier: chunks in memory, bounded by bytes, evicted by an EvictionPolicy.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/chunk.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cache {

class RamTier {
 public:
  // `evictions` (may be null) counts chunks evicted for room.
  RamTier(uint64_t capacity, PolicyKind policy, telemetry::Counter* evictions = nullptr);

  // The chunk if resident (a hit for the policy), else null.
  std::shared_ptr<const Chunk> find(const ChunkKey& key);
  bool contains(const ChunkKey& key) const;
  // Offers a chunk after a miss; returns whether it was admitted. Evicted chunks stay
  // alive while readers still hold them, but no longer count against the tier.
  bool offer(std::shared_ptr<const Chunk> chunk, bool pinned);
  // Drops (or pins, or unpins) every chunk whose key matches; returns how many.
  size_t drop_if(const std::function<bool(const ChunkKey&)>& match);
  size_t pin_if(const std::function<bool(const ChunkKey&)>& match, bool pinned);
  void declare(std::span<const ChunkId> order);

  struct Entry {
    std::shared_ptr<const Chunk> chunk;
    bool pinned = false;
  };
  // A copy of the entries (for listings and stats).
  std::vector<Entry> entries() const;
  uint64_t bytes() const;
  uint64_t chunk_count() const;
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t capacity_;
  telemetry::Counter* evictions_;
  mutable Mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ SLUICE_GUARDED_BY(mu_);
  std::unordered_map<ChunkId, Entry> entries_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::cache
