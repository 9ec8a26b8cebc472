// sluice/cache/json.h: a cache's figures as JSON, one shape wherever they are shown (`sluice
// cache stat --json` of a directory or of sluiced, sluiced's CACHE_STAT reply, a binding).
// The tiers are "ram" and "nvme", as in the ledger and the metrics.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "sluice/cache/control.h"
#include "sluice/cache/tiered_cache.h"

namespace sluice::cache {

// {"ram": {bytes, capacity, chunks, hits, hit_bytes}, "nvme": {...}, "misses", "miss_bytes",
//  "evictions", "checksum_failures", "stale_drops", "singleflight_joins", "prefetch":
//  {fetched, hits, wasted}, "disk_writes_skipped", "objects_known", "directory", "policy",
//  "io_path"}
void to_json(nlohmann::json& j, const CacheStats& s);
// The other way; a field missing or of another type (an older sluiced) reads as 0 or "".
CacheStats cache_stats_from_json(const nlohmann::json& j);

// "ram", "nvme" or "ram+nvme": where a chunk is.
std::string chunk_tiers(const CachedChunk& c);
// {store, key, etag, chunk, bytes, tiers, pinned}
void to_json(nlohmann::json& j, const CachedChunk& c);
// {store, objects, chunks, bytes, pinned_chunks}
void to_json(nlohmann::json& j, const StoreHolding& h);
// {chunks, bytes, corrupt}
void to_json(nlohmann::json& j, const VerifyReport& r);

}  // namespace sluice::cache
