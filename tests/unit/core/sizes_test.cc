#include <gtest/gtest.h>

#include "sluice/core/sizes.h"

namespace sluice {
namespace {

TEST(Sizes, ParsesBinaryUnits) {
  EXPECT_EQ(parse_size("512").value(), 512u);
  EXPECT_EQ(parse_size("4K").value(), 4096u);
  EXPECT_EQ(parse_size("4k").value(), 4096u);
  EXPECT_EQ(parse_size("4KiB").value(), 4096u);
  EXPECT_EQ(parse_size("1M").value(), 1u << 20);
  EXPECT_EQ(parse_size("4G").value(), 4ull << 30);
  EXPECT_EQ(parse_size("1.5G").value(), 3ull << 29);
  EXPECT_EQ(parse_size("2T").value(), 2ull << 40);
}

TEST(Sizes, RejectsGarbageWithAClearMessage) {
  for (const char* bad : {"", "K", "-1", "4Q", "1.3", "abc", "99999999999T"}) {
    auto r = parse_size(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
    EXPECT_NE(r.error().message().find("invalid size"), std::string::npos);
  }
}

TEST(Sizes, Formats) {
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(1 << 20), "1.00 MiB");
  EXPECT_EQ(format_size(1.5 * (1ull << 30)), "1.50 GiB");
}

// Durations print as parse_duration reads them; times in UTC.
TEST(Sizes, DurationsAndTimes) {
  using std::chrono::seconds;
  EXPECT_EQ(format_duration(seconds(604800)), "7d");
  EXPECT_EQ(format_duration(seconds(86400 * 3)), "3d");
  EXPECT_EQ(format_duration(seconds(5400)), "90m");
  EXPECT_EQ(format_duration(seconds(45)), "45s");
  EXPECT_EQ(format_duration(seconds(0)), "0s");
  for (int64_t s : {0, 59, 3600, 90000, 1209600})
    EXPECT_EQ(parse_duration("d", format_duration(seconds(s))).value(), seconds(s));
  EXPECT_EQ(format_utc(0), "-");
  EXPECT_EQ(format_utc(int64_t{86400} * 1'000'000'000 + 1), "1970-01-02 00:00:00Z");
}

}  // namespace
}  // namespace sluice
