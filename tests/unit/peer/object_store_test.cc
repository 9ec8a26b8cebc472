// The object space: a daemon's HTTP port serving objects to the job's members, and the
// sluiced:// store that reaches it. The whole store contract runs over it; then what a
// stranger, a wrong secret, a replay to another member and a lying path get.
#include "sluice/peer/object_store.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "contract/store_contract.h"
#include "node/object_space.h"
#include "node/peer_http.h"
#include "peer/object_uri.h"
#include "sluice/ckpt/checkpointer.h"
#include "sluice/peer/membership.h"
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

// An owner that signs whatever `body` holds (a lying or broken daemon of the job).
struct LyingOwner {
  std::string body;
  std::unique_ptr<node::PeerHttpServer> http;

  LyingOwner() {
    node::PeerHttpOptions ho;
    ho.object = [this](const ObjectRequest&, std::string_view, std::span<const std::byte>) {
      return node::ObjectReply{200, body, "e"};
    };
    ho.secret = kSecret;
    http = node::PeerHttpServer::start(std::move(ho)).value();
  }
  std::string uri() const {
    return "sluiced://owner@127.0.0.1:" + std::to_string(http->port()) + "/ckpt/";
  }
};

// fuzz/peer_object_reply_fuzz: a signed stat or list reply with a float too large for an
// integer field was converted anyway (undefined behaviour), a negative size wrapped.
TEST(ObjectSpace, MistypedAndOutOfRangeFieldsOfASignedReplyAreCorruption) {
  LyingOwner owner;
  auto s = open_as("asker", kSecret, owner.uri()).value();
  for (const char* body :
       {R"({"size":1e30,"etag":"e","mtime_ns":0})", R"({"size":-1,"etag":"e","mtime_ns":0})",
        R"({"size":1,"etag":"e","mtime_ns":1.7e24})", R"({"size":"1","etag":"e","mtime_ns":0})",
        R"({"size":1,"etag":5,"mtime_ns":0})", R"({"size":1,"etag":"e"})", R"([1,2])",
        "not json"}) {
    owner.body = body;
    auto st = s->stat("k");
    ASSERT_FALSE(st) << body;
    EXPECT_EQ(st.error().code(), Code::kCorruption) << body;
    owner.body = std::string(R"({"next":"","objects":[{"key":"ckpt/k",)") + (body + 1) + "]}";
    auto page = s->list({});
    ASSERT_FALSE(page) << owner.body;
    EXPECT_EQ(page.error().code(), Code::kCorruption) << owner.body;
  }
  owner.body = R"({"size":7,"etag":"e","mtime_ns":-5})";
  auto st = s->stat("k");
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->size, 7u);
  EXPECT_EQ(st->mtime_ns, -5);
}

// fuzz/peer_object_reply_fuzz: libcurl before 8.1.0 (Debian 12's 7.88) read freed memory
// when a reused easy handle got a reply whose first header line is folded; the HTTP client
// now runs a fresh easy handle per request. Under ASan the old client fails here with a
// use-after-free; without it, the folded line was taken as part of a freed header.
TEST(ObjectSpace, AReplyWhoseFirstHeaderIsFoldedFailsTheRequestAlone) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::thread server([fd] {
    for (const char* reply :
         {"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nConnection: close\r\n\r\ngone",
          "HTTP/1.1 404 Not Found\r\n folded: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"
          "gone"}) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      while (in.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
      }
      (void)::send(c, reply, std::strlen(reply), MSG_NOSIGNAL);
      ::close(c);
    }
  });
  auto s = open_as("asker", kSecret,
                   "sluiced://owner@127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/ckpt/")
               .value();
  auto first = s->stat("k");
  auto second = s->stat("k");
  server.join();
  ::close(fd);
  ASSERT_FALSE(first);
  EXPECT_EQ(first.error().code(), Code::kNotFound);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Code::kUnavailable) << second.error().message();
}

// fuzz/sluiced_uri_fuzz: a control character in a sluiced:// URI went into the request as
// it was: a CR LF in the member's name added a header to every request.
TEST(ObjectSpace, UrisAndNamesWithControlCharactersAreRefused) {
  for (const char* uri :
       {"sluiced://owner\r\nX-Evil: 1@127.0.0.1:1/ckpt/", "sluiced://owner@127.0.0.1:1\n/ckpt/",
        "sluiced://owner@127.0.0.1:1/ck\x01pt/"}) {
    EXPECT_FALSE(parse_object_uri(uri)) << printable(uri);
    auto s = open_as("asker", kSecret, uri);
    ASSERT_FALSE(s) << printable(uri);
    EXPECT_EQ(s.error().code(), Code::kInvalidArgument);
  }
  auto s = open_as("asker\r\nX-Evil: 1", kSecret, "sluiced://owner@127.0.0.1:1/ckpt/");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), Code::kInvalidArgument);
  auto w = parse_object_uri("sluiced://node-7@10.0.0.7:7470/ckpt/run-1").value();
  EXPECT_EQ(w.member, "node-7");
  EXPECT_EQ(w.address, "10.0.0.7:7470");
  EXPECT_EQ(w.prefix, "ckpt/run-1/");
}

// fuzz/sluiced_uri_fuzz: a peers file's member named with '@', '/' or a control character
// made peer:// tiers resolve to sluiced:// URIs naming another member (or none).
TEST(Membership, NamesThatCannotBeSentOrWrittenInAUriAreRefused) {
  for (const char* name : {"a@b", "a/b", "a\x01", "a\x7f"}) {
    std::vector<Member> ms{{name, "10.0.0.1", 7470, true}, {"b", "10.0.0.2", 7470, true}};
    auto m = Membership::make(ms, "b");
    ASSERT_FALSE(m) << printable(name);
    EXPECT_EQ(m.error().code(), Code::kInvalidArgument);
  }
  std::vector<Member> ms{{"10.0.0.1:7470", "10.0.0.1", 7470, true}, {"node_2.x-y", "h", 1, true}};
  EXPECT_TRUE(Membership::make(ms, "node_2.x-y"));
}

}  // namespace
}  // namespace sluice::peer
