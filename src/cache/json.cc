// A cache's figures as JSON (sluice/cache/json.h).
#include "sluice/cache/json.h"

#include <nlohmann/json.hpp>

namespace sluice::cache {

using nlohmann::json;

namespace {

// Each field once, for both directions: its name, and where it is in a path of objects.
template <typename T>
using Fields = std::initializer_list<std::pair<const char*, T CacheStats::*>>;
const Fields<uint64_t> kCounters = {{"misses", &CacheStats::misses},
                                    {"miss_bytes", &CacheStats::miss_bytes},
                                    {"evictions", &CacheStats::evictions},
                                    {"checksum_failures", &CacheStats::checksum_failures},
                                    {"stale_drops", &CacheStats::stale_drops},
                                    {"singleflight_joins", &CacheStats::singleflight_joins},
                                    {"disk_writes_skipped", &CacheStats::disk_writes_skipped},
                                    {"objects_known", &CacheStats::objects_known}};
const Fields<uint64_t> kPrefetch = {{"fetched", &CacheStats::prefetched},
                                    {"hits", &CacheStats::prefetch_hits},
                                    {"wasted", &CacheStats::prefetch_wasted}};
const Fields<std::string> kTexts = {{"directory", &CacheStats::directory},
                                    {"policy", &CacheStats::policy},
                                    {"io_path", &CacheStats::io_path}};
const Fields<TierStats> kTiers = {{"ram", &CacheStats::ram}, {"nvme", &CacheStats::disk}};
const std::initializer_list<std::pair<const char*, uint64_t TierStats::*>> kTierFields = {
    {"bytes", &TierStats::bytes},
    {"capacity", &TierStats::capacity},
    {"chunks", &TierStats::chunks},
    {"hits", &TierStats::hits},
    {"hit_bytes", &TierStats::hit_bytes}};

const json& member(const json& j, const char* name) {
  static const json kNull;
  auto it = j.is_object() ? j.find(name) : j.end();
  return it != j.end() ? *it : kNull;
}

uint64_t number(const json& j) {
  return j.is_number_unsigned() ? j.get<uint64_t>() : 0;
}

}  // namespace

void to_json(json& j, const CacheStats& s) {
  j = json::object();
  for (auto [name, tier] : kTiers)
    for (auto [field, at] : kTierFields) j[name][field] = (s.*tier).*at;
  for (auto [name, at] : kCounters) j[name] = s.*at;
  for (auto [name, at] : kPrefetch) j["prefetch"][name] = s.*at;
  for (auto [name, at] : kTexts) j[name] = s.*at;
}

CacheStats cache_stats_from_json(const json& j) {
  CacheStats s;
  for (auto [name, tier] : kTiers) {
    // An older sluiced called the NVMe tier "disk".
    const json& t = member(j, name).is_null() && std::string_view(name) == "nvme"
                        ? member(j, "disk")
                        : member(j, name);
    for (auto [field, at] : kTierFields) (s.*tier).*at = number(member(t, field));
  }
  for (auto [name, at] : kCounters) s.*at = number(member(j, name));
  for (auto [name, at] : kPrefetch) s.*at = number(member(member(j, "prefetch"), name));
  for (auto [name, at] : kTexts)
    if (const json& t = member(j, name); t.is_string()) s.*at = t.get<std::string>();
  return s;
}

std::string chunk_tiers(const CachedChunk& c) {
  return std::string(c.in_ram ? "ram" : "") + (c.in_ram && c.on_disk ? "+" : "") +
         (c.on_disk ? "nvme" : "");
}

void to_json(json& j, const CachedChunk& c) {
  j = json{{"store", c.store},  {"key", c.key},      {"etag", c.etag},
           {"chunk", c.index},  {"bytes", c.length}, {"tiers", chunk_tiers(c)},
           {"pinned", c.pinned}};
}

void to_json(json& j, const StoreHolding& h) {
  j = json{{"store", h.store},
           {"objects", h.objects},
           {"chunks", h.chunks},
           {"bytes", h.bytes},
           {"pinned_chunks", h.pinned_chunks}};
}

void to_json(json& j, const VerifyReport& r) {
  j = json{{"chunks", r.chunks}, {"bytes", r.bytes}, {"corrupt", r.corrupt}};
}

}  // namespace sluice::cache
