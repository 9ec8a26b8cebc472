// The Store contract, checked against every backend.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "sluice/s3/store.h"
#include "sluice/store/store.h"
#include "sluice/store/wrapper.h"
#include "sluice/telemetry/registry.h"
#include "test_util.h"

namespace sluice::store {
namespace {

using sluice::testing::as_bytes;
using sluice::testing::random_bytes;
using sluice::testing::TempDir;

std::string str(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "mem")
      store_ = make_memory_store("contract");
    else
      store_ = open_store("file://" + dir_.path() + "/root").value();
  }
  TempDir dir_;
  std::unique_ptr<Store> store_;
};

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
  ASSERT_FALSE(rm);
  EXPECT_EQ(rm.error().code(), Code::kNotFound);
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

INSTANTIATE_TEST_SUITE_P(Backends, StoreContract, ::testing::Values("mem", "file"),
                         [](const auto& p) { return p.param; });

TEST(PosixStore, SymlinksCannotEscapeTheRoot) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("root"));
  std::ofstream(dir.file("secret")) << "secret";
  std::filesystem::create_directories(dir.file("outside"));
  ::symlink(dir.file("secret").c_str(), dir.file("root/link").c_str());
  ::symlink(dir.file("outside").c_str(), dir.file("root/dirlink").c_str());
  auto store = open_store(dir.file("root")).value();
  std::vector<std::byte> buf(16);
  auto r = store->read("link", 0, buf);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("link"), std::string::npos);
  EXPECT_FALSE(store->put("dirlink/planted", as_bytes("x")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("outside/planted")));
}

TEST(PosixStore, TemporaryFilesAreNeverListedOrWritable) {
  TempDir dir;
  auto store = open_store(dir.path()).value();
  auto w = store->create("in-progress", {}).value();
  ASSERT_TRUE(w->append(as_bytes("x")));
  EXPECT_TRUE(std::filesystem::exists(dir.file(".sluice-tmp")));
  EXPECT_TRUE(store->list_all("")->empty());
  EXPECT_EQ(store->put(".sluice-tmp/evil", as_bytes("x")).error().code(), Code::kInvalidArgument);
  ASSERT_TRUE(w->commit());
  EXPECT_EQ(store->list_all("")->size(), 1u);
  // The temporary directory goes once no writer uses it: nothing is left beside the object.
  EXPECT_FALSE(std::filesystem::exists(dir.file(".sluice-tmp")));
}

TEST(PosixStore, RemoveCleansEmptyDirectories) {
  TempDir dir;
  auto store = open_store(dir.path()).value();
  ASSERT_TRUE(store->put("a/b/c/obj", as_bytes("x")));
  ASSERT_TRUE(store->remove("a/b/c/obj"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
}

TEST(OpenStore, UrisAndErrors) {
  TempDir dir;
  EXPECT_TRUE(open_store(dir.path()));
  EXPECT_TRUE(open_store("file://" + dir.path()));
  auto a = open_store("mem://shared").value();
  auto b = open_store("mem://shared").value();
  ASSERT_TRUE(a->put("k", as_bytes("v")));
  EXPECT_EQ(str(b->get("k").value()), "v");  // same name, same objects
  EXPECT_EQ(a->uri(), "mem://shared");
  EXPECT_EQ(open_store("mem://").error().code(), Code::kInvalidArgument);
  auto bad = open_store("gopher://x");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Code::kUnsupported);
  EXPECT_NE(bad.error().message().find("gopher://x"), std::string::npos);
  std::ofstream(dir.file("plainfile")) << "x";
  EXPECT_FALSE(open_store(dir.file("plainfile")));
}

TEST(S3Uri, ParsesBucketAndPrefix) {
  auto a = s3::parse_s3_uri("s3://my-bucket/some/prefix/").value();
  EXPECT_EQ(a.bucket, "my-bucket");
  EXPECT_EQ(a.prefix, "some/prefix/");
  EXPECT_EQ(s3::parse_s3_uri("s3://bucket").value().prefix, "");
  for (const char* bad :
       {"s3://", "s3://UPPER/x", "s3://a/x", "http://bucket/x", "s3://bad_name/k"})
    EXPECT_EQ(s3::parse_s3_uri(bad).error().code(), Code::kInvalidArgument) << bad;
}

TEST(TelemetryStore, RecordsRequestsBytesAndErrors) {
  telemetry::Registry reg;
  auto store = open_store("mem://telemetry", StoreOptions{.registry = &reg}).value();
  ASSERT_TRUE(store->put("k", as_bytes("12345")));
  ASSERT_TRUE(store->get("k"));
  EXPECT_FALSE(store->stat("missing"));
  std::string text = reg.prometheus_text();
  EXPECT_NE(text.find("sluice_store_requests_total{scheme=\"mem\",op=\"commit\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("sluice_store_requests_total{scheme=\"mem\",op=\"stat\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("sluice_store_errors_total{scheme=\"mem\",op=\"stat\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("sluice_store_read_bytes_total{scheme=\"mem\"} 5"), std::string::npos);
  EXPECT_NE(text.find("sluice_store_written_bytes_total{scheme=\"mem\"} 5"), std::string::npos);
}

}  // namespace
}  // namespace sluice::store
