// A cache's figures as JSON (sluice/cache/json.h).
#include "sluice/cache/json.h"

#include <nlohmann/json.hpp>

namespace sluice::cache {

using nlohmann::json;

namespace {

json tier_json(const TierStats& t) {
  return json{{"bytes", t.bytes},
              {"capacity", t.capacity},
              {"chunks", t.chunks},
              {"hits", t.hits},
              {"hit_bytes", t.hit_bytes}};
}

uint64_t number(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

std::string text(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const json& object(const json& j, const char* name) {
  static const json kEmpty = json::object();
  auto it = j.find(name);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

TierStats tier_of(const json& j) {
  return {number(j, "bytes"), number(j, "capacity"), number(j, "chunks"), number(j, "hits"),
          number(j, "hit_bytes")};
}

}  // namespace

void to_json(json& j, const CacheStats& s) {
  j = json{{"ram", tier_json(s.ram)},
           {"nvme", tier_json(s.disk)},
           {"misses", s.misses},
           {"miss_bytes", s.miss_bytes},
           {"evictions", s.evictions},
           {"checksum_failures", s.checksum_failures},
           {"stale_drops", s.stale_drops},
           {"singleflight_joins", s.singleflight_joins},
           {"prefetch",
            {{"fetched", s.prefetched}, {"hits", s.prefetch_hits}, {"wasted", s.prefetch_wasted}}},
           {"disk_writes_skipped", s.disk_writes_skipped},
           {"objects_known", s.objects_known},
           {"directory", s.directory},
           {"policy", s.policy},
           {"io_path", s.io_path}};
}

CacheStats cache_stats_from_json(const json& j) {
  CacheStats s;
  if (!j.is_object()) return s;
  s.ram = tier_of(object(j, "ram"));
  s.disk = tier_of(object(j, "nvme"));
  s.misses = number(j, "misses");
  s.miss_bytes = number(j, "miss_bytes");
  s.evictions = number(j, "evictions");
  s.checksum_failures = number(j, "checksum_failures");
  s.stale_drops = number(j, "stale_drops");
  s.singleflight_joins = number(j, "singleflight_joins");
  s.disk_writes_skipped = number(j, "disk_writes_skipped");
  const json& p = object(j, "prefetch");
  s.prefetched = number(p, "fetched");
  s.prefetch_hits = number(p, "hits");
  s.prefetch_wasted = number(p, "wasted");
  s.objects_known = number(j, "objects_known");
  s.directory = text(j, "directory");
  s.policy = text(j, "policy");
  s.io_path = text(j, "io_path");
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
