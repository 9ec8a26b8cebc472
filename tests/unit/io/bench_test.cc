// The bench engine (sluice/io/bench.h) and the ceiling sweep built on it
// (sluice/doctor/sweep.h), called as a library: typed results, progress, cancellation and
// the refusals that protect what --file names.
#include <atomic>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "sluice/doctor/sweep.h"
#include "sluice/io/bench.h"
#include "test_util.h"

namespace sluice::io {
namespace {

using sluice::testing::TempDir;

TEST(Bench, LaysOutAFileReadsItBackAndVerifiesEveryByte) {
  TempDir dir;
  BenchOptions o;
  o.file = dir.file("bench.dat");
  o.mode = BenchMode::kBuffered;
  o.bs = 64 << 10;
  o.qd = 4;
  o.size = 4 << 20;
  o.verify = true;
  uint64_t reported = 0, total = 0;
  o.on_lay_out = [&](uint64_t done, uint64_t of) {
    EXPECT_GE(done, reported);
    reported = done;
    total = of;
  };
  auto r = run_bench(o);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(total, uint64_t{4} << 20);
  EXPECT_EQ(reported, total);
  EXPECT_EQ(r->bytes, uint64_t{4} << 20);
  EXPECT_EQ(r->ops, 64u);
  EXPECT_TRUE(r->verified);
  EXPECT_EQ(r->mode, "buffered");
  EXPECT_GT(r->throughput_gib_s, 0);
  EXPECT_NE(r->json().find("\"verified\":true"), std::string::npos);
}

TEST(Bench, RefusesWhatItMustNotMeasureBeforeAnyIo) {
  TempDir dir;
  BenchOptions o;
  o.file = dir.file("x.dat");
  o.bs = 0;
  o.size = 1 << 20;
  EXPECT_EQ(run_bench(o).error().code(), Code::kInvalidArgument);
  o.bs = 1 << 20;
  o.size.reset();
  EXPECT_EQ(run_bench(o).error().code(), Code::kNotFound);  // no file and no size
  o.file = "/proc/self/status";
  EXPECT_EQ(run_bench(o).error().code(), Code::kInvalidArgument);
  o.file = dir.path();
  EXPECT_EQ(run_bench(o).error().code(), Code::kInvalidArgument);
  EXPECT_FALSE(std::ifstream(dir.file("x.dat")).good());
}

TEST(Bench, ACancelledLayOutStopsWithCancelled) {
  TempDir dir;
  std::atomic<bool> cancel{true};
  BenchOptions o;
  o.file = dir.file("bench.dat");
  o.mode = BenchMode::kBuffered;
  o.size = 64 << 20;
  o.cancel = &cancel;
  auto r = run_bench(o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kCancelled);
}

TEST(Sweep, MeasuresTheGridWithinItsBudgetAndStopsWhenCancelled) {
  TempDir dir;
  BenchOptions lay;
  lay.file = dir.file("ceiling.dat");
  lay.mode = BenchMode::kBuffered;
  lay.size = 8 << 20;
  ASSERT_TRUE(run_bench(lay));
  doctor::SweepOptions o;
  o.budget = 1;  // four points of 0.25 s: the most telling ones
  size_t calls = 0, count = 0;
  o.on_point = [&](size_t i, size_t n, std::string_view, uint64_t, unsigned) {
    EXPECT_EQ(i, calls + 1);
    ++calls;
    count = n;
  };
  auto c = doctor::sweep(lay.file, o);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(count, 4u);
  EXPECT_GE(calls, 1u);
  EXPECT_FALSE(c->points.empty());
  EXPECT_TRUE(c->best().has_value());

  std::atomic<bool> cancel{true};
  o.cancel = &cancel;
  EXPECT_EQ(doctor::sweep(lay.file, o).error().code(), Code::kCancelled);
  EXPECT_EQ(doctor::sweep(dir.file("missing"), {}).error().code(), Code::kNotFound);
}

TEST(Sweep, AScratchFileIsOursAndGoesAway) {
  TempDir dir;
  std::string path;
  {
    uint64_t laid = 0;
    doctor::ScratchOptions o;
    o.size = 16 << 20;
    o.on_lay_out = [&](uint64_t done, uint64_t) { laid = done; };
    auto s = doctor::ScratchFile::create(dir.path(), o);
    ASSERT_TRUE(s) << s.error().to_string();
    path = (*s)->path();
    EXPECT_EQ((*s)->size(), uint64_t{16} << 20);
    EXPECT_EQ(laid, uint64_t{16} << 20);
    EXPECT_EQ(std::filesystem::file_size(path), uint64_t{16} << 20);
    // A second doctor of this process finds the name taken and leaves that file alone.
    EXPECT_EQ(doctor::ScratchFile::create(dir.path(), o).error().code(), Code::kAlreadyExists);
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  doctor::ScratchOptions tiny;
  tiny.size = 1 << 20;  // under the 16 MiB least: the size asked for is wrong, not the disk
  EXPECT_EQ(doctor::ScratchFile::create(dir.path(), tiny).error().code(), Code::kInvalidArgument);
}

TEST(Sweep, TheGpuProbeSaysWhyWhereThereIsNone) {
  doctor::GpuProbe g = doctor::probe_gpu("");
  if (g.found) GTEST_SKIP() << "a GPU is here: " << g.name;
  EXPECT_FALSE(g.why.empty());
  EXPECT_NE(g.text().find("none found"), std::string::npos);
  EXPECT_NE(g.json().find("\"found\":false"), std::string::npos);
}

}  // namespace
}  // namespace sluice::io
