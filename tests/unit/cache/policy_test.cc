// Eviction policies on traces: the hit ratios issue 7 asks for, and the capacity and
// pinning rules every policy keeps.
#include "sluice/cache/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

namespace sluice::cache {
namespace {

constexpr uint64_t kChunk = 4 << 20;

std::vector<double> replay(EvictionPolicy& p, const std::vector<std::vector<ChunkId>>& epochs,
                           bool declare_each) {
  return replay_trace(p, epochs, kChunk,
                      declare_each ? TraceDeclare::kEachEpoch : TraceDeclare::kNothing);
}

std::vector<ChunkId> in_order(size_t n) {
  std::vector<ChunkId> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The trace of the issue: a dataset 1.5x the cache, read in order, three epochs.
TEST(PolicyTrace, LoopLargerThanCacheKeepsHitsFromEpochTwo) {
  const size_t cache_chunks = 1000, dataset = 1500;
  std::vector<std::vector<ChunkId>> epochs(3, in_order(dataset));
  auto s3 = make_policy(PolicyKind::kS3Fifo, cache_chunks * kChunk);
  auto lru = make_policy(PolicyKind::kLru, cache_chunks * kChunk);
  std::vector<double> s3r = replay(*s3, epochs, false), lrur = replay(*lru, epochs, false);
  EXPECT_EQ(s3r[0], 0.0);
  std::printf("in order: s3fifo %.3f %.3f %.3f, lru %.3f %.3f %.3f\n", s3r[0], s3r[1], s3r[2],
              lrur[0], lrur[1], lrur[2]);
  for (size_t e = 1; e < 3; ++e) {
    EXPECT_GE(s3r[e], 0.5) << "epoch " << e + 1;
    EXPECT_EQ(lrur[e], 0.0) << "epoch " << e + 1;
  }
}

std::vector<std::vector<ChunkId>> shuffled_epochs(size_t n, size_t count, uint64_t seed) {
  std::vector<std::vector<ChunkId>> epochs;
  std::mt19937_64 rng(seed);
  for (size_t e = 0; e < count; ++e) {
    auto v = in_order(n);
    std::shuffle(v.begin(), v.end(), rng);
    epochs.push_back(std::move(v));
  }
  return epochs;
}

// Reshuffled every epoch, declared one epoch at a time, against Belady with the whole
// trace known in advance (the offline optimum).
TEST(PolicyTrace, DeclaredOrderNearOfflineOptimum) {
  const size_t cache_chunks = 1000, dataset = 1500;
  auto epochs = shuffled_epochs(dataset, 3, 7);
  auto declared = make_policy(PolicyKind::kDeclared, cache_chunks * kChunk);
  std::vector<double> got = replay(*declared, epochs, true);

  auto oracle = make_policy(PolicyKind::kDeclared, cache_chunks * kChunk);
  std::vector<double> best = replay_trace(*oracle, epochs, kChunk, TraceDeclare::kAll);

  auto s3 = make_policy(PolicyKind::kS3Fifo, cache_chunks * kChunk);
  std::vector<double> s3r = replay(*s3, epochs, false);
  std::printf(
      "reshuffled: declared %.3f %.3f %.3f, optimum %.3f %.3f %.3f, s3fifo %.3f %.3f %.3f\n",
      got[0], got[1], got[2], best[0], best[1], best[2], s3r[0], s3r[1], s3r[2]);
  for (size_t e = 1; e < 3; ++e) {
    EXPECT_GE(got[e], 0.6) << "epoch " << e + 1;
    EXPECT_GE(got[e], best[e] - 0.05) << "epoch " << e + 1;
    EXPECT_GE(got[e], s3r[e]) << "epoch " << e + 1;
  }
}

// A hot set read over and over, interrupted by a one-time scan twice the cache's size:
// the scan must not flush the hot set.
TEST(PolicyTrace, ScanDoesNotFlushTheHotSet) {
  auto p = make_policy(PolicyKind::kS3Fifo, 100 * kChunk);
  std::vector<ChunkId> hot = in_order(50);
  for (int round = 0; round < 5; ++round) {
    for (ChunkId id : hot) p->contains(id) ? p->on_hit(id) : (void)p->admit(id, kChunk);
  }
  for (ChunkId id = 1000; id < 1200; ++id) (void)p->admit(id, kChunk);
  size_t kept = std::count_if(hot.begin(), hot.end(), [&](ChunkId id) { return p->contains(id); });
  EXPECT_GE(kept, 45u);
}

// Every policy: resident bytes never exceed capacity, evicted chunks were resident, pinned
// chunks stay, sizes vary, including chunks larger than the whole capacity.
class PolicyRules : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(PolicyRules, CapacityEvictionsAndPinsHoldOnARandomTrace) {
  const uint64_t capacity = 64 << 20;
  auto p = make_policy(GetParam(), capacity);
  std::mt19937_64 rng(42);
  std::set<ChunkId> resident, pinned;
  std::vector<ChunkId> future;
  for (int i = 0; i < 2000; ++i) future.push_back(rng() % 300);
  p->declare(future);
  for (int i = 0; i < 2000; ++i) {
    ChunkId id = future[i];
    uint64_t bytes = id == 13 ? capacity + 1 : (1 + id % 7) << 20;
    if (p->contains(id)) {
      ASSERT_TRUE(resident.contains(id));
      p->on_hit(id);
    } else {
      ASSERT_FALSE(resident.contains(id));
      Admission a = p->admit(id, bytes);
      for (ChunkId v : a.evicted) {
        ASSERT_TRUE(resident.erase(v)) << v << " evicted but not resident";
        ASSERT_FALSE(pinned.contains(v)) << v << " pinned but evicted";
      }
      if (a.admitted) resident.insert(id);
      if (id == 13) {
        ASSERT_FALSE(a.admitted);
      }
      if (a.admitted && i % 97 == 0 && pinned.size() < 3) {
        p->set_pinned(id, true);
        pinned.insert(id);
      }
    }
    ASSERT_EQ(p->contains(id), resident.contains(id));
    ASSERT_LE(p->resident_bytes(), capacity);
    if (i % 500 == 499 && !pinned.empty()) {  // unpin one, erase another
      ChunkId u = *pinned.begin();
      p->set_pinned(u, false);
      pinned.erase(u);
      p->erase(u);
      resident.erase(u);
      ASSERT_FALSE(p->contains(u));
    }
  }
  for (ChunkId id : pinned) EXPECT_TRUE(p->contains(id));
}

TEST_P(PolicyRules, RestoreRefillsWithoutAnAdmissionTest) {
  auto p = make_policy(GetParam(), 10 * kChunk);
  for (ChunkId id = 0; id < 10; ++id) EXPECT_TRUE(p->restore(id, kChunk).admitted);
  EXPECT_EQ(p->resident_bytes(), 10 * kChunk);
  Admission a = p->restore(99, kChunk);  // over capacity: something has to go
  EXPECT_LE(p->resident_bytes(), 10 * kChunk);
  EXPECT_EQ(a.admitted ? a.evicted.size() : 0u, a.admitted ? 1u : 0u);
}

INSTANTIATE_TEST_SUITE_P(All, PolicyRules,
                         ::testing::Values(PolicyKind::kS3Fifo, PolicyKind::kLru,
                                           PolicyKind::kDeclared),
                         [](const auto& p) { return std::string(policy_name(p.param)); });

TEST(Policy, NamesRoundTrip) {
  for (auto k : {PolicyKind::kS3Fifo, PolicyKind::kLru, PolicyKind::kDeclared}) {
    EXPECT_EQ(parse_policy(policy_name(k)).value(), k);
  }
  auto bad = parse_policy("arc");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("arc"), std::string::npos);
}

}  // namespace
}  // namespace sluice::cache
