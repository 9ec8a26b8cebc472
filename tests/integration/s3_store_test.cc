// The s3:// store through the Store API against real servers it starts on loopback: s3rver
// and Ceph RGW. Both run every test and the whole store contract.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "contract/store_contract.h"
#include "sluice/s3/store.h"
#include "sluice/telemetry/registry.h"
#include "test_util.h"

namespace sluice::s3 {
namespace {

using sluice::testing::as_bytes;
using sluice::testing::random_bytes;
using sluice::testing::ServedHarness;
using sluice::testing::TempDir;

std::string find_s3rver() {
  std::vector<std::string> candidates;
  if (const char* e = std::getenv("SLUICE_S3RVER")) candidates.push_back(e);
  candidates.push_back(std::string(SLUICE_SOURCE_DIR) + "/.cache/npm/node_modules/.bin/s3rver");
  candidates.push_back("/opt/sluice-test-tools/node_modules/.bin/s3rver");
  for (auto& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return c;
  return "";
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

bool can_connect(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// One server of each kind for the whole suite, each with bucket "unit": s3rver (accepts any
// signature, ignores If-Match and If-None-Match) and Ceph RGW (verifies SigV4, honours
// conditional requests), started by the tests themselves on loopback.
struct Server {
  std::string name;
  std::string endpoint, access_key, secret_key;
  std::string skip_reason;  // why it is not running
  bool exclusive_create = false;
};

Server g_s3rver{"s3rver", "", "S3RVER", "S3RVER", "not started", false};
Server g_rgw{"rgw", "", "", "", "not started", true};

class S3rverServer : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string exe = find_s3rver();
    if (exe.empty()) {
      g_s3rver.skip_reason = "s3rver not installed (make test installs it into .cache/npm)";
      return;
    }
    port_ = free_port();
    std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);
      ::execl(exe.c_str(), exe.c_str(), "--directory", dir_.path().c_str(), "--port", port.c_str(),
              "--address", "127.0.0.1", "--silent", "--configure-bucket", "unit", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !can_connect(port_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!can_connect(port_)) {
      g_s3rver.skip_reason = "s3rver did not start";
    } else {
      g_s3rver.endpoint = "http://127.0.0.1:" + port;
      g_s3rver.skip_reason.clear();
    }
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }

 private:
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// RGW through tests/integration/rgw_harness.py serve: it prints one JSON line with the
// endpoint and keys (or {"skip": reason}) and stops everything when its stdin closes.
class RgwServer : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string line = harness_.start(
        std::string(SLUICE_SOURCE_DIR) + "/tests/integration/rgw_harness.py", {"--bucket", "unit"});
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      g_rgw.skip_reason = "rgw_harness.py serve printed no JSON: '" + line + "'";
    } else if (j.contains("skip")) {
      g_rgw.skip_reason = "Ceph RGW unavailable: " + j["skip"].get<std::string>();
    } else {
      g_rgw.endpoint = j["endpoint"].get<std::string>();
      g_rgw.access_key = j["access_key"].get<std::string>();
      g_rgw.secret_key = j["secret_key"].get<std::string>();
      g_rgw.skip_reason.clear();
    }
  }
  void TearDown() override { harness_.stop(); }

 private:
  ServedHarness harness_;
};

S3Options options_for(const Server& s) {
  S3Options o;
  o.endpoint = s.endpoint;
  o.access_key = s.access_key;
  o.secret_key = s.secret_key;
  o.part_size = 5 << 20;
  return o;
}

class S3StoreTest : public ::testing::TestWithParam<Server*> {
 protected:
  void SetUp() override {
    const Server& s = *GetParam();
    if (!s.skip_reason.empty()) SKIP_BECAUSE(s.name + ": " + s.skip_reason);
    opts_ = options_for(s);
    opts_.registry = &registry_;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();
    name = name.substr(0, name.find('/'));
    store_ = open_s3_store("s3://unit/" + name + "/", opts_).value();
  }
  telemetry::Registry registry_;
  S3Options opts_;
  std::unique_ptr<store::Store> store_;
};

TEST_P(S3StoreTest, StatReadAndEdges) {
  auto data = random_bytes(100000, 1);
  ASSERT_TRUE(store_->put("obj", data));
  auto info = store_->stat("obj").value();
  EXPECT_EQ(info.size, data.size());
  EXPECT_FALSE(info.etag.empty());
  EXPECT_GT(info.mtime_ns, 0);
  std::vector<std::byte> buf(1000);
  ASSERT_EQ(store_->read("obj", 99500, buf).value(), 500u);  // short at the end
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + 500, data.begin() + 99500));
  EXPECT_EQ(store_->read("obj", 100000, buf).value(), 0u);  // at the end: 416 -> 0
  EXPECT_EQ(store_->read("obj", 1 << 30, buf).value(), 0u);
  EXPECT_EQ(store_->get("obj").value(), data);
  auto missing = store_->stat("missing");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Code::kNotFound);
  EXPECT_NE(missing.error().message().find("s3://unit/StatReadAndEdges/missing"),
            std::string::npos);
  EXPECT_EQ(store_->read("missing", 0, buf).error().code(), Code::kNotFound);
}

TEST_P(S3StoreTest, LargeObjectsGoMultipartAndReadInParallel) {
  auto data = random_bytes((17 << 20) + 3, 2);  // 4 parts of 5 MiB
  auto w = store_->create("big", {}).value();
  for (size_t at = 0; at < data.size(); at += 1000003)
    ASSERT_TRUE(
        w->append(std::span(data).subspan(at, std::min<size_t>(1000003, data.size() - at))));
  ASSERT_TRUE(w->commit());
  std::vector<std::byte> back(data.size() + 100);
  EXPECT_EQ(store_->read("big", 0, back).value(), data.size());
  back.resize(data.size());
  EXPECT_EQ(back, data);
  std::vector<std::byte> mid(7 << 20);
  ASSERT_EQ(store_->read("big", 3 << 20, mid).value(), mid.size());
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + (3 << 20)));
  std::string text = registry_.prometheus_text();
  EXPECT_NE(text.find("sluice_s3_requests_total{op=\"post\"}"), std::string::npos);
}

TEST_P(S3StoreTest, ReadsArePinnedToOneVersion) {
  ASSERT_TRUE(store_->put("v", random_bytes(1000, 3)));
  std::string etag = store_->stat("v")->etag;
  ASSERT_TRUE(store_->put("v", random_bytes(1000, 4)));
  std::vector<std::byte> buf(100);
  // s3rver ignores If-Match and answers 206 anyway: the ETag of the answer gives it away.
  auto r = store_->read("v", 0, buf, store::ReadOptions{.if_match = etag});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kConflict) << r.error().to_string();
  // The same for a read of known size, which goes as one plain GET.
  r = store_->read("v", 0, buf, store::ReadOptions{.if_match = etag, .object_size = 1000});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kConflict) << r.error().to_string();
}

TEST_P(S3StoreTest, HugePartSizeDoesNotAllocateIt) {
  // Defect 4: a 5 GiB part size for a small object must not allocate 5 GiB.
  S3Options o = opts_;
  o.part_size = kMaxPartSize;
  auto store = open_s3_store("s3://unit/HugePartSizeDoesNotAllocateIt/", o).value();
  ASSERT_TRUE(store->put("small", as_bytes("tiny")));
  EXPECT_EQ(store->get("small").value().size(), 4u);
  o.part_size = kMaxPartSize + 1;
  EXPECT_EQ(open_s3_store("s3://unit/x/", o).error().code(), Code::kInvalidArgument);
}

TEST_P(S3StoreTest, ListPaginatesAndRemoveManyBatches) {
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i) {
    keys.push_back("page/k" + std::to_string(100 + i));
    ASSERT_TRUE(store_->put(keys.back(), as_bytes("x")));
  }
  ASSERT_TRUE(store_->put("other", as_bytes("y")));
  store::ListOptions o;
  o.prefix = "page/";
  o.max_keys = 5;
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto page = store_->list(o).value();
    for (auto& obj : page.objects) seen.push_back(obj.key);
    o.continuation = page.next_token;
    ++pages;
  } while (!o.continuation.empty() && pages < 20);
  EXPECT_EQ(pages, 5);
  EXPECT_EQ(seen, keys);
  EXPECT_EQ(store_->list_all("")->size(), 24u);
  ASSERT_TRUE(store_->remove_many(keys));
  EXPECT_TRUE(store_->list_all("page/")->empty());
  ASSERT_TRUE(store_->remove("other"));
  EXPECT_EQ(store_->stat("other").error().code(), Code::kNotFound);
}

TEST_P(S3StoreTest, AbortedWritersLeaveNoObjectAndNoUpload) {
  {
    auto w = store_->create("abandoned", {}).value();
    ASSERT_TRUE(w->append(random_bytes(11 << 20, 5)));  // two parts sent
  }                                                     // destroyed without commit: aborted
  EXPECT_EQ(store_->stat("abandoned").error().code(), Code::kNotFound);
  auto w = store_->create("aborted", {}).value();
  ASSERT_TRUE(w->append(as_bytes("small")));
  w->abort();
  EXPECT_FALSE(w->commit());
  EXPECT_EQ(store_->stat("aborted").error().code(), Code::kNotFound);
}

TEST(S3Errors, UnreachableServerRetriesThenFailsClearly) {
  S3Options o;
  o.endpoint = "http://127.0.0.1:9";
  o.access_key = o.secret_key = "x";
  o.max_attempts = 3;
  o.base_delay_ms = 1;
  telemetry::Registry reg;
  o.registry = &reg;
  auto store = open_s3_store("s3://bucket/", o).value();
  auto r = store->stat("k");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kUnavailable);
  EXPECT_NE(r.error().message().find("after 3 attempts"), std::string::npos) << r.error().message();
  EXPECT_EQ(reg.counter("sluice_s3_retries_total").value(), 2u);
}

// The store contract, over both servers.
std::unique_ptr<store::Store> open_contract_store(const Server& s, const std::string& scope) {
  return open_s3_store("s3://unit/contract-" + scope + "/", options_for(s)).value();
}

INSTANTIATE_TEST_SUITE_P(Servers, S3StoreTest, ::testing::Values(&g_s3rver, &g_rgw),
                         [](const auto& p) { return p.param->name; });

using sluice::testing::StoreContract;
INSTANTIATE_TEST_SUITE_P(
    S3, StoreContract,
    ::testing::Values(
        sluice::testing::ContractBackend{
            "s3rver", [](const std::string& scope) { return open_contract_store(g_s3rver, scope); },
            [] { return g_s3rver.skip_reason.empty() ? "" : "s3rver: " + g_s3rver.skip_reason; },
            /*exclusive_create=*/false, /*remove_reports_missing=*/false,
            /*atomic_overwrite=*/false},
        sluice::testing::ContractBackend{
            "rgw", [](const std::string& scope) { return open_contract_store(g_rgw, scope); },
            [] { return g_rgw.skip_reason.empty() ? "" : "rgw: " + g_rgw.skip_reason; },
            /*exclusive_create=*/true, /*remove_reports_missing=*/false}),
    sluice::testing::contract_name);

}  // namespace
}  // namespace sluice::s3

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new sluice::s3::S3rverServer);
  ::testing::AddGlobalTestEnvironment(new sluice::s3::RgwServer);
  return sluice::testing::run_all_tests_skip_aware();
}
