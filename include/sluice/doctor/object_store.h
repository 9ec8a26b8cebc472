// sluice/doctor/object_store.h: what an object store (any store::Store, s3:// above all) can
// do for a reader: per-request latency against throughput at rising concurrency, and the
// throttling answers it gives (docs/doctor.md, "--url").
//
// The probe only reads (stat, list, ranged reads of objects that exist). It runs one level
// of concurrency after another, each for an equal share of the time budget, and stops early
// when `cancel` is set.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/doctor/diagnose.h"
#include "sluice/store/store.h"

namespace sluice::doctor {

struct StoreProbeOptions {
  double seconds = 12;                                 // the whole probe's budget
  std::vector<unsigned> concurrency = {1, 4, 16, 32};  // requests in flight per level
  uint64_t range_bytes = uint64_t{8} << 20;            // the size of one large read
  const std::atomic<bool>* cancel = nullptr;
  // Reads the store's count of slow-down answers (503, 429, SlowDown) so far; may be empty.
  std::function<uint64_t()> throttled;
};

// One level of concurrency: small-object GETs and large ranged reads, each half the time.
struct StoreLevel {
  unsigned concurrency = 0;
  double small_gets_s = 0;  // whole small objects read per second
  double bytes_s = 0;       // large ranged reads, bytes per second
};

struct StoreProbe {
  std::string uri;
  uint64_t objects_listed = 0;
  std::string small_key, big_key;
  uint64_t small_size = 0, big_size = 0;
  double latency_p50_ms = 0, latency_p90_ms = 0;  // one small GET, one at a time
  std::vector<StoreLevel> levels;
  uint64_t requests = 0, errors = 0, throttled = 0;
  std::string first_error;
};

Result<StoreProbe> probe_store(store::Store& s, const StoreProbeOptions& o);

// The causes of a slow object-store reader, most likely first; `target_bytes_s` (0: none)
// adds how many requests in flight a rate needs.
std::vector<Cause> diagnose_store(const StoreProbe& p, double target_bytes_s = 0);

std::string store_text(const StoreProbe& p, const std::vector<Cause>& causes);
std::string store_json(const StoreProbe& p, const std::vector<Cause>& causes);

}  // namespace sluice::doctor
