// sluice/cache/read_ahead.h: telling a cache the reads to come.
//
// A store that caches (the tiered cache, or sluiced through a node+ store) takes the order
// its caller will read in: it fetches ahead and, under the declared policy, evicts what is
// read furthest away. Advice only: a failed declaration costs prefetch, never a read. The
// streaming loader finds it with store.capability<cache::ReadAhead>(), through any decorator.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "sluice/core/status.h"

namespace sluice::cache {

// One read the caller will make: `length` bytes of `key` from `offset` (0: to the end).
struct PlannedRead {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The most chunks one declare() call may name (256 GiB at the default 4 MiB chunk). What
// is declared and not yet read is bounded too (four times this): past it the cache forgets
// the oldest planned fetches and stops adding to the declared eviction order.
inline constexpr size_t kMaxDeclaredChunks = size_t{1} << 16;

class ReadAhead {
 public:
  virtual ~ReadAhead() = default;
  // Appends `order` to what was declared before; more than kMaxDeclaredChunks chunks in one
  // call is InvalidArgument.
  virtual Status declare(std::span<const PlannedRead> order) = 0;
  // Reads aligned to whole chunks of this size cost the cache no more than the bytes asked.
  virtual uint64_t chunk_size() const = 0;
  // Whether parts of a chunk read one after another cost about their own bytes: the cache
  // keeps a chunk in memory once read (a RAM tier). false: each part read is a read and a
  // check of the whole chunk, so a caller that wants several parts of a chunk should read
  // the chunk once and take the parts from it.
  virtual bool keeps_chunks() const = 0;
};

}  // namespace sluice::cache
