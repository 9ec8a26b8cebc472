// xxh3_64 and Xxh3Stream give XXH3_64bits's values on whichever path the CPU takes.
#include "sluice/core/hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace sluice {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(Xxh3, MatchesTheLibraryForEverySizeClass) {
  // XXH3 has separate code for 0, 1-3, 4-8, 9-16, 17-128, 129-240 bytes and longer ones
  // (stripes, blocks); sizes around each boundary, up to several blocks.
  std::vector<std::byte> data = random_bytes((4 << 20) + 77, 1);
  for (size_t n : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 4095, 65536, 65537,
                   (1 << 20) + 3, (4 << 20) + 77}) {
    EXPECT_EQ(xxh3_64(data.data(), n), XXH3_64bits(data.data(), n)) << n << " bytes";
    EXPECT_EQ(xxh3_64(std::span(data).subspan(1, n - (n > 0))),
              XXH3_64bits(data.data() + 1, n - (n > 0)))
        << n << " bytes, unaligned";
  }
  std::string path = xxh3_path();
  EXPECT_TRUE(path == "avx2" || path == "sse2") << path;
}

TEST(Xxh3, AStreamInAnyPiecesEqualsOneShot) {
  std::vector<std::byte> data = random_bytes(3 << 20, 2);
  std::mt19937 rng(3);
  Xxh3Stream s;
  for (int round = 0; round < 5; ++round) {
    s.reset();
    for (size_t at = 0; at < data.size();) {
      size_t n = std::min<size_t>(data.size() - at, rng() % 300000);
      s.update(data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(s.digest(), XXH3_64bits(data.data(), data.size())) << "round " << round;
  }
  s.reset();
  EXPECT_EQ(s.digest(), XXH3_64bits(nullptr, 0));
}

}  // namespace
}  // namespace sluice
