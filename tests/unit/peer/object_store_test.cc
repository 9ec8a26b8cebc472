// The object space: a daemon's HTTP port serving objects to the job's members, and the
// sluiced:// store that reaches it. The whole store contract runs over it; then what a
// stranger, a wrong secret, a replay to another member and a lying path get.
#include "sluice/peer/object_store.h"

#include <gtest/gtest.h>

#include <curl/curl.h>

#include "contract/store_contract.h"
#include "node/object_space.h"
#include "node/peer_http.h"
#include "sluice/ckpt/checkpointer.h"
#include "test_util.h"

namespace sluice::peer {
namespace {

using sluice::testing::ContractBackend;
using sluice::testing::StoreContract;
using sluice::testing::TempDir;

constexpr const char* kSecret = "a-secret-of-the-job-0123456789";

// One daemon's object space ("owner") on a free loopback port; "asker" is the other member.
struct Owner {
  TempDir dir;
  std::unique_ptr<node::ObjectSpace> space;
  std::unique_ptr<node::PeerHttpServer> http;

  Owner() {
    std::vector<Member> ms{{"owner", "127.0.0.1", 1, true}, {"asker", "127.0.0.1", 2, true}};
    auto m = std::make_shared<const Membership>(Membership::make(ms, "owner").value());
    node::ObjectSpaceOptions so;
    so.directory = dir.path();
    so.secret = kSecret;
    so.membership = m;
    space = node::ObjectSpace::open(so).value();
    node::PeerHttpOptions ho;
    ho.object = [this](const ObjectRequest& r, std::string_view sig, std::span<const std::byte> b) {
      return space->handle(r, sig, b);
    };
    ho.secret = kSecret;
    http = node::PeerHttpServer::start(std::move(ho)).value();
  }

  std::string uri(const std::string& member, const std::string& folder) const {
    return "sluiced://" + member + "@127.0.0.1:" + std::to_string(http->port()) + "/" + folder;
  }
};

Owner& owner() {
  static Owner o;
  return o;
}

Result<std::unique_ptr<store::Store>> open_as(const std::string& node, const std::string& secret,
                                              const std::string& uri) {
  register_object_scheme();
  store::StoreOptions so;
  ObjectStoreOptions o;
  o.node = node;
  o.secret = secret;
  o.part_size = 1 << 20;  // several parts for the contract's larger objects
  so.backend.set(o);
  return store::open_store(uri, so);
}

INSTANTIATE_TEST_SUITE_P(
    ObjectSpace, StoreContract,
    ::testing::Values(ContractBackend{
        "sluiced",
        [](const std::string& scope) {
          return open_as("asker", kSecret, owner().uri("owner", scope + "/")).value();
        }}),
    sluice::testing::contract_name);

TEST(ObjectSpace, RefusesStrangersWrongSecretsAndReplays) {
  auto good = open_as("asker", kSecret, owner().uri("owner", "sec/")).value();
  std::string data = "checkpoint bytes";
  ASSERT_TRUE(good->put("k", std::as_bytes(std::span(data))));
  auto stranger = open_as("mallory", kSecret, owner().uri("owner", "sec/")).value();
  EXPECT_EQ(stranger->stat("k").error().code(), Code::kPermissionDenied);
  auto wrong = open_as("asker", "another-secret-0123456789", owner().uri("owner", "sec/")).value();
  EXPECT_EQ(wrong->stat("k").error().code(), Code::kPermissionDenied);
  // Signed for another member (a replay to the wrong daemon).
  auto elsewhere = open_as("asker", kSecret, owner().uri("node-9", "sec/")).value();
  EXPECT_EQ(elsewhere->stat("k").error().code(), Code::kPermissionDenied);
  // Keys cannot leave the object space.
  EXPECT_FALSE(good->stat("../../etc/passwd"));
  EXPECT_FALSE(open_as("asker", kSecret, owner().uri("owner", "../x/")));
  // The owner's copy is where it should be.
  EXPECT_TRUE(std::filesystem::exists(owner().dir.path() + "/sec/k"));
}

TEST(ObjectSpace, RawRequestsWithoutSignaturesOrWithHugeBodiesAreRefused) {
  CURL* c = curl_easy_init();
  std::string url = "http://127.0.0.1:" + std::to_string(owner().http->port()) +
                    "/v1/object?op=stat&key=sec/k&a=&b=&c=";
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOBODY, 0L);
  curl_easy_setopt(
      c, CURLOPT_WRITEFUNCTION, +[](char*, size_t s, size_t n, void*) { return s * n; });
  ASSERT_EQ(curl_easy_perform(c), CURLE_OK);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  EXPECT_EQ(status, 400);  // no time header: malformed
  std::string big(17 << 20, 'x');
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, big.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(big.size()));
  ASSERT_EQ(curl_easy_perform(c), CURLE_OK);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  EXPECT_EQ(status, 400);  // over 16 MiB
  curl_easy_cleanup(c);
}

TEST(ObjectSpace, IsACheckpointTier) {
  auto s = open_as("asker", kSecret, owner().uri("owner", "ckpt/")).value();
  ckpt::CheckpointerOptions o;
  o.series = "m";
  ckpt::Tier local;
  TempDir dir;
  local = ckpt::open_tier(dir.path()).value();
  ckpt::Tier peer;
  peer.name = "peer";
  peer.store = std::move(s);
  o.tiers = {local, peer};
  o.staging_bytes = 8 << 20;
  o.segment_bytes = 1 << 20;
  o.chunk_size = 1 << 20;
  auto cp = ckpt::Checkpointer::open(o).value();
  std::vector<std::byte> t(3 << 20);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::byte>(i * 7);
  ckpt::TensorView v{"w", "uint8", {}, t.data(), t.size(), nullptr, {}};
  auto h = cp->save(1, std::span(&v, 1)).value();
  ASSERT_TRUE(h->wait()) << h->wait().error().message();
  // The node is lost: restore from the peer alone.
  ckpt::CheckpointerOptions po = o;
  po.tiers = {peer};
  auto from_peer = ckpt::Checkpointer::open(po).value();
  std::vector<std::byte> back(t.size());
  ckpt::TensorDest d{"w", -1, back.data(), back.size(), nullptr, 0};
  auto r = from_peer->restore(1, std::span(&d, 1));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(back, t);
  EXPECT_EQ(from_peer->verify(1).value().bad_chunks, 0u);
}

}  // namespace
}  // namespace sluice::peer
