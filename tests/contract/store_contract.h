// The store contract (store/store.h) as one test suite that every backend passes:
// file://, mem:// (tests/unit/store), and s3:// against s3rver and Ceph RGW
// (tests/integration/s3_store_test). Include once per test binary and instantiate with
// the backends there:
//   INSTANTIATE_TEST_SUITE_P(Backends, StoreContract, ::testing::Values(backend...),
//                            sluice::testing::contract_name);
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/store/store.h"
#include "test_util.h"

namespace sluice::testing {

struct ContractBackend {
  std::string name;
  // A fresh, empty store for the test called `scope`.
  std::function<std::unique_ptr<store::Store>(const std::string& scope)> open;
  // Why the backend cannot run here (a server that is not installed), or empty.
  std::function<std::string()> unavailable = [] { return std::string(); };
  bool exclusive_create = true;        // honours WriteOptions::overwrite = false
  bool remove_reports_missing = true;  // remove of a missing key is NotFound
  bool atomic_overwrite = true;        // a reader never sees a half-written overwrite
};

inline void PrintTo(const ContractBackend& b, std::ostream* os) {
  *os << b.name;
}

inline std::string contract_name(const ::testing::TestParamInfo<ContractBackend>& info) {
  return info.param.name;
}

inline std::string str(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

class StoreContract : public ::testing::TestWithParam<ContractBackend> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().unavailable(); !why.empty()) SKIP_BECAUSE(why);
    store_ = GetParam().open(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(store_);
  }
  std::unique_ptr<store::Store> store_;
};

using store::ListOptions;
using store::ReadOptions;
using store::WriteOptions;

TEST_P(StoreContract, PutStatReadGet) {
  auto data = random_bytes(100000, 7);
  ASSERT_TRUE(store_->put("a/b/obj.bin", data));
  auto info = store_->stat("a/b/obj.bin");
  ASSERT_TRUE(info) << info.error().to_string();
  EXPECT_EQ(info->size, data.size());
  EXPECT_EQ(info->key, "a/b/obj.bin");
  EXPECT_FALSE(info->etag.empty());
  EXPECT_EQ(store_->get("a/b/obj.bin").value(), data);

  std::vector<std::byte> buf(1000);
  ASSERT_EQ(store_->read("a/b/obj.bin", 99500, buf).value(), 500u);  // short only at the end
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + 500, data.begin() + 99500));
  EXPECT_EQ(store_->read("a/b/obj.bin", 100000, buf).value(), 0u);
  EXPECT_EQ(store_->read("a/b/obj.bin", 1 << 30, buf).value(), 0u);
}

TEST_P(StoreContract, ReadsPinnedToAnEtag) {
  ASSERT_TRUE(store_->put("pinned", as_bytes("version one")));
  std::string etag = store_->stat("pinned")->etag;
  std::vector<std::byte> buf(7);
  EXPECT_EQ(store_->read("pinned", 0, buf, ReadOptions{.if_match = etag}).value(), 7u);
  ASSERT_TRUE(store_->put("pinned", as_bytes("version two, longer")));
  auto r = store_->read("pinned", 0, buf, ReadOptions{.if_match = etag});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kConflict);
  EXPECT_NE(r.error().message().find("pinned"), std::string::npos);
}

TEST_P(StoreContract, RemoveMany) {
  std::vector<std::string> keys;
  for (int i = 0; i < 5; ++i) {
    keys.push_back("rm/" + std::to_string(i));
    ASSERT_TRUE(store_->put(keys.back(), as_bytes("x")));
  }
  keys.push_back("rm/never-existed");
  ASSERT_TRUE(store_->remove_many(keys));
  EXPECT_TRUE(store_->list_all("rm/")->empty());
}

TEST_P(StoreContract, EmptyObjects) {
  ASSERT_TRUE(store_->put("empty", {}));
  EXPECT_EQ(store_->stat("empty")->size, 0u);
  EXPECT_TRUE(store_->get("empty")->empty());
}

TEST_P(StoreContract, MissingObjectsAreNotFoundAndNamed) {
  std::vector<std::byte> buf(10);
  auto st = store_->stat("nope/x");
  auto rd = store_->read("nope/x", 0, buf);
  for (const Error& e : {st.error(), rd.error()}) {
    EXPECT_EQ(e.code(), Code::kNotFound);
    EXPECT_NE(e.message().find("nope/x"), std::string::npos) << e.message();
  }
  auto rm = store_->remove("nope/x");
  if (GetParam().remove_reports_missing) {
    ASSERT_FALSE(rm);
    EXPECT_EQ(rm.error().code(), Code::kNotFound);
  } else {
    EXPECT_TRUE(rm);  // S3's DELETE is idempotent
  }
}

TEST_P(StoreContract, BadKeysAreRejectedBeforeAnyIo) {
  for (std::string key :
       std::vector<std::string>{"", "/abs", "a//b", "../escape", "a/../../b", "a/./b", "a/", ".",
                                std::string("nul\0byte", 8), std::string(2000, 'k')}) {
    auto r = store_->put(key, as_bytes("x"));
    ASSERT_FALSE(r) << key;
    EXPECT_EQ(r.error().code(), Code::kInvalidArgument) << key;
    EXPECT_FALSE(store_->stat(key)) << key;
  }
}

TEST_P(StoreContract, WriterPublishesOnlyOnCommit) {
  auto w = store_->create("pending", {}).value();
  ASSERT_TRUE(w->append(as_bytes("hello ")));
  ASSERT_TRUE(w->append(as_bytes("world")));
  EXPECT_EQ(w->size(), 11u);
  EXPECT_EQ(store_->stat("pending").error().code(), Code::kNotFound);
  ASSERT_TRUE(w->commit());
  EXPECT_EQ(str(store_->get("pending").value()), "hello world");
  EXPECT_FALSE(w->commit());  // once only
  EXPECT_FALSE(w->append(as_bytes("more")));
}

TEST_P(StoreContract, AbortedOrDroppedWritersLeaveNothing) {
  {
    auto w = store_->create("dropped", {}).value();
    ASSERT_TRUE(w->append(as_bytes("lost")));
  }
  auto w = store_->create("aborted", {}).value();
  ASSERT_TRUE(w->append(as_bytes("lost")));
  w->abort();
  w->abort();
  EXPECT_FALSE(w->commit());
  EXPECT_TRUE(store_->list_all("")->empty());
}

TEST_P(StoreContract, OverwriteAndExclusiveCreate) {
  if (!GetParam().exclusive_create)
    SKIP_BECAUSE(GetParam().name + " ignores If-None-Match, so exclusive creates cannot hold");
  ASSERT_TRUE(store_->put("k", as_bytes("one")));
  ASSERT_TRUE(store_->put("k", as_bytes("two")));
  EXPECT_EQ(str(store_->get("k").value()), "two");
  auto r = store_->put("k", as_bytes("three"), WriteOptions{.overwrite = false});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kAlreadyExists);
  EXPECT_EQ(str(store_->get("k").value()), "two");
  EXPECT_TRUE(store_->put("fresh", as_bytes("x"), WriteOptions{.overwrite = false}));
}

TEST_P(StoreContract, ListIsSortedPrefixedAndPaged) {
  std::set<std::string> keys;
  for (int i = 0; i < 57; ++i) {
    std::string k = "data/shard-" + std::to_string(1000 + i);
    keys.insert(k);
    ASSERT_TRUE(store_->put(k, as_bytes(k)));
  }
  ASSERT_TRUE(store_->put("data2/other", as_bytes("x")));
  ASSERT_TRUE(store_->put("ckpt/step-1/model", as_bytes("x")));

  ListOptions opts;
  opts.prefix = "data/";
  opts.max_keys = 10;
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto page = store_->list(opts).value();
    EXPECT_LE(page.objects.size(), 10u);
    for (auto& o : page.objects) seen.push_back(o.key);
    opts.continuation = page.next_token;
    ++pages;
  } while (!opts.continuation.empty());
  EXPECT_EQ(pages, 6);
  EXPECT_EQ(seen, std::vector<std::string>(keys.begin(), keys.end()));

  EXPECT_EQ(store_->list_all("data")->size(), 58u);  // prefix, not directory
  EXPECT_EQ(store_->list_all("ckpt/step-1/")->size(), 1u);
  EXPECT_EQ(store_->list_all("")->size(), 59u);
  EXPECT_TRUE(store_->list_all("zzz")->empty());
  EXPECT_FALSE(store_->list(ListOptions{.prefix = "", .continuation = "", .max_keys = 0}));
}

TEST_P(StoreContract, RemoveDeletes) {
  ASSERT_TRUE(store_->put("dir/a", as_bytes("x")));
  ASSERT_TRUE(store_->remove("dir/a"));
  EXPECT_EQ(store_->stat("dir/a").error().code(), Code::kNotFound);
  EXPECT_TRUE(store_->list_all("")->empty());
}

TEST_P(StoreContract, ConcurrentWritersOfOneKeyNeverMix) {
  if (!GetParam().atomic_overwrite)
    SKIP_BECAUSE(GetParam().name +
                 " is not atomic on overwrite: a reader can see an empty "
                 "object while a PUT of the same key runs");
  // Each writer writes a distinct, self-consistent object; a reader must only ever see
  // one of them whole.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::byte> v(64 * 1024, static_cast<std::byte>('a' + t));
      for (int i = 0; i < 20; ++i) ASSERT_TRUE(store_->put("contended", v));
    });
  std::thread reader([&] {
    for (int i = 0; i < 200; ++i) {
      auto v = store_->get("contended");
      if (!v) continue;
      ASSERT_EQ(v->size(), 64u * 1024);
      EXPECT_EQ(std::count(v->begin(), v->end(), v->front()), static_cast<long>(v->size()));
    }
  });
  for (auto& t : threads) t.join();
  reader.join();
}

}  // namespace sluice::testing
