// The client layer: what a user's text names, and a Session opening stores, the node's cache
// and the ledger from explicit options.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sluice/client/checkpoints.h"
#include "sluice/client/copy.h"
#include "sluice/client/datasets.h"
#include "sluice/client/ledger.h"
#include "sluice/client/location.h"
#include "sluice/client/object.h"
#include "sluice/client/read.h"
#include "sluice/client/session.h"
#include "sluice/stream/pack.h"
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

TEST(Session, SaysWhereCachedReadsGo) {
  TempDir dir;
  SessionOptions o = options_in(dir);
  CacheRoute none = Session(o).cache_route();
  EXPECT_FALSE(none.daemon);
  EXPECT_EQ(none.directory, dir.path() + "/home/cache");
  EXPECT_NE(none.reason.find("no sluiced answers on " + dir.path() + "/home/sluiced.sock"),
            std::string::npos)
      << none.reason;
  o.daemon_socket = "none";
  CacheRoute off = Session(o).cache_route();
  EXPECT_FALSE(off.daemon);
  EXPECT_EQ(off.socket, "");
  EXPECT_NE(off.reason.find("turned off"), std::string::npos) << off.reason;
}

TEST(Object, OpensTheStoreAndKeyATextNames) {
  TempDir dir;
  Session s(options_in(dir));
  std::ofstream(dir.path() + "/a.bin") << "abc";
  auto local = open_object(s, dir.path() + "/a.bin");
  ASSERT_TRUE(local) << local.error().to_string();
  EXPECT_EQ(local->key, "a.bin");
  EXPECT_EQ(local->store->get("a.bin").value().size(), 3u);
  const std::string mem = "mem://object-test-" + std::to_string(::getpid());
  auto m = open_object(s, mem + "/d/k", {.writes = true});
  ASSERT_TRUE(m) << m.error().to_string();
  EXPECT_EQ(m->key, "d/k");
  ASSERT_TRUE(m->store->put("d/k", std::vector<std::byte>(5)));
  ASSERT_TRUE(m->store->put("d/e/f", std::vector<std::byte>(2)));
  ASSERT_TRUE(m->store->put("top", std::vector<std::byte>(1)));
  auto cached = open_object(s, "cache+" + mem + "/d/k");
  ASSERT_TRUE(cached) << cached.error().to_string();
  EXPECT_TRUE(cached->cached);
  EXPECT_EQ(cached->store->get("d/k").value().size(), 5u);

  // A prefix where an object is asked for, and a write through the cache, are refused.
  EXPECT_EQ(open_object(s, mem + "/d/").error().code(), Code::kInvalidArgument);
  EXPECT_EQ(open_object(s, "s3://bucket").error().code(), Code::kInvalidArgument);
  auto w = open_object(s, "cache+" + mem + "/d/k", {.writes = true});
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("never go through the node's cache"), std::string::npos);
  // A reader never makes a missing directory.
  EXPECT_EQ(open_object(s, dir.path() + "/nodir/x").error().code(), Code::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/nodir"));

  auto all = list_objects(s, mem + "/d/", true);
  ASSERT_TRUE(all) << all.error().to_string();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "d/e/f");
  EXPECT_EQ((*all)[1].key, "d/k");
  auto one = list_objects(s, mem + "/", false);
  ASSERT_TRUE(one) << one.error().to_string();
  ASSERT_EQ(one->size(), 2u);
  EXPECT_EQ((*one)[0].key, "d/");
  EXPECT_EQ((*one)[1].key, "top");
}

TEST(Session, ChargesWritesOnlyWhereALedgerHasProjects) {
  TempDir dir;
  SessionOptions charging = options_in(dir);
  charging.charging = ledger_charging();
  Session s(std::move(charging));
  // No ledger at all: nothing to charge, the store comes back as it was.
  auto none = ledger_for_writes(s);
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, nullptr);
  std::shared_ptr<store::Store> mem =
      s.open_store("mem://charged-" + std::to_string(::getpid())).value();
  EXPECT_EQ(s.charged(mem).value(), mem);
  // The embedded ledger, made on first use; with a project, writes are charged.
  auto l = open_ledger(s);
  ASSERT_TRUE(l) << l.error().to_string();
  EXPECT_TRUE(std::filesystem::exists(s.ledger_uri()));
  EXPECT_EQ(*ledger_for_writes(s), nullptr);  // no project yet
  ASSERT_TRUE((*l)->add_team("t"));
  ASSERT_TRUE((*l)->add_project(ledger::Project{.id = "p", .team = "t", .location = mem->uri()}));
  auto with = ledger_for_writes(s);
  ASSERT_TRUE(with && *with);
  auto wrapped = s.charged(mem);
  ASSERT_TRUE(wrapped);
  EXPECT_NE(*wrapped, mem);
  // A ledger chosen by name that cannot be opened refuses the write, never skips it.
  SessionOptions o = options_in(dir);
  o.ledger = {dir.path() + "/missing/dir/ledger.db", "--ledger"};
  o.charging = ledger_charging();
  auto refused = Session(o).charged(mem);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("--ledger"), std::string::npos)
      << refused.error().to_string();
  // A program that charges nothing (sluice::client_core alone) refuses a write a ledger
  // would charge, rather than let it through uncounted; with no ledger it writes.
  o.charging = nullptr;
  auto uncharged = Session(o).charged(mem);
  ASSERT_FALSE(uncharged);
  EXPECT_EQ(uncharged.error().code(), Code::kUnsupported);
  EXPECT_EQ(Session(options_in(dir)).charged(mem).error().code(), Code::kUnsupported)
      << "the embedded ledger exists now";
  TempDir empty;
  EXPECT_EQ(Session(options_in(empty)).charged(mem).value(), mem);
}

// peer://FOLDER/ names the job's members that keep a series' copies: the same three, in the
// same order, on every node; other tiers pass through; bad settings are refused by name.
TEST(CheckpointTiers, PeerTiersResolveToTheMembersThatKeepTheSeries) {
  PeerTierSettings peers;
  peers.node = "n0";
  peers.members_source = "the test's members";
  for (int i = 0; i < 5; ++i)
    peers.members.push_back({"n" + std::to_string(i), "127.0.0.1", uint16_t(9000 + i)});
  const std::vector<std::string> uris = {"/nvme/ckpt", "peer://ckpt/", "s3://b/p"};
  auto read = resolve_peer_tiers(uris, "llama", 1, peers, {}, /*writes=*/false);
  ASSERT_TRUE(read) << read.error().to_string();
  ASSERT_EQ(read->size(), 5u);
  EXPECT_EQ((*read)[0], "/nvme/ckpt");
  EXPECT_EQ((*read)[4], "s3://b/p");
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_TRUE((*read)[i].starts_with("sluiced://n")) << (*read)[i];
    EXPECT_TRUE((*read)[i].ends_with("/ckpt/")) << (*read)[i];
  }
  PeerTierSettings other = peers;
  other.node = "n3";
  EXPECT_EQ(resolve_peer_tiers(uris, "llama", 1, other, {}, false).value(), *read);

  auto refused = [&](const PeerTierSettings& p, const std::string& series, unsigned world) {
    auto r = resolve_peer_tiers({"peer://ckpt/"}, series, world, p, {}, false);
    return r ? std::string() : r.error().message();
  };
  EXPECT_NE(refused(PeerTierSettings{}, "llama", 1).find("members"), std::string::npos);
  EXPECT_NE(refused(peers, "", 1).find("--series"), std::string::npos);
  EXPECT_NE(refused(peers, "llama", 2).find("multi-rank"), std::string::npos);
  PeerTierSettings alone;
  alone.node = "n0";
  alone.members = {peers.members[0]};
  auto w = resolve_peer_tiers({"peer://ckpt/"}, "llama", 1, alone, {}, /*writes=*/true);
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("keeps copies"), std::string::npos);
}

// A range read in windows, in order, whatever the window and depth; the sink's error and an
// object shorter than its stat stop it.
TEST(ReadRange, HandsTheRangeOverInOrder) {
  auto store = store::make_memory_store("read-range-test");
  std::vector<std::byte> data = sluice::testing::random_bytes(5'000'000, 3);
  ASSERT_TRUE(store->put("obj", data));
  auto info = store->stat("obj").value();
  for (auto [window, depth] : {std::pair<size_t, size_t>{1 << 20, 2}, {4096, 1}, {3 << 20, 4}}) {
    std::vector<std::byte> got;
    ReadRangeOptions o;
    o.offset = 100;
    o.end = 4'000'007;
    o.window = window;
    o.depth = depth;
    ASSERT_TRUE(read_range(*store, "obj", info, o, [&](std::span<const std::byte> b) -> Status {
      got.insert(got.end(), b.begin(), b.end());
      return ok();
    }));
    ASSERT_EQ(got.size(), 4'000'007u - 100);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + 100)) << window;
  }
  int calls = 0;
  auto stopped = read_range(*store, "obj", info, {.window = 1 << 20}, [&](auto) -> Status {
    return ++calls == 2 ? fail(Code::kIoError, "sink full") : ok();
  });
  EXPECT_EQ(stopped.error().code(), Code::kIoError);
  EXPECT_EQ(calls, 2);
  store::ObjectInfo longer = info;
  longer.size += 10;
  EXPECT_EQ(read_range(*store, "obj", longer, {}, [](auto) { return ok(); }).error().code(),
            Code::kCorruption);
}

// A dataset opened by URI, listed once per node through the catalog, and listed again when
// it was packed anew in place (before any read fails on the old listing).
TEST(Datasets, TheCatalogListsOnceAndNoticesARepack) {
  TempDir dir;
  Session s(options_in(dir));
  auto pack = [&](int samples, char fill) {
    std::filesystem::remove_all(dir.file("src"));
    std::filesystem::remove_all(dir.file("ds"));
    std::filesystem::create_directories(dir.file("src"));
    std::filesystem::create_directories(dir.file("ds"));
    for (int i = 0; i < samples; ++i)
      std::ofstream(dir.file("src/s" + std::to_string(i) + ".bin")) << std::string(100, fill);
    auto st = store::open_store("file://" + dir.file("ds")).value();
    ASSERT_TRUE(
        stream::pack_directory(stream::find_sample_files(dir.file("src")).value(), *st, "", {}));
  };
  pack(10, 'a');
  DatasetSpec spec{.uri = dir.file("ds"), .through_cache = false, .catalog = true};
  auto first = open_dataset(s, spec);
  ASSERT_TRUE(first) << first.error().to_string();
  EXPECT_EQ((*first)->samples(), 10u);
  EXPECT_FALSE((*first)->from_catalog());
  first->reset();
  auto second = open_dataset(s, spec).value();
  EXPECT_TRUE(second->from_catalog());
  EXPECT_EQ(second->samples(), 10u);
  second.reset();
  pack(12, 'b');
  auto third = open_dataset(s, spec).value();
  EXPECT_EQ(third->samples(), 12u);
  EXPECT_TRUE(std::filesystem::exists(s.options().home + "/datasets"));
  EXPECT_EQ(open_dataset(s, {.uri = dir.file("missing")}).error().code(), Code::kNotFound);
  EXPECT_EQ(dataset_location("s3://b/data").value().prefix, "data/");
}

// `sluice cp` as a call: a file into a directory gets its name, a tree goes whole, and what
// would destroy or hang (a copy onto itself or into itself, a FIFO) is refused up front.
TEST(Copy, CopiesObjectsAndTreesAndRefusesOverlaps) {
  TempDir dir;
  Session s(options_in(dir));
  const std::string src = dir.path() + "/src", out = dir.path() + "/out";
  std::filesystem::create_directories(src + "/sub");
  std::filesystem::create_directories(out);
  std::ofstream(src + "/a.bin") << std::string(300000, 'a');
  std::ofstream(src + "/sub/b.bin") << "bee";

  auto one = copy(s, {.src = src + "/a.bin", .dst = out + "/"});
  ASSERT_TRUE(one) << one.error().to_string();
  EXPECT_EQ(one->objects, 1u);
  EXPECT_EQ(std::filesystem::file_size(out + "/a.bin"), 300000u);

  std::vector<uint64_t> seen;
  auto tree =
      copy(s, {.src = src,
               .dst = out + "/tree",
               .recursive = true,
               .on_progress = [&](const xfer::CopyProgress& p) { seen.push_back(p.bytes_done); }});
  ASSERT_TRUE(tree) << tree.error().to_string();
  EXPECT_EQ(tree->objects, 2u);
  EXPECT_EQ(tree->bytes, 300003u);
  EXPECT_TRUE(tree->failures.empty());
  EXPECT_FALSE(seen.empty());
  EXPECT_TRUE(std::filesystem::exists(out + "/tree/sub/b.bin"));

  EXPECT_EQ(copy(s, {.src = src + "/a.bin", .dst = src + "/a.bin"}).error().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(copy(s, {.src = src, .dst = src + "/sub/x", .recursive = true}).error().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(copy(s, {.src = src, .dst = out}).error().code(), Code::kInvalidArgument);  // a dir
  ASSERT_EQ(::mkfifo((src + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(copy(s, {.src = src + "/fifo", .dst = out}).error().code(), Code::kInvalidArgument);
  EXPECT_EQ(copy(s, {.src = dir.path() + "/nope", .dst = out}).error().code(), Code::kNotFound);
}

}  // namespace
}  // namespace sluice::client
