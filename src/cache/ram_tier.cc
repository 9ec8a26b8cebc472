#include "cache/ram_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "sluice/core/hash.h"

namespace sluice::cache {

ChunkId ChunkKey::id() const {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, store.data(), store.size());
  XXH3_64bits_update(&st, "", 1);
  XXH3_64bits_update(&st, etag.data(), etag.size());
  XXH3_64bits_update(&st, "", 1);
  XXH3_64bits_update(&st, key.data(), key.size());
  XXH3_64bits_update(&st, "", 1);
  XXH3_64bits_update(&st, &index, sizeof index);
  return XXH3_64bits_digest(&st);
}

uint64_t checksum(std::span<const std::byte> bytes) {
  return xxh3_64(bytes);
}

uint64_t copy_and_checksum(std::span<std::byte> dst, std::span<const std::byte> src) {
  constexpr size_t kBlock = 256 << 10;  // well inside L2
  Xxh3Stream st;
  for (size_t at = 0; at < src.size(); at += kBlock) {
    size_t n = std::min(kBlock, src.size() - at);
    std::memcpy(dst.data() + at, src.data() + at, n);
    st.update(dst.data() + at, n);
  }
  return st.digest();
}

RamTier::RamTier(uint64_t capacity, PolicyKind policy, telemetry::Counter* evictions)
    : capacity_(capacity), evictions_(evictions), policy_(make_policy(policy, capacity)) {}

std::shared_ptr<const Chunk> RamTier::find(const ChunkKey& key) {
  ChunkId id = key.id();
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.chunk->key != key) return nullptr;
  policy_->on_hit(id);
  return it->second.chunk;
}

bool RamTier::contains(const ChunkKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key.id());
  return it != entries_.end() && it->second.chunk->key == key;
}

bool RamTier::offer(std::shared_ptr<const Chunk> chunk, bool pinned) {
  if (capacity_ == 0) return false;
  ChunkId id = chunk->key.id();
  std::vector<std::shared_ptr<const Chunk>> dropped;  // released after the lock
  MutexLock lock(mu_);
  if (entries_.contains(id)) return false;  // there already, or a colliding key
  Admission a = policy_->admit(id, chunk->length);
  for (ChunkId v : a.evicted) {
    auto it = entries_.find(v);
    if (it == entries_.end()) continue;
    dropped.push_back(std::move(it->second.chunk));
    entries_.erase(it);
    if (evictions_) evictions_->add();
  }
  if (!a.admitted) return false;
  if (pinned) policy_->set_pinned(id, true);
  entries_[id] = Entry{std::move(chunk), pinned};
  return true;
}

size_t RamTier::drop_if(const std::function<bool(const ChunkKey&)>& match) {
  std::vector<std::shared_ptr<const Chunk>> dropped;
  MutexLock lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!match(it->second.chunk->key)) {
      ++it;
      continue;
    }
    policy_->erase(it->first);
    dropped.push_back(std::move(it->second.chunk));
    it = entries_.erase(it);
  }
  return dropped.size();
}

size_t RamTier::pin_if(const std::function<bool(const ChunkKey&)>& match, bool pinned) {
  MutexLock lock(mu_);
  size_t n = 0;
  for (auto& [id, e] : entries_) {
    if (!match(e.chunk->key)) continue;
    policy_->set_pinned(id, pinned);
    e.pinned = pinned;
    ++n;
  }
  return n;
}

void RamTier::declare(std::span<const ChunkId> order) {
  MutexLock lock(mu_);
  policy_->declare(order);
}

std::vector<RamTier::Entry> RamTier::entries() const {
  MutexLock lock(mu_);
  std::vector<Entry> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e);
  return out;
}

uint64_t RamTier::bytes() const {
  MutexLock lock(mu_);
  return policy_->resident_bytes();
}

uint64_t RamTier::chunk_count() const {
  MutexLock lock(mu_);
  return entries_.size();
}

}  // namespace sluice::cache
