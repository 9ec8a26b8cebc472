// The one backoff (core/backoff.h): within its cap, growing with the attempt, never negative.
#include "core/backoff.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(Backoff, FullJitterUnderAnExponentialCap) {
  for (unsigned attempt = 0; attempt < 40; ++attempt) {
    const uint64_t cap = std::min<uint64_t>(2'500'000, uint64_t{10'000} << std::min(attempt, 20u));
    uint64_t most = 0;
    for (int i = 0; i < 200; ++i) {
      auto d = backoff_delay(attempt, milliseconds(10), milliseconds(2500));
      ASSERT_GE(d.count(), 0);
      ASSERT_LE(static_cast<uint64_t>(d.count()), cap) << attempt;
      most = std::max<uint64_t>(most, static_cast<uint64_t>(d.count()));
    }
    EXPECT_GT(most, cap / 2) << "200 draws all in the lower half: not uniform";
  }
  EXPECT_EQ(backoff_delay(3, milliseconds(10), microseconds(0)).count(), 0);
  EXPECT_EQ(backoff_delay(3, microseconds(0), milliseconds(10)).count(), 0);
}

}  // namespace
}  // namespace sluice
