// sluice/ledger/cache_charger.h: charges a node cache's NVMe chunks to the teams whose data
// they hold, with the teams' quotas enforced before a chunk is kept.
//
//   auto charger = CacheCharger::open(ledger, [](std::string_view key) { return
//       "s3://bucket/" + std::string(key); }).value();
//   cache_options.admit_chunk = [c = charger](auto store, auto key, uint64_t bytes) {
//       return c->admit(key, bytes); };
//   cache_options.chunk_freed = ...c->freed(key, bytes)...;
//
// A chunk belongs to the project owning its object's location (the longest project
// location it lies under: `location_of(key)`); its bytes on disk (the length rounded up
// to 4 KiB pages) are charged to that project's team on tier nvme, kind cache (both
// options). No objects are charged: chunks lie in shared segment files, not files of
// their own. Keys outside every project are kept and not charged.
//
// - admit() is asked before a chunk is written to NVMe. It takes the chunk out of the
//   project's allowance: a reservation of at least `allowance_bytes` against the team's
//   quota, taken when the last one ran out (only what the chunk needs when no more fits).
//   When the quota refuses even that, the chunk is not kept (the read that fetched it
//   still succeeds) and refused_chunks counts it; the team is not asked again for
//   `refusal_memory`, and a line is logged at most once a minute per project. A ledger that
//   cannot be reached refuses too: nothing is kept uncharged.
// - freed() is told when an admitted chunk leaves (evicted, its object changed, a
//   checksum failure, evict by prefix): the usage drops by its bytes.
// - Every `flush_interval`, when an allowance runs out, and on destruction, what was
//   admitted since the last flush is committed (the usage grows by it, less what was
//   freed), and the rest of the allowance is released. So the ledger's usage trails the
//   cache by at most one interval, and the team's quota is never passed: every kept chunk
//   lay inside a reservation. A daemon killed between two flushes loses the charges of
//   that interval (its reservation expires on its own), and since the cache does not
//   record which chunks were charged, those chunks are uncharged again when they leave:
//   the usage ends short by up to twice what was admitted meanwhile (docs/ledger.md lists
//   every such drift). `sluice usage reconcile` does not recount caches.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/ledger/ledger.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::ledger {

struct CacheChargerOptions {
  Tier tier = Tier::kNvme;
  Kind kind = Kind::kCache;
  uint64_t allowance_bytes = 64ull << 20;
  std::chrono::milliseconds flush_interval{2000};
  std::chrono::milliseconds refusal_memory{1000};
  // Refusals and ledger errors, one line each (at most once a minute per project); null:
  // silent.
  std::function<void(std::string_view)> log;
  // Where per-team counters go (sluice_cache_charged_bytes_total,
  // sluice_cache_charge_refused_chunks_total, labelled by team); null: none.
  telemetry::Registry* registry = nullptr;
};

struct CacheChargerStats {
  uint64_t admitted_chunks = 0, admitted_bytes = 0;
  uint64_t refused_chunks = 0, refused_bytes = 0;
  uint64_t freed_bytes = 0;
  uint64_t uncharged_chunks = 0;  // keys no project owns
  uint64_t flushes = 0, flush_errors = 0;
};

class CacheCharger {
 public:
  // Loads the projects now: a ledger that cannot be reached fails here.
  static Result<std::unique_ptr<CacheCharger>> open(
      std::shared_ptr<Ledger> ledger, std::function<std::string(std::string_view key)> location_of,
      CacheChargerOptions options = {});
  ~CacheCharger();  // flushes
  CacheCharger(const CacheCharger&) = delete;
  CacheCharger& operator=(const CacheCharger&) = delete;

  bool admit(std::string_view key, uint64_t bytes);
  void freed(std::string_view key, uint64_t bytes);
  // Commits what was admitted and freed so far, releases the allowances' rest.
  Status flush();
  CacheChargerStats stats() const;

  struct Impl;

 private:
  explicit CacheCharger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::ledger
