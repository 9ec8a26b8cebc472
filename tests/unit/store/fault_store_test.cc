#include <chrono>

#include <gtest/gtest.h>

#include "sluice/testing/fault_store.h"
#include "test_util.h"

namespace sluice::store {
namespace {

using sluice::testing::as_bytes;
using sluice::testing::random_bytes;

class FaultStoreTest : public ::testing::Test {
 protected:
  FaultStoreTest() : faults_(make_memory_store("faults")) {}
  FaultInjectionStore faults_;
};

TEST_F(FaultStoreTest, FailsTheNthCallOnly) {
  ASSERT_TRUE(faults_.put("k", as_bytes("v")));
  faults_.fail_nth(FaultOp::kStat, 2, Code::kIoError);
  EXPECT_TRUE(faults_.stat("k"));
  auto second = faults_.stat("k");
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Code::kIoError);
  EXPECT_NE(second.error().message().find("'k'"), std::string::npos);
  EXPECT_TRUE(faults_.stat("k"));
  EXPECT_EQ(faults_.calls(FaultOp::kStat), 3u);
}

TEST_F(FaultStoreTest, FailsAlwaysUntilCleared) {
  faults_.fail_always(FaultOp::kCommit, Code::kUnavailable);
  EXPECT_EQ(faults_.put("k", as_bytes("v")).error().code(), Code::kUnavailable);
  EXPECT_EQ(faults_.target().stat("k").error().code(), Code::kNotFound);  // nothing leaked
  faults_.clear();
  EXPECT_TRUE(faults_.put("k", as_bytes("v")));
}

TEST_F(FaultStoreTest, ShortReadsNeedReadFull) {
  auto data = random_bytes(10000);
  ASSERT_TRUE(faults_.put("k", data));
  faults_.set_short_reads(333);
  std::vector<std::byte> buf(10000);
  EXPECT_EQ(faults_.read("k", 0, buf).value(), 333u);
  EXPECT_EQ(faults_.read_full("k", 0, buf).value(), 10000u);
  EXPECT_EQ(buf, data);
  EXPECT_EQ(faults_.get("k").value(), data);  // get loops too
}

TEST_F(FaultStoreTest, NoSpaceFailsTheWriterAndPublishesNothing) {
  faults_.set_space_limit(1000);
  auto w = faults_.create("big", {}).value();
  ASSERT_TRUE(w->append(random_bytes(600)));
  auto r = w->append(random_bytes(600));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kNoSpace);
  EXPECT_NE(r.error().message().find("big"), std::string::npos);
  w->abort();
  EXPECT_EQ(faults_.stat("big").error().code(), Code::kNotFound);
}

TEST_F(FaultStoreTest, CrashDropsEveryUnsyncedByte) {
  ASSERT_TRUE(faults_.put("committed", as_bytes("safe")));
  auto open_writer = faults_.create("in-flight", {}).value();
  ASSERT_TRUE(open_writer->append(random_bytes(4096)));
  faults_.crash();
  EXPECT_EQ(faults_.stat("committed").error().code(), Code::kUnavailable);  // down
  faults_.restart();
  EXPECT_EQ(open_writer->append(as_bytes("x")).error().code(), Code::kCancelled);
  EXPECT_EQ(open_writer->commit().error().code(), Code::kCancelled);
  EXPECT_EQ(faults_.stat("in-flight").error().code(), Code::kNotFound);
  auto back = faults_.get("committed");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size(), 4u);
  // Writers created after the restart work normally.
  EXPECT_TRUE(faults_.put("after", as_bytes("ok")));
}

TEST_F(FaultStoreTest, LatencyIsInjected) {
  ASSERT_TRUE(faults_.put("k", as_bytes("v")));
  faults_.set_latency(std::chrono::milliseconds(20));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(faults_.stat("k"));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(20));
}

TEST_F(FaultStoreTest, AnyCountsEveryOperation) {
  faults_.fail_nth(FaultOp::kAny, 3, Code::kIoError);
  // put is create, append, commit: the commit is the third call.
  EXPECT_EQ(faults_.put("a", as_bytes("1")).error().code(), Code::kIoError);
  EXPECT_EQ(faults_.calls(FaultOp::kAny), 3u);
  EXPECT_EQ(faults_.stat("a").error().code(), Code::kNotFound);
}

}  // namespace
}  // namespace sluice::store
