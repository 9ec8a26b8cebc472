#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/telemetry/registry.h"
#include "sluice/telemetry/textfile.h"
#include "test_util.h"

namespace sluice::telemetry {
namespace {

TEST(Histogram, BucketsCoverEveryValueInOrder) {
  uint64_t prev_upper = 0;
  for (int i = 0; i < Histogram::kBuckets - 1; ++i) {
    EXPECT_EQ(Histogram::bucket_lower(i), prev_upper) << i;
    EXPECT_GT(Histogram::bucket_upper(i), Histogram::bucket_lower(i)) << i;
    prev_upper = Histogram::bucket_upper(i);
  }
  for (uint64_t v : {0ull, 1ull, 15ull, 16ull, 17ull, 1000ull, 123456789ull, 1ull << 62, ~0ull}) {
    int b = Histogram::bucket_of(v);
    EXPECT_GE(v, Histogram::bucket_lower(b)) << v;
    if (b + 1 < Histogram::kBuckets) {
      EXPECT_LT(v, Histogram::bucket_upper(b)) << v;
    }
  }
}

TEST(Histogram, QuantilesAreWithinTheBucketError) {
  Histogram h;
  for (uint64_t v = 1; v <= 100000; ++v) h.record(v * 1000);  // 1 us .. 100 ms in ns
  auto s = h.snapshot();
  EXPECT_EQ(s.count, 100000u);
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    double exact = q * 100000 * 1000;
    EXPECT_NEAR(s.quantile(q), exact, exact / 16) << q;
  }
  EXPECT_NEAR(s.mean(), 50000.5 * 1000, 1);
  EXPECT_EQ(s.max, 100000u * 1000);
  EXPECT_EQ(HistogramSnapshot{}.quantile(0.5), 0.0);
}

TEST(Registry, ConcurrentRecordingLosesNothing) {
  Registry r;
  Counter& c = r.counter("ops_total", {{"op", "read"}});
  Histogram& h = r.histogram("lat_seconds", {}, "", 1e-9);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c.add();
        h.record(static_cast<uint64_t>(i));
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 400000u);
  EXPECT_EQ(h.snapshot().count, 400000u);
  // The same name and labels give the same cell.
  EXPECT_EQ(&r.counter("ops_total", {{"op", "read"}}), &c);
  EXPECT_NE(&r.counter("ops_total", {{"op", "write"}}), &c);
}

TEST(Registry, PrometheusTextIsWellFormed) {
  Registry r;
  r.counter("sluice_ops_total", {{"op", "read"}}, "Ops").add(3);
  r.gauge("sluice_inflight", {}, "In flight").set(-2);
  Histogram& h = r.histogram("sluice_lat_seconds", {{"op", "read"}}, "Latency", 1e-9);
  h.record(1000);     // 1 us
  h.record(3000000);  // 3 ms
  std::string text = r.prometheus_text();
  EXPECT_NE(text.find("# TYPE sluice_ops_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_ops_total{op=\"read\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_inflight -2\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE sluice_lat_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_lat_seconds_bucket{op=\"read\",le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_lat_seconds_count{op=\"read\"} 2\n"), std::string::npos);
  // Buckets are cumulative and never decrease.
  uint64_t last = 0;
  size_t pos = 0;
  while ((pos = text.find("sluice_lat_seconds_bucket", pos)) != std::string::npos) {
    size_t sp = text.find(' ', text.find('}', pos));
    uint64_t v = std::stoull(text.substr(sp + 1));
    EXPECT_GE(v, last);
    last = v;
    ++pos;
  }
  EXPECT_EQ(last, 2u);
}

TEST(Registry, JsonExportParses) {
  Registry r;
  r.counter("a_total").add(7);
  r.histogram("b_seconds", {}, "", 1e-9).record(2000);
  auto j = nlohmann::json::parse(r.json_text());
  EXPECT_EQ(j["counters"][0]["name"], "a_total");
  EXPECT_EQ(j["counters"][0]["value"], 7);
  EXPECT_EQ(j["histograms"][0]["count"], 1);
  EXPECT_NEAR(j["histograms"][0]["p50"].get<double>(), 2e-6, 2e-6 / 16);
}

TEST(Registry, OneNameOneKind) {
  Registry r;
  r.counter("x");
  EXPECT_THROW(r.gauge("x"), std::logic_error);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TextfileExporter, WritesNowPeriodicallyAndAtStopWholeFilesOnly) {
  sluice::testing::TempDir dir;
  Registry r;
  Counter& c = r.counter("sluice_test_total", {}, "a test counter");
  c.add(1);
  const std::string path = dir.file("m.prom");
  auto e = TextfileExporter::start(r, path, std::chrono::milliseconds(20)).value();
  EXPECT_NE(slurp(path).find("sluice_test_total 1"), std::string::npos);  // written at start
  c.add(1);
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = slurp(path).find("sluice_test_total 2") != std::string::npos;
  }
  EXPECT_TRUE(seen);  // a periodic write
  c.add(1);
  ASSERT_TRUE(e->stop());
  EXPECT_NE(slurp(path).find("sluice_test_total 3"), std::string::npos);  // the last figures
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u);  // no temporary left beside it
  auto bad = TextfileExporter::start(r, dir.file("no/such/dir/m.prom"), std::chrono::seconds(1));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("metrics file"), std::string::npos);
  // A FIFO (or a device node) where the file should be is refused and left as it was.
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0644), 0);
  auto fifo = TextfileExporter::start(r, dir.file("fifo"), std::chrono::seconds(1));
  ASSERT_FALSE(fifo);
  EXPECT_EQ(fifo.error().code(), Code::kInvalidArgument);
  struct stat st;
  ASSERT_EQ(::lstat(dir.file("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace sluice::telemetry
