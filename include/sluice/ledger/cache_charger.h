// sluice/ledger/cache_charger.h: charges a node cache's NVMe chunks to the teams whose data
// they hold, with the teams' quotas enforced before a chunk is kept.
//
//   auto charger = CacheCharger::open(ledger, [](std::string_view key) { return
//       "s3://bucket/" + std::string(key); }, {.source = "node7:/var/cache/sluice"}).value();
//   cache_options.admit_chunk = [c = charger](auto store, auto key, uint64_t bytes) {
//       return c->admit(key, bytes); };
//   cache_options.chunk_adopted = ...c->adopt(key, bytes)...;
//   cache_options.chunk_freed = ...c->freed(tag, bytes)...;
//
// A chunk belongs to the project owning its object's location (the longest project
// location it lies under: `location_of(key)`); its bytes on disk (the length rounded up to
// 4 KiB pages) are charged to that project's team on tier nvme, kind cache (both
// options). No objects are charged: chunks lie in shared segment files, not files of
// their own. Keys outside every project are kept and not charged.
//
// The charger counts, per project, the bytes of the chunks it charged that are on NVMe
// now, and the ledger holds that count as this cache's tally (Ledger::set_tally, under
// `source`): an absolute figure, so the usage equals what the cache holds whatever was
// lost on the way.
// - admit() is asked before a chunk is written to NVMe. It takes the chunk out of the
//   project's allowance: a reservation of at least `allowance_bytes` against the team's
//   quota, taken when the last one ran out (only what the chunk needs when no more fits).
//   It returns the chunk's charge tag, which the cache keeps with the chunk (in memory)
//   and hands back to freed(): 0 for a chunk no project owns. When the quota refuses even
//   that, the chunk is not kept (nullopt; the read that fetched it still succeeds) and
//   refused_chunks counts it; the team is not asked again for `refusal_memory`, and a line
//   is logged at most once a minute per project. A ledger that cannot be reached refuses
//   too: nothing is kept uncharged.
// - adopt() counts a chunk the cache found on NVMe at open, whatever the quota says (its
//   bytes are there), and returns its tag. So a daemon restarted after kill -9 recounts
//   what it holds: the charges of the interval it lost are neither lost nor counted twice.
//   When the ledger cannot say whose the chunk is (it does not answer), the chunk gets a tag
//   of its object's own, and is charged to its project at the first flush that reaches the
//   ledger (freed() before then takes it out of what will be charged), so the tally is
//   right without a restart.
// - freed(tag, bytes) is told when a chunk with a non-zero tag leaves (evicted, its object
//   changed, a checksum failure, evict by prefix): the tag's project's count drops. A
//   chunk kept uncharged (tag 0) is never uncharged, even when a project owns it by then.
// - Every `flush_interval` once started, when an allowance runs out, and on destruction,
//   each project's count goes to the ledger and the rest of its allowance is released, in
//   one transaction. A flush whose reply is lost is simply sent again: the figure is absolute.
//   So the ledger's usage trails the cache by at most one interval, and the team's quota
//   is never passed: every kept chunk lay inside a reservation. At open the charger reads
//   this source's tallies back, so a project it no longer holds chunks of drops to 0 at
//   the first flush.
// - A project removed from the ledger while chunks of it are held: its allowance retires
//   (reservation released, count dropped), and its chunks stay uncharged.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/ledger/ledger.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::ledger {

struct CacheChargerOptions {
  // Names this cache in the ledger's tallies, the same across restarts (sluiced: its host
  // name and cache directory). Required.
  std::string source;
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
  uint64_t adopted_chunks = 0, adopted_bytes = 0;  // found on NVMe at open
  uint64_t uncharged_chunks = 0;                   // keys no project owns
  uint64_t flushes = 0, flush_errors = 0;
  // Found on NVMe at open while the ledger could not say whose they were: counted in
  // adopted_* (or uncharged_chunks) at the first flush that could.
  uint64_t deferred_chunks = 0;
};

class CacheCharger {
 public:
  // Loads the projects now. A ledger that cannot be reached now (Unavailable) is asked
  // again at each flush: until it answers nothing is admitted (admit refuses), and what is
  // adopted is charged once it does. Other errors fail here. The charger admits and adopts
  // at once, but tells the ledger nothing until start().
  static Result<std::unique_ptr<CacheCharger>> open(
      std::shared_ptr<Ledger> ledger, std::function<std::string(std::string_view key)> location_of,
      CacheChargerOptions options = {});
  // Once the cache has adopted every chunk it found (it opened): reads back this source's
  // tallies (at the first flush that can, when the ledger cannot be reached now) and starts
  // the periodic flush. A charger never started (the cache failed to
  // open: say another daemon holds it) sets no tally, even when destroyed.
  Status start();
  ~CacheCharger();  // flushes, when started
  CacheCharger(const CacheCharger&) = delete;
  CacheCharger& operator=(const CacheCharger&) = delete;

  // nullopt: not kept. Else the chunk's charge tag (0: not charged).
  std::optional<uint32_t> admit(std::string_view key, uint64_t bytes);
  uint32_t adopt(std::string_view key, uint64_t bytes);
  void freed(uint32_t tag, uint64_t bytes);
  // Sets every changed project's tally and releases the allowances' rest.
  Status flush();
  CacheChargerStats stats() const;

  struct Impl;

 private:
  explicit CacheCharger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::ledger
