// The client layer: what a user's text names, and a Session opening stores, the node's cache
// and the ledger from explicit options.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "sluice/client/location.h"
#include "sluice/client/session.h"
#include "test_util.h"

namespace sluice::client {
namespace {

using sluice::testing::TempDir;

TEST(Location, NamesAStoreAndAKeyOrALocalPath) {
  auto s3 = parse_location("s3://bucket/a/b.tar");
  ASSERT_TRUE(s3);
  EXPECT_FALSE(s3->local);
  EXPECT_FALSE(s3->cached);
  EXPECT_EQ(s3->store_uri, "s3://bucket");
  EXPECT_EQ(s3->path, "a/b.tar");
  auto cached = parse_location("cache+file:///data/x");
  ASSERT_TRUE(cached);
  EXPECT_TRUE(cached->local);
  EXPECT_TRUE(cached->cached);
  EXPECT_EQ(cached->path, "/data/x");
  auto plain = parse_location("rel/dir/");
  ASSERT_TRUE(plain);
  EXPECT_TRUE(plain->local);
  EXPECT_EQ(plain->path, "rel/dir/");
  EXPECT_TRUE(parse_location("cache+/tmp/x")->local);  // no scheme: a path that says so
  EXPECT_EQ(parse_location("mem://m")->store_uri, "mem://m");
  EXPECT_EQ(parse_location("mem://m")->path, "");
  for (const char* bad : {"", "s3://", "s3:///k", "cache+://x", "file://"}) {
    auto r = parse_location(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_EQ(scheme_of("s3://b"), "s3");
  EXPECT_EQ(scheme_of("/p://x"), "");
}

SessionOptions options_in(const TempDir& dir) {
  SessionOptions o;
  o.home = dir.path() + "/home";
  return o;
}

TEST(Session, FillsItsDefaultsFromHome) {
  TempDir dir;
  Session s(options_in(dir));
  EXPECT_EQ(s.cache_directory(), dir.path() + "/home/cache");
  EXPECT_EQ(s.daemon_socket(), dir.path() + "/home/sluiced.sock");
  EXPECT_EQ(s.ledger_uri(), dir.path() + "/home/ledger.db");
  EXPECT_EQ(s.cache_options().directory, s.cache_directory());
}

TEST(Session, ReadsThroughTheEmbeddedCacheWhenNoDaemonAnswers) {
  TempDir dir;
  SessionOptions o = options_in(dir);
  std::vector<std::string> told;
  o.on_fallback = [&](const std::string& why) { told.push_back(why); };
  Session s(std::move(o));
  const std::string uri = "mem://session-test-" + std::to_string(::getpid());
  auto plain = s.open_store(uri);
  ASSERT_TRUE(plain) << plain.error().to_string();
  std::vector<std::byte> data(100000, std::byte{7});
  ASSERT_TRUE((*plain)->put("k", data));
  auto cached = s.open_cached(uri);
  ASSERT_TRUE(cached) << cached.error().to_string();
  auto back = (*cached)->get("k");
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(*back, data);
  ASSERT_EQ(told.size(), 1u);  // why: no sluiced on the socket
  EXPECT_NE(told[0].find("sluiced.sock"), std::string::npos) << told[0];
  EXPECT_TRUE(std::filesystem::exists(s.cache_directory()));
}

TEST(Session, ChargesWritesOnlyWhereALedgerHasProjects) {
  TempDir dir;
  Session s(options_in(dir));
  // No ledger at all: nothing to charge, the store comes back as it was.
  auto none = s.ledger_for_writes();
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, nullptr);
  std::shared_ptr<store::Store> mem =
      s.open_store("mem://charged-" + std::to_string(::getpid())).value();
  EXPECT_EQ(s.charged(mem).value(), mem);
  // The embedded ledger, made on first use; with a project, writes are charged.
  auto l = s.open_ledger();
  ASSERT_TRUE(l) << l.error().to_string();
  EXPECT_TRUE(std::filesystem::exists(s.ledger_uri()));
  EXPECT_EQ(*s.ledger_for_writes(), nullptr);  // no project yet
  ASSERT_TRUE((*l)->add_team("t"));
  ASSERT_TRUE((*l)->add_project(ledger::Project{.id = "p", .team = "t", .location = mem->uri()}));
  auto with = s.ledger_for_writes();
  ASSERT_TRUE(with && *with);
  auto wrapped = s.charged(mem);
  ASSERT_TRUE(wrapped);
  EXPECT_NE(*wrapped, mem);
  // A ledger chosen by name that cannot be opened refuses the write, never skips it.
  SessionOptions o = options_in(dir);
  o.ledger = {dir.path() + "/missing/dir/ledger.db", "--ledger"};
  auto refused = Session(std::move(o)).charged(mem);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("--ledger"), std::string::npos)
      << refused.error().to_string();
}

}  // namespace
}  // namespace sluice::client
