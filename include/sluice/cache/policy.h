// sluice/cache/policy.h: which chunks a cache tier keeps.
//
// A tier (RAM, NVMe) holds chunks up to a byte capacity; an EvictionPolicy decides which
// chunk a miss may bring in and which resident chunks leave to make room. Policies see
// only chunk ids and sizes, never bytes, so they are tested on traces alone.
//
// Policies:
// - kS3Fifo (default): S3-FIFO's queues (a small FIFO that new chunks enter, 10% of the
//   capacity, and a main FIFO with one-bit-per-hit reinsertion, as in Yang et al., SOSP
//   2023) with a TinyLFU admission filter between them: a chunk leaving the small queue
//   enters a full main queue only if a frequency sketch says it was read more often than
//   the chunk it would push out. The filter is what makes the cache survive epochs: a
//   dataset larger than the cache read in a loop fills the main queue once and then stays,
//   instead of churning it every epoch (plain S3-FIFO, like LRU and CLOCK, gets no hits on
//   a loop larger than the cache).
// - kLru: least recently used, for comparison.
// - kDeclared: Belady's rule on an order the caller declared (`declare`): evict the chunk
//   whose next declared read is furthest away, and do not admit a chunk whose next read is
//   further than every resident's. Chunks with no declared read left go first, oldest
//   first. With no declaration it evicts in FIFO order.
//
// Contract:
// - Resident bytes never exceed the capacity. A chunk larger than the capacity is never
//   admitted. Pinned chunks are never evicted; when only pinned bytes remain, admit
//   refuses.
// - `admit` is called after a miss on a chunk that is not resident; `on_hit` after a read
//   that found it resident. The chunks in Admission::evicted are already forgotten by the
//   policy: the tier must drop them.
// - Not thread-safe: the tier calls a policy under its own lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::cache {

// A chunk as a policy knows it; the tier maps its chunk keys to these.
using ChunkId = uint64_t;

enum class PolicyKind { kS3Fifo, kLru, kDeclared };

// "s3fifo", "lru", "declared".
std::string_view policy_name(PolicyKind kind);
Result<PolicyKind> parse_policy(std::string_view name);

struct Admission {
  bool admitted = false;
  std::vector<ChunkId> evicted;  // resident chunks the tier must drop now
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // A read found `id` resident.
  virtual void on_hit(ChunkId id) = 0;
  // A read missed `id` (not resident) and the tier fetched `bytes` of it: admit it or not.
  virtual Admission admit(ChunkId id, uint64_t bytes) = 0;
  // Puts back a chunk that was resident before a restart, without an admission test (into
  // the main queue where there is one). Evicts only if the capacity shrank.
  virtual Admission restore(ChunkId id, uint64_t bytes) = 0;
  // Forgets `id` (the tier dropped it: stale, corrupt, evicted by command). No-op if absent.
  virtual void erase(ChunkId id) = 0;
  // Pinned chunks are never evicted. No-op if `id` is not resident.
  virtual void set_pinned(ChunkId id, bool pinned) = 0;
  // Appends reads the caller will make, in order. Only kDeclared uses them.
  virtual void declare(std::span<const ChunkId> order) { (void)order; }

  virtual bool contains(ChunkId id) const = 0;
  virtual uint64_t resident_bytes() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual PolicyKind kind() const = 0;
};

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, uint64_t capacity_bytes);

// What a policy is told of a trace before it is replayed.
enum class TraceDeclare {
  kNothing,    // reads only
  kEachEpoch,  // each epoch's order, as that epoch starts (what a loader can do)
  kAll,        // every epoch's order up front (with kDeclared: the offline optimum)
};

// Replays epochs of reads of `chunk_bytes`-sized chunks through `policy` (admitting on
// every miss); returns each epoch's hit ratio. For trace tests and capacity planning.
std::vector<double> replay_trace(EvictionPolicy& policy,
                                 std::span<const std::vector<ChunkId>> epochs, uint64_t chunk_bytes,
                                 TraceDeclare declare);

}  // namespace sluice::cache
