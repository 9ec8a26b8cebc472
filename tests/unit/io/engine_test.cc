#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include "sluice/io/engine.h"
#include "sluice/telemetry/registry.h"
#include "test_util.h"

namespace sluice::io {
namespace {

using sluice::testing::random_bytes;
using sluice::testing::TempDir;
using namespace std::chrono_literals;

class EngineTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == EngineKind::kUring && !uring_available(&why))
      SKIP_BECAUSE("io_uring unavailable here: " + why);
    EngineOptions o;
    o.kind = GetParam();
    o.queue_depth = 8;
    o.registry = &registry_;
    auto c = make_engine(o);
    ASSERT_TRUE(c) << c.error().to_string();
    engine_ = std::move(c->engine);
    EXPECT_EQ(engine_->kind(), GetParam());
    fd_ = ::open(dir_.file("f").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    engine_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  std::vector<Completion> drain(size_t n) {
    std::vector<Completion> out(n), all;
    while (all.size() < n) {
      auto got = engine_->wait(out, 1, 5s);
      EXPECT_TRUE(got);
      if (!got || *got == 0) break;
      all.insert(all.end(), out.begin(), out.begin() + static_cast<long>(*got));
    }
    return all;
  }
  TempDir dir_;
  telemetry::Registry registry_;
  std::unique_ptr<Engine> engine_;
  int fd_ = -1;
};

TEST_P(EngineTest, WritesReadsAndSyncs) {
  auto data = random_bytes(8 * 4096);
  std::vector<Request> writes;
  for (int i = 0; i < 8; ++i)
    writes.push_back(Request{OpCode::kWrite, fd_, data.data() + i * 4096, 4096,
                             static_cast<uint64_t>(i) * 4096, static_cast<uint64_t>(i)});
  ASSERT_TRUE(engine_->submit(writes));
  EXPECT_EQ(engine_->in_flight(), 8u);
  auto done = drain(8);
  ASSERT_EQ(done.size(), 8u);
  uint64_t mask = 0;
  for (auto& c : done) {
    EXPECT_EQ(c.result, 4096);
    mask |= 1ull << c.user_data;
  }
  EXPECT_EQ(mask, 0xFFu);
  Request fsync{OpCode::kFsync, fd_, nullptr, 0, 0, 99};
  ASSERT_TRUE(engine_->submit({&fsync, 1}));
  auto f = drain(1);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].result, 0);
  EXPECT_EQ(f[0].user_data, 99u);

  std::vector<std::byte> back(data.size());
  Request read{OpCode::kRead, fd_, back.data(), static_cast<uint32_t>(back.size()), 0, 7};
  ASSERT_TRUE(engine_->submit({&read, 1}));
  auto r = drain(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].result, static_cast<int64_t>(data.size()));
  EXPECT_EQ(back, data);
  EXPECT_NE(registry_.prometheus_text().find("sluice_io_ops_total"), std::string::npos);
}

TEST_P(EngineTest, ErrorsComeBackAsNegativeErrno) {
  char buf[16];
  Request bad{OpCode::kRead, 12345, buf, sizeof buf, 0, 1};  // not an open fd
  ASSERT_TRUE(engine_->submit({&bad, 1}));
  auto r = drain(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].result, -EBADF);
}

TEST_P(EngineTest, ReadAtEndOfFileIsZero) {
  char buf[16];
  Request past{OpCode::kRead, fd_, buf, sizeof buf, 1 << 20, 1};
  ASSERT_TRUE(engine_->submit({&past, 1}));
  auto r = drain(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].result, 0);
}

TEST_P(EngineTest, RefusesMoreThanItsDepth) {
  std::vector<char> buf(9 * 16);
  std::vector<Request> reqs;
  for (int i = 0; i < 9; ++i)
    reqs.push_back(
        Request{OpCode::kRead, fd_, buf.data() + i * 16, 16, 0, static_cast<uint64_t>(i)});
  auto st = engine_->submit(reqs);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), Code::kInvalidArgument);
}

TEST_P(EngineTest, WaitTimesOutWithNothingReady) {
  std::vector<Completion> out(4);
  auto got = engine_->wait(out, 1, 10ms);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineTest,
                         ::testing::Values(EngineKind::kUring, EngineKind::kThreadPool),
                         [](const auto& p) {
                           return p.param == EngineKind::kUring ? std::string("uring")
                                                                : std::string("threadpool");
                         });

TEST(EngineChoice, AutoSaysWhy) {
  auto c = make_engine({});
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->why.empty());
  std::string why;
  if (uring_available(&why)) {
    EXPECT_EQ(c->engine->kind(), EngineKind::kUring);
  } else {
    EXPECT_NE(c->why.find(why), std::string::npos);
  }
}

TEST(EngineChoice, ThreadPoolWhenAsked) {
  auto c = make_engine(EngineOptions{.kind = EngineKind::kThreadPool});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->engine->name(), "thread-pool");
  EXPECT_EQ(c->why, "thread pool requested");
}

}  // namespace
}  // namespace sluice::io
