// What the cache's tiers hold: chunks of one version (etag) of one object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "sluice/cache/policy.h"
#include "sluice/mem/buffer_pool.h"

namespace sluice::cache {

struct ChunkKey {
  std::string store;  // the backing store's identity (CacheOptions::store_id)
  std::string key;    // the object's key in the backing store
  std::string etag;   // the version the bytes belong to
  uint64_t index = 0;

  bool operator==(const ChunkKey&) const = default;
  // XXH3-64 of the four fields. Tiers index by it and compare the whole key on lookup,
  // so a collision is a miss, never wrong bytes.
  ChunkId id() const;
};

// A chunk's bytes wherever they lie (a Chunk's buffer, or a reader's own), to write to NVMe.
struct ChunkView {
  const ChunkKey& key;
  std::span<const std::byte> bytes;  // starts 4 KiB-aligned (for O_DIRECT)
  uint64_t xxh3 = 0;                 // of bytes
  uint64_t object_size = 0;
  int64_t object_mtime_ns = 0;
};

// A chunk's bytes in memory. Immutable once made: tiers and readers share it.
struct Chunk {
  ChunkKey key;
  uint64_t length = 0;
  uint64_t xxh3 = 0;  // of bytes()
  uint64_t object_size = 0;
  int64_t object_mtime_ns = 0;
  PooledBuffer buf;  // at least `length` bytes, 4 KiB-aligned (for O_DIRECT)

  std::span<const std::byte> bytes() const { return {buf.data(), length}; }
  ChunkView view() const { return {key, bytes(), xxh3, object_size, object_mtime_ns}; }
};

uint64_t checksum(std::span<const std::byte> bytes);
// Copies `src` into `dst` (at least as large) and returns checksum(src), in one pass: each
// block is hashed while it is still in cache, which saves a trip to memory per byte.
uint64_t copy_and_checksum(std::span<std::byte> dst, std::span<const std::byte> src);

// Decides whether a chunk of `key` is pinned (declared by a job).
using PinPredicate = std::function<bool(const std::string& key)>;

}  // namespace sluice::cache
