// A cache's figures as JSON (sluice/cache/json.h): one shape, read back as written, and an
// older daemon's reply (fields missing or of another type) reads as zeros.
#include "sluice/cache/json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sluice::cache {
namespace {

TEST(CacheJson, StatsRoundTripWithTheTierNamesOfTheLedger) {
  CacheStats s;
  s.ram = {1, 2, 3, 4, 5};
  s.disk = {6, 7, 8, 9, 10};
  s.misses = 11;
  s.prefetch_wasted = 12;
  s.objects_known = 13;
  s.directory = "/c";
  nlohmann::json j = s;
  EXPECT_EQ(j["nvme"]["capacity"], 7);
  EXPECT_FALSE(j.contains("disk"));
  CacheStats back = cache_stats_from_json(j);
  EXPECT_EQ(back.disk.hit_bytes, 10u);
  EXPECT_EQ(back.ram.chunks, 3u);
  EXPECT_EQ(back.prefetch_wasted, 12u);
  EXPECT_EQ(back.objects_known, 13u);
  EXPECT_EQ(back.directory, "/c");

  CacheStats odd = cache_stats_from_json(
      nlohmann::json{{"misses", "many"}, {"nvme", 3}, {"prefetch", {{"hits", -1}}}});
  EXPECT_EQ(odd.misses, 0u);
  EXPECT_EQ(odd.disk.bytes, 0u);
  EXPECT_EQ(odd.prefetch_hits, 0u);
  EXPECT_EQ(cache_stats_from_json(nlohmann::json::array()).misses, 0u);
  // An older sluiced's reply names the NVMe tier "disk".
  EXPECT_EQ(cache_stats_from_json(nlohmann::json{{"disk", {{"bytes", 5u}}}}).disk.bytes, 5u);
}

TEST(CacheJson, ChunksAndHoldingsByStore) {
  std::vector<CachedChunk> chunks{{"s3://b", "a", "e", 0, 10, true, false, false},
                                  {"s3://b", "a", "e", 1, 10, true, true, true},
                                  {"s3://b", "c", "e", 0, 5, false, true, false},
                                  {"file:///", "x", "e", 0, 1, false, true, false}};
  EXPECT_EQ(chunk_tiers(chunks[0]), "ram");
  EXPECT_EQ(chunk_tiers(chunks[1]), "ram+nvme");
  EXPECT_EQ(nlohmann::json(chunks[2])["tiers"], "nvme");
  auto held = holdings_by_store(chunks);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].store, "file:///");
  EXPECT_EQ(held[1].objects, 2u);
  EXPECT_EQ(held[1].chunks, 3u);
  EXPECT_EQ(held[1].bytes, 25u);
  EXPECT_EQ(nlohmann::json(held[1])["pinned_chunks"], 1);
}

}  // namespace
}  // namespace sluice::cache
