// Membership (rendezvous ownership, host lists, Slurm hostlists) and the peer request
// signature.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "sluice/peer/membership.h"
#include "sluice/peer/peer_store.h"

namespace sluice::peer {
namespace {

std::vector<Member> members(int n) {
  std::vector<Member> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(Member{"n" + std::to_string(i), "127.0.0.1", static_cast<uint16_t>(7000 + i)});
  }
  return out;
}

std::string chunk(int i) {
  return "0123456789abcdef/shards/" + std::to_string(i / 7) + ".tar#" + std::to_string(i % 7);
}

TEST(Membership, EveryDaemonComputesTheSameOwnerAndTheLoadIsSpread) {
  auto a = Membership::make(members(4), "n0").value();
  auto b = Membership::make(members(4), "n3").value();
  std::map<std::string, int> load;
  for (int i = 0; i < 8000; ++i) {
    EXPECT_EQ(a.owner(chunk(i)).name, b.owner(chunk(i)).name);
    ++load[a.owner(chunk(i)).name];
  }
  ASSERT_EQ(load.size(), 4u);
  for (const auto& [name, n] : load) {
    EXPECT_GT(n, 1700) << name;  // 2000 expected each
    EXPECT_LT(n, 2300) << name;
  }
  EXPECT_TRUE(a.is_self(a.self()));
  EXPECT_EQ(a.self().name, "n0");
}

TEST(Membership, RankedIsTheSameOrderEverywhereAndStartsWithTheOwner) {
  auto a = Membership::make(members(5), "n0").value();
  auto b = Membership::make(members(5), "n4").value();
  std::map<std::string, int> first;
  for (int i = 0; i < 500; ++i) {
    std::vector<const Member*> ra = a.ranked(chunk(i)), rb = b.ranked(chunk(i));
    ASSERT_EQ(ra.size(), 5u);
    ASSERT_EQ(rb.size(), 5u);
    EXPECT_EQ(ra.front()->name, a.owner(chunk(i)).name);
    for (size_t k = 0; k < ra.size(); ++k) EXPECT_EQ(ra[k]->name, rb[k]->name);
    std::set<std::string> names;
    for (const Member* m : ra) names.insert(m->name);
    EXPECT_EQ(names.size(), 5u);  // each member once
    ++first[ra.front()->name];
  }
  EXPECT_EQ(first.size(), 5u);  // every member comes first for some keys
  // Fetch-only members are never ranked.
  auto ms = members(3);
  ms[1].owns = false;
  auto c = Membership::make(ms, "n1").value();
  for (int i = 0; i < 50; ++i) {
    for (const Member* m : c.ranked(chunk(i))) EXPECT_NE(m->name, "n1");
    EXPECT_EQ(c.ranked(chunk(i)).size(), 2u);
  }
}

TEST(Membership, AJoinMovesOnlyTheChunksTheNewcomerTakes) {
  auto before = Membership::make(members(4), "n0").value();
  auto after = Membership::make(members(5), "n0").value();
  int moved = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::string& was = before.owner(chunk(i)).name;
    const std::string& now = after.owner(chunk(i)).name;
    if (was != now) {
      ++moved;
      EXPECT_EQ(now, "n4") << "a chunk moved between members that stayed";
    }
  }
  EXPECT_GT(moved, 1600);  // about 1/5 of 10000
  EXPECT_LT(moved, 2400);
  // A member leaving: only its chunks move.
  std::vector<Member> without_n2 = members(4);
  without_n2.erase(without_n2.begin() + 2);
  auto left = Membership::make(without_n2, "n0").value();
  for (int i = 0; i < 10000; ++i) {
    if (before.owner(chunk(i)).name != "n2") {
      EXPECT_EQ(before.owner(chunk(i)).name, left.owner(chunk(i)).name);
    }
  }
}

TEST(Membership, BadMembershipsAreRefused) {
  EXPECT_EQ(Membership::make({}, "a").error().code(), Code::kInvalidArgument);
  EXPECT_EQ(Membership::make(members(3), "n9").error().code(), Code::kInvalidArgument);
  auto twice = members(2);
  twice[1].name = "n0";
  auto r = Membership::make(twice, "n0");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("listed twice"), std::string::npos);
}

TEST(HostList, NamesAddressesAndComments) {
  auto m = parse_host_list("# job 42\nn0 10.0.0.1:7070\n\n  10.0.0.2:7071   # no name\n", "peers")
               .value();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].name, "n0");
  EXPECT_EQ(m[0].host, "10.0.0.1");
  EXPECT_EQ(m[0].port, 7070);
  EXPECT_EQ(m[1].name, "10.0.0.2:7071");
  EXPECT_EQ(m[1].address(), "10.0.0.2:7071");
}

TEST(Membership, FetchOnlyMembersOwnNothing) {
  auto text =
      parse_host_list("a 127.0.0.1:1\nb 127.0.0.1:2 fetch-only\nc 127.0.0.1:3\n", "p").value();
  ASSERT_EQ(text.size(), 3u);
  EXPECT_FALSE(text[1].owns);
  auto m = Membership::make(text, "b").value();
  for (int i = 0; i < 2000; ++i) EXPECT_NE(m.owner(chunk(i)).name, "b");
  // The owners among a and c are the same as if b were not listed at all.
  std::vector<Member> ac = {text[0], text[2]};
  auto without = Membership::make(ac, "a").value();
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(m.owner(chunk(i)).name, without.owner(chunk(i)).name);
  text[0].owns = text[2].owns = false;
  EXPECT_FALSE(Membership::make(text, "a"));
}

TEST(HostList, BadLinesNameTheFileAndLine) {
  for (const char* bad : {"n0 host", "n0 host:0", "n0 host:70000", "n0 host:12x", "a b c:1",
                          "a b:1 owner", "fetch-only", "n0 ho/st:1", "n0 :80", ""}) {
    auto r = parse_host_list(std::string("# first\n") + bad + "\n", "peers.txt");
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find("peers.txt"), std::string::npos) << r.error().message();
  }
}

TEST(Hostlist, SlurmRangesListsAndPadding) {
  auto v = expand_hostlist("gpu[01-03,07],login-a,rack[1-2]-n[8-9]").value();
  std::vector<std::string> want = {"gpu01",    "gpu02",    "gpu03",    "gpu07",   "login-a",
                                   "rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"};
  EXPECT_EQ(v, want);
  EXPECT_EQ(expand_hostlist("node[9-11]").value(),
            (std::vector<std::string>{"node9", "node10", "node11"}));
}

TEST(Hostlist, MalformedListsAreErrorsNotHugeAllocations) {
  for (const char* bad : {"", "gpu[01-", "gpu]", "gpu[3-1]", "gpu[a-b]", "gpu[[1-2]]", "a[0-99999]",
                          "a[0-999]b[0-999]", "gpu[-1]"}) {
    auto r = expand_hostlist(bad);
    EXPECT_FALSE(r) << bad;
  }
}

TEST(Signature, VerifiesOnlyTheRequestSignedWithTheSecret) {
  ChunkRequest r{"n1", "n2", "s3://b/ds", "shard-1.tar", "abc",
                 3,    0,    1 << 20,     false,         1'700'000'000};
  const std::string secret = "0123456789abcdef0123";
  std::string sig = sign_chunk_request(r, secret);
  EXPECT_EQ(sig.size(), 64u);
  EXPECT_TRUE(verify_chunk_request(r, sig, secret, r.time + 10));
  EXPECT_EQ(verify_chunk_request(r, sig, "another secret 1234", r.time).error().code(),
            Code::kPermissionDenied);
  auto stale = verify_chunk_request(r, sig, secret, r.time + 3600);
  ASSERT_FALSE(stale);
  EXPECT_NE(stale.error().message().find("clock"), std::string::npos);
  for (auto change :
       {+[](ChunkRequest& x) { x.index = 4; }, +[](ChunkRequest& x) { x.key += "x"; },
        +[](ChunkRequest& x) { x.etag = "abd"; }, +[](ChunkRequest& x) { x.length = 1; },
        +[](ChunkRequest& x) { x.node = "n2"; }, +[](ChunkRequest& x) { x.root = "s3://b/other"; },
        +[](ChunkRequest& x) { x.target = "n3"; }, +[](ChunkRequest& x) { x.verify = true; }}) {
    ChunkRequest y = r;
    change(y);
    EXPECT_FALSE(verify_chunk_request(y, sig, secret, r.time)) << "a changed field still verified";
  }
  EXPECT_FALSE(verify_chunk_request(r, sig.substr(1), secret, r.time));
  EXPECT_FALSE(verify_chunk_request(r, "", secret, r.time));
  // A newline in a field could move the boundary between fields: refused before signing.
  ChunkRequest shifted = r;
  shifted.key = "shard-1.tar\nabc";
  shifted.etag = "";
  auto bad = verify_chunk_request(shifted, sign_chunk_request(shifted, secret), secret, r.time);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Code::kInvalidArgument);
}

TEST(Signature, RepliesAreBoundToTheirRequest) {
  const std::string secret = "0123456789abcdef0123";
  std::string a = sign_chunk_reply("req-sig-1", "etag", 4096, 0x1234, secret);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, sign_chunk_reply("req-sig-1", "etag", 4096, 0x1234, secret));
  EXPECT_NE(a, sign_chunk_reply("req-sig-2", "etag", 4096, 0x1234, secret));
  EXPECT_NE(a, sign_chunk_reply("req-sig-1", "etag2", 4096, 0x1234, secret));
  EXPECT_NE(a, sign_chunk_reply("req-sig-1", "etag", 4095, 0x1234, secret));
  EXPECT_NE(a, sign_chunk_reply("req-sig-1", "etag", 4096, 0x1235, secret));
  EXPECT_NE(a, sign_chunk_reply("req-sig-1", "etag", 4096, 0x1234, "another secret 12345"));
}

}  // namespace
}  // namespace sluice::peer
