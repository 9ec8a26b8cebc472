// The daemon's status as a type (sluice/node/stats.h): its JSON round trip, a reply from an
// older daemon, and a mistyped field.
#include "sluice/node/stats.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sluice::node {
namespace {

DaemonStats sample() {
  DaemonStats s;
  s.cache.ram.bytes = 7;
  s.cache.disk.capacity = 1 << 30;
  s.cache.misses = 3;
  s.cache.directory = "/nvme/cache";
  s.chunk_size = 4 << 20;
  s.server.connections = 5;
  s.server.windows_bytes = 8 << 20;
  s.charging = ChargingStats{.ledger = "sqlite:///l.db", .admitted_bytes = 99, .flush_errors = 1};
  s.peers.push_back(PeerStatus{.name = "n1",
                               .address = "10.0.0.2:7070",
                               .up = false,
                               .state = "down",
                               .errors = 4,
                               .last_error = "refused"});
  s.backing_bytes = 11;
  s.peer_bytes = 12;
  return s;
}

TEST(DaemonStats, RoundTripsThroughJson) {
  const nlohmann::json j = sample();
  EXPECT_EQ(j["server"]["connections"], 5);
  EXPECT_EQ(j["charging"]["ledger"], "sqlite:///l.db");
  EXPECT_EQ(j["peers"][0]["state"], "down");
  EXPECT_EQ(j["bytes_from"]["peer"], 12);
  EXPECT_EQ(j["ram"]["bytes"], 7);  // the cache's fields at the top level
  auto back = daemon_stats_from_json(j);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(nlohmann::json(*back), j);
  DaemonStats none;
  const nlohmann::json k = none;
  EXPECT_TRUE(k["charging"].is_null());
  EXPECT_FALSE(daemon_stats_from_json(k).value().charging);
}

TEST(DaemonStats, AnOlderDaemonsReplyReadsAsZeros) {
  auto s = daemon_stats_from_json(
      nlohmann::json{{"misses", 2u},  // as the wire parses: unsigned
                     {"server", {{"connections", 1}}},
                     {"peers", {{{"name", "n0"}, {"self", true}}, {{"name", "n1"}}}}});
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->cache.misses, 2u);
  EXPECT_EQ(s->server.connections, 1u);
  EXPECT_EQ(s->server.requests, 0u);
  ASSERT_EQ(s->peers.size(), 2u);
  EXPECT_EQ(s->peers[0].state, "self");  // derived where a daemon sent none
  EXPECT_EQ(s->peers[1].state, "untried");
}

TEST(DaemonStats, AMistypedFieldIsCorruptionNamingIt) {
  for (const auto& [j, words] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::array(), "not an object"},
           {{{"server", {{"requests", "many"}}}}, "\"requests\""},
           {{{"server", {{"requests", -1}}}}, "\"requests\""},
           {{{"peers", {{"name", "n0"}}}}, "\"peers\""},
           {{{"peers", {{{"up", 1}}}}}, "\"up\""},
           {{{"charging", {{"ledger", 3}}}}, "\"ledger\""},
           {{{"bytes_from", 5}}, "bytes_from"},
           {{{"chunk_size", 1.5}}, "\"chunk_size\""}}) {
    auto s = daemon_stats_from_json(j);
    ASSERT_FALSE(s) << j.dump();
    EXPECT_EQ(s.error().code(), Code::kCorruption);
    EXPECT_NE(s.error().message().find(words), std::string::npos)
        << j.dump() << ": " << s.error().message();
  }
}

}  // namespace
}  // namespace sluice::node
