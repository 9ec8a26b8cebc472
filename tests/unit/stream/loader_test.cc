// The streaming loader: exactly-once partitions, deterministic order, exact resume,
// corrupt shards, throttling, and copies into device memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "sluice/cache/tiered_cache.h"
#include "sluice/core/hash.h"
#include "sluice/mem/target.h"
#include "sluice/store/store.h"
#include "sluice/store/wrapper.h"
#include "sluice/stream/dataset.h"
#include "sluice/stream/pack.h"
#include "sluice/stream/tar.h"
#include "sluice/testing/fault_store.h"
#include "test_util.h"

namespace sluice::stream {
namespace {

using testing::as_bytes;

std::string sample_key(size_t shard, size_t i) {
  return "s" + std::to_string(shard) + "/" + std::to_string(i);
}

// Tar shards with the given sample counts; every sample has "txt" (its key) and "bin".
// Shards with an even number get an index; the others are scanned.
void write_tar_dataset(store::Store& s, const std::vector<size_t>& counts,
                       const std::string& prefix = "ds/") {
  for (size_t shard = 0; shard < counts.size(); ++shard) {
    std::vector<std::byte> tar;
    TarWriter w([&](std::span<const std::byte> b) {
      tar.insert(tar.end(), b.begin(), b.end());
      return ok();
    });
    ShardIndex index;
    for (size_t i = 0; i < counts[shard]; ++i) {
      std::string key = sample_key(shard, i);
      uint64_t start = w.bytes();
      ASSERT_TRUE(w.add(key + ".txt", as_bytes(key)));
      auto bin = testing::random_bytes(100 + 37 * i, shard * 1000 + i);
      ASSERT_TRUE(w.add(key + ".bin", bin));
      index.samples.push_back({key, start, w.bytes() - start});
    }
    ASSERT_TRUE(w.finish());
    index.shard_size = tar.size();
    char name[32];
    std::snprintf(name, sizeof name, "shard-%04zu.tar", shard);
    ASSERT_TRUE(s.put(prefix + name, tar));
    if (shard % 2 == 0) {
      ASSERT_TRUE(s.put(prefix + name + ".idx", encode_index(index)));
    }
  }
}

std::shared_ptr<Dataset> open_ds(std::shared_ptr<store::Store> s, const std::string& prefix,
                                 DatasetOptions o = {}) {
  auto ds = Dataset::open(std::move(s), prefix, o);
  EXPECT_TRUE(ds) << ds.error().to_string();
  return ds ? *ds : nullptr;
}

struct Read {
  uint64_t epoch, position, index;
  bool operator==(const Read&) const = default;
  friend void PrintTo(const Read& r, std::ostream* os) {
    *os << r.epoch << ":" << r.position << "=" << r.index;
  }
};

// Drains a loader (or reads `limit` samples); checks each sample's bytes on the way.
std::vector<Read> drain(Loader& l, const Dataset& ds, size_t limit = SIZE_MAX) {
  std::vector<Read> out;
  while (out.size() < limit) {
    auto s = l.next();
    EXPECT_TRUE(s) << s.error().to_string();
    if (!s || !*s) break;
    const Sample& x = **s;
    EXPECT_EQ(x.key, ds.sample_key(x.index));
    if (ds.format() == Format::kTar) {
      auto* txt = x.field("txt");
      EXPECT_TRUE(txt && std::string_view(reinterpret_cast<const char*>(txt->data.data()),
                                          txt->data.size()) == x.key);
    }
    out.push_back({x.epoch, x.position, x.index});
  }
  return out;
}

std::shared_ptr<Dataset> tar_dataset(const std::vector<size_t>& counts) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  write_tar_dataset(*s, counts);
  return open_ds(s, "ds/");
}

std::shared_ptr<Dataset> object_dataset(size_t n) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  for (size_t i = 0; i < n; ++i) {
    std::string key = "objs/" + std::to_string(1000 + i);
    EXPECT_TRUE(s->put(key + ".bin", testing::random_bytes(10 + i, i)));
    if (i % 3 == 0) {
      EXPECT_TRUE(s->put(key + ".cls", as_bytes(std::to_string(i))));
    }
  }
  return open_ds(s, "objs/");
}

TEST(Dataset, OpensTarShardsWithAndWithoutIndexes) {
  auto ds = tar_dataset({3, 5, 0, 2});
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->format(), Format::kTar);
  EXPECT_EQ(ds->samples(), 10u);
  ASSERT_EQ(ds->shards().size(), 4u);
  EXPECT_TRUE(ds->shards()[0].indexed);
  EXPECT_FALSE(ds->shards()[1].indexed);
  EXPECT_EQ(ds->sample_key(3), sample_key(1, 0));
}

TEST(Dataset, ObjectsGroupFieldsByBasename) {
  auto ds = object_dataset(10);
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->format(), Format::kObjects);
  EXPECT_EQ(ds->samples(), 10u);
  EXPECT_EQ(ds->sample_key(0), "1000");
  EXPECT_EQ(ds->sample(0).objects, 2u);  // .bin and .cls
  EXPECT_EQ(ds->sample(1).objects, 1u);
}

TEST(Dataset, EmptyPrefixIsNotFound) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  auto ds = Dataset::open(s, "nothing/");
  ASSERT_FALSE(ds);
  EXPECT_EQ(ds.error().code(), Code::kNotFound);
}

// Every (world, workers) partition reads every sample exactly once per epoch.
TEST(Loader, ExactlyOncePerEpochAcrossRanksAndWorkers) {
  for (auto ds : {tar_dataset({7, 13, 1, 20, 5, 0, 9}), object_dataset(37)}) {
    ASSERT_TRUE(ds);
    for (auto [world, workers] :
         std::vector<std::pair<unsigned, unsigned>>{{1, 1}, {2, 1}, {3, 2}, {4, 3}, {64, 1}}) {
      std::map<uint64_t, std::multiset<uint64_t>> seen;  // epoch -> samples
      std::vector<size_t> counts;
      for (unsigned r = 0; r < world; ++r)
        for (unsigned w = 0; w < workers; ++w) {
          Loader l(ds, {.seed = 11,
                        .epochs = 2,
                        .rank = r,
                        .world = world,
                        .worker = w,
                        .workers = workers,
                        .shuffle_window = 10});
          auto reads = drain(l, *ds);
          size_t in_epoch0 = 0;
          for (const auto& x : reads) {
            seen[x.epoch].insert(x.index);
            in_epoch0 += x.epoch == 0;
          }
          counts.push_back(in_epoch0);
        }
      ASSERT_EQ(seen.size(), 2u);
      for (auto& [epoch, s] : seen) {
        ASSERT_EQ(s.size(), ds->samples()) << "world " << world << " workers " << workers;
        uint64_t want = 0;
        for (uint64_t x : s) EXPECT_EQ(x, want++);
      }
      // Shares differ by at most one sample, the larger ones first (consumer w * world + r).
      auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
      EXPECT_LE(*hi - *lo, 1u);
      std::vector<size_t> by_consumer;
      for (unsigned w = 0; w < workers; ++w)
        for (unsigned r = 0; r < world; ++r) by_consumer.push_back(counts[r * workers + w]);
      EXPECT_TRUE(std::is_sorted(by_consumer.rbegin(), by_consumer.rend()));
    }
  }
}

// Workers taking their rank's stream in blocks: a DataLoader that takes one batch of `block`
// from each worker in turn sees the rank's stream in order, so the count it took is an
// exact token, whatever the ranks, workers and block are after the resume.
TEST(Loader, BlocksHandTheRanksStreamInOrder) {
  auto ds = tar_dataset({7, 13, 1, 20, 5, 0, 9});  // 55 samples
  struct Layout {
    unsigned world, workers;
    uint64_t block;
  };
  for (Layout lay : std::vector<Layout>{{1, 2, 4}, {3, 2, 5}, {2, 3, 1}, {2, 4, 3}, {1, 1, 7}}) {
    std::multiset<uint64_t> seen;
    for (unsigned r = 0; r < lay.world; ++r) {
      std::vector<std::vector<Read>> per_worker;
      for (unsigned w = 0; w < lay.workers; ++w) {
        Loader l(ds, {.seed = 3,
                      .rank = r,
                      .world = lay.world,
                      .worker = w,
                      .workers = lay.workers,
                      .block = lay.block,
                      .shuffle_window = 10});
        per_worker.push_back(drain(l, *ds));
      }
      // The main process: one batch from each worker in turn.
      std::vector<uint64_t> stream;
      std::vector<size_t> at(lay.workers, 0);
      for (bool more = true; more;) {
        more = false;
        for (unsigned w = 0; w < lay.workers; ++w)
          for (uint64_t b = 0; b < lay.block && at[w] < per_worker[w].size(); ++b, more = true)
            stream.push_back(per_worker[w][at[w]++].position);
      }
      for (size_t j = 0; j < stream.size(); ++j)
        ASSERT_EQ(stream[j], r + lay.world * j)
            << "world " << lay.world << " workers " << lay.workers << " block " << lay.block;
      for (auto& v : per_worker)
        for (auto& x : v) seen.insert(x.index);
    }
    ASSERT_EQ(seen.size(), ds->samples());
    EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), ds->samples());
  }
  Loader zero(ds, {.block = 0});
  auto bad = zero.next();
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Code::kInvalidArgument);
}

// Every consumer (rank and worker) that took as many whole blocks says the same token, and
// a resume from it (any layout) reads the rest exactly once.
TEST(Loader, WorkersInLockstepShareOneToken) {
  auto ds = tar_dataset({7, 13, 1, 20, 5, 0, 9});
  for (uint64_t block : {uint64_t{1}, uint64_t{3}}) {
    std::multiset<uint64_t> seen;
    std::set<std::string> tokens;
    for (unsigned r = 0; r < 2; ++r)
      for (unsigned w = 0; w < 2; ++w) {
        Loader l(ds, {.seed = 5,
                      .rank = r,
                      .world = 2,
                      .worker = w,
                      .workers = 2,
                      .block = block,
                      .shuffle_window = 10});
        for (auto& x : drain(l, *ds, 6)) seen.insert(x.index);
        tokens.insert(l.state());
      }
    ASSERT_EQ(tokens.size(), 1u) << "block " << block;
    Loader rest(ds, {.seed = 5, .resume = *tokens.begin(), .shuffle_window = 10});
    for (auto& x : drain(rest, *ds)) seen.insert(x.index);
    EXPECT_EQ(seen.size(), ds->samples());
    EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), ds->samples());
  }
}

TEST(Loader, OrderIsAFunctionOfSeedAndEpoch) {
  auto ds = tar_dataset({7, 13, 1, 20, 5, 0, 9});
  auto order = [&](uint64_t seed, uint64_t epoch) {
    Loader l(ds, {.seed = seed, .epoch = epoch, .shuffle_window = 10});
    std::vector<uint64_t> v;
    for (auto& x : drain(l, *ds)) v.push_back(x.index);
    return v;
  };
  auto a = order(5, 0);
  EXPECT_EQ(a, order(5, 0));
  EXPECT_NE(a, order(5, 1));
  EXPECT_NE(a, order(6, 0));
  for (size_t p = 0; p < a.size(); ++p) EXPECT_EQ(a[p], Loader::order_at(*ds, 5, 0, true, 10, p));
  Loader plain(ds, {.shuffle = false});
  std::vector<uint64_t> identity;
  for (auto& x : drain(plain, *ds)) identity.push_back(x.index);
  for (size_t p = 0; p < identity.size(); ++p) EXPECT_EQ(identity[p], p);
}

// Resuming every consumer from its token (at a random point, then again) reads exactly
// what the uninterrupted run reads.
TEST(Loader, ResumeEqualsUninterruptedRun) {
  auto ds = tar_dataset({7, 13, 1, 20, 5, 0, 9});
  const unsigned world = 3;
  auto opts = [&](unsigned r, std::string token = "") {
    return LoaderOptions{.seed = 3,
                         .epochs = 3,
                         .rank = r,
                         .world = world,
                         .resume = std::move(token),
                         .shuffle_window = 12};
  };
  std::vector<std::vector<Read>> full(world);
  for (unsigned r = 0; r < world; ++r) {
    Loader l(ds, opts(r));
    full[r] = drain(l, *ds);
  }
  // Consumers step together within an epoch: a lockstep point is (epoch, j samples into
  // it), and consumer r has then consumed its shares of the epochs before plus j.
  const uint64_t epochs = 3;
  std::vector<std::vector<size_t>> before(world, std::vector<size_t>(epochs + 1, 0));
  size_t min_share = SIZE_MAX;
  for (unsigned r = 0; r < world; ++r)
    for (uint64_t e = 0; e < epochs; ++e) {
      size_t share = std::count_if(full[r].begin(), full[r].end(),
                                   [&](const Read& x) { return x.epoch == e; });
      before[r][e + 1] = before[r][e] + share;
      min_share = std::min(min_share, share);
    }
  std::mt19937 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    // A point is (epoch, j samples into it by every consumer), j from 1 up to the
    // smallest share (0 only at the very start: "all of the epoch before" is not a point
    // where every consumer has read as many samples).
    uint64_t e1 = rng() % epochs;
    uint64_t j1 = e1 == 0 ? rng() % (min_share + 1) : 1 + rng() % min_share;
    uint64_t e2 = e1 + rng() % (epochs - e1);
    uint64_t j2 = e2 == e1 ? j1 + rng() % (min_share - j1 + 1) : 1 + rng() % min_share;
    auto k1 = [&](unsigned r) { return before[r][e1] + j1; };
    auto k2 = [&](unsigned r) { return before[r][e2] + j2 - k1(r); };
    std::vector<std::vector<Read>> got(world);
    std::string token;
    for (unsigned r = 0; r < world; ++r) {
      Loader l(ds, opts(r));
      got[r] = drain(l, *ds, k1(r));
      if (r == 0) token = l.state();
      EXPECT_EQ(l.state(), token) << "consumers in lockstep share one token";
    }
    std::string token2;
    for (unsigned r = 0; r < world; ++r) {
      Loader l(ds, opts(r, token));
      auto more = drain(l, *ds, k2(r));
      got[r].insert(got[r].end(), more.begin(), more.end());
      if (r == 0) token2 = l.state();
      EXPECT_EQ(l.state(), token2);
    }
    for (unsigned r = 0; r < world; ++r) {
      Loader l(ds, opts(r, token2));
      auto rest = drain(l, *ds);
      got[r].insert(got[r].end(), rest.begin(), rest.end());
      EXPECT_EQ(got[r], full[r]) << "trial " << trial << " rank " << r << " tokens " << token << " "
                                 << token2;
    }
  }
}

// A job resumed on a different number of ranks covers the rest of the epoch exactly once.
TEST(Loader, ElasticResumeCoversTheRestOnce) {
  auto ds = tar_dataset({7, 13, 1, 20, 5, 0, 9});
  for (auto [before, after] : std::vector<std::pair<unsigned, unsigned>>{{2, 3}, {4, 1}, {3, 5}}) {
    std::multiset<uint64_t> epoch0, epoch1;
    std::string token;
    for (unsigned r = 0; r < before; ++r) {
      Loader l(ds, {.seed = 9, .epochs = 2, .rank = r, .world = before, .shuffle_window = 8});
      for (auto& x : drain(l, *ds, 5)) (x.epoch == 0 ? epoch0 : epoch1).insert(x.index);
      token = l.state();
    }
    for (unsigned r = 0; r < after; ++r) {
      Loader l(ds, {.seed = 9,
                    .epochs = 2,
                    .rank = r,
                    .world = after,
                    .resume = token,
                    .shuffle_window = 8});
      for (auto& x : drain(l, *ds)) (x.epoch == 0 ? epoch0 : epoch1).insert(x.index);
    }
    for (auto* s : {&epoch0, &epoch1}) {
      ASSERT_EQ(s->size(), ds->samples()) << before << " -> " << after;
      EXPECT_EQ(std::set<uint64_t>(s->begin(), s->end()).size(), ds->samples());
    }
  }
}

// A token in the form of an older version: v1 (no identity, no checksum) or v2 (no
// identity), as those versions wrote them.
std::string older_token(const ResumePoint& p, int version) {
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(p.fingerprint));
  std::string body = "v" + std::to_string(version) + "." + std::to_string(p.epoch) + "." +
                     std::to_string(p.position) + "." + std::to_string(p.samples) + "." + fp + "." +
                     std::to_string(p.seed) + "." + std::to_string(p.window);
  return version == 1 ? body : body + "." + xxh3_hex(body);
}

TEST(Loader, BadTokensAndPartitionsAreClearErrors) {
  auto ds = tar_dataset({3, 4});
  auto other = tar_dataset({3, 5});
  Loader a(ds, {.seed = 1});
  ASSERT_TRUE(a.next());
  std::string token = a.state();
  for (auto [opts, why] : std::vector<std::pair<LoaderOptions, std::string>>{
           {{.resume = "garbage"}, "malformed"},
           {{.seed = 2, .resume = token}, "seed"},
           {{.seed = 1, .resume = token, .shuffle = false}, "no shuffle"},
           {{.seed = 1, .resume = token, .shuffle_window = 3}, "shuffle window"},
           {{.rank = 2, .world = 2}, "rank"},
           {{.worker = 1, .workers = 1}, "worker"}}) {
    Loader l(ds, opts);
    auto r = l.next();
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
    EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
  }
  Loader l(other, {.seed = 1, .resume = token});
  auto r = l.next();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("another dataset"), std::string::npos);
  EXPECT_TRUE(parse_token(token));
  // Defect 6 of the hostile test: a token cut short (its window field) or changed is refused.
  ASSERT_TRUE(token.starts_with("v3."));
  for (size_t cut = 1; cut < token.size() - 3; ++cut) {
    auto p = parse_token(token.substr(0, token.size() - cut));
    ASSERT_FALSE(p) << token.substr(0, token.size() - cut);
    EXPECT_EQ(p.error().code(), Code::kInvalidArgument);
  }
  std::string changed = token;
  changed[3] = changed[3] == '1' ? '2' : '1';  // another epoch
  EXPECT_NE(parse_token(changed).error().message().find("checksum"), std::string::npos);
  auto p = parse_token(token).value();
  EXPECT_EQ(make_token(p), token);
  // A v1 token (no checksum) is read only with the shuffle window this read would use.
  ResumePoint v1p = p;
  v1p.window = p.window + 1;  // a field that cannot be told from a cut one
  std::string v1 = older_token(v1p, 1);
  Loader cut(ds, {.seed = 1, .resume = v1, .shuffle_window = 0});
  auto cr = cut.next();
  ASSERT_FALSE(cr);
  EXPECT_NE(cr.error().message().find("v1 resume token"), std::string::npos)
      << cr.error().message();
  EXPECT_FALSE(parse_token("v1.1.2.3.zz.4.5"));
  EXPECT_FALSE(parse_token("v1.1.2.3.00.4"));    // no window
  EXPECT_FALSE(parse_token("v1.1.9.3.00.4.5"));  // position past the samples
  EXPECT_TRUE(parse_token("v1.1.2.3.00.4.5"));
}

// Issue 47, defect 7: a token binds to the dataset's content (Dataset::identity), not only
// to its layout. A dataset regenerated with the same shard names, sizes and sample counts
// (other keys and bytes, or only other bytes) is another dataset to it; a v2 token (layout
// only) of an older version is still read.
TEST(Loader, TokenIsBoundToTheDatasetsContent) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  write_tar_dataset(*s, {4, 5, 3});
  auto ds = open_ds(s, "ds/");
  ASSERT_TRUE(ds);
  Loader a(ds, {.seed = 3, .shuffle_window = 4});
  ASSERT_EQ(drain(a, *ds, 5).size(), 5u);
  const std::string token = a.state();
  ASSERT_TRUE(token.starts_with("v3."));
  auto point = parse_token(token).value();
  EXPECT_EQ(point.version, 3u);
  EXPECT_EQ(point.identity, ds->identity());
  EXPECT_EQ(parse_token(make_token(point)).value().identity, ds->identity());

  // The same bytes read again (a second open) are the same identity.
  auto again = open_ds(s, "ds/");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->identity(), ds->identity());
  Loader same(again, {.seed = 3, .resume = token, .shuffle_window = 4});
  EXPECT_EQ(drain(same, *again).size(), ds->samples() - 5);

  // Shard 1 written again with the same size and sample table but other bytes (a
  // regenerated dataset whose layout did not change): another etag, another identity.
  auto shard = s->get("ds/shard-0001.tar").value();
  shard[3 * 512 + 50] ^= std::byte{1};  // in the first sample's "bin" data
  ASSERT_TRUE(s->put("ds/shard-0001.tar", shard));
  auto regenerated = open_ds(s, "ds/");
  ASSERT_TRUE(regenerated);
  EXPECT_EQ(regenerated->fingerprint(), ds->fingerprint());
  EXPECT_NE(regenerated->identity(), ds->identity());
  Loader stale(regenerated, {.seed = 3, .resume = token, .shuffle_window = 4});
  auto r = stale.next();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  EXPECT_NE(r.error().message().find("etag or sample table"), std::string::npos)
      << r.error().message();

  // Two copies that differ only in their indexes' sample keys (of the same lengths, so the
  // same sizes; written in the same order, so with the same etags): the layout fingerprint
  // cannot tell them apart; the identity, which covers the sample tables, can.
  auto copy = [&](bool rename) {
    std::shared_ptr<store::Store> to = store::make_memory_store();
    const auto listing = s->list_all("ds/").value();
    for (const auto& o : listing) {
      auto bytes = s->get(o.key).value();
      if (rename && o.key.ends_with(".idx")) {
        auto index = decode_index(bytes, o.key).value();
        for (auto& e : index.samples) e.key[0] = 'r';
        bytes = encode_index(index);
      }
      EXPECT_TRUE(to->put(o.key, bytes));
    }
    return open_ds(to, "ds/");
  };
  auto plain = copy(false), renamed = copy(true);
  ASSERT_TRUE(plain && renamed);
  EXPECT_EQ(renamed->fingerprint(), plain->fingerprint());
  EXPECT_NE(renamed->identity(), plain->identity());

  // A v2 token of the same dataset (no identity) is read, checked against the layout.
  Loader b(regenerated, {.seed = 3, .shuffle_window = 4});
  ASSERT_EQ(drain(b, *regenerated, 5).size(), 5u);
  const std::string v2 = older_token(parse_token(b.state()).value(), 2);
  auto parsed = parse_token(v2).value();
  EXPECT_EQ(parsed.version, 2u);
  EXPECT_EQ(parsed.identity, 0u);
  Loader old(regenerated, {.seed = 3, .resume = v2, .shuffle_window = 4});
  EXPECT_EQ(drain(old, *regenerated).size(), regenerated->samples() - 5);
}

TEST(Loader, CorruptShardNamesShardAndOffsetOrIsSkipped) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  write_tar_dataset(*s, {4, 4, 4});
  auto tar = s->get("ds/shard-0000.tar").value();  // indexed: open does not scan it
  tar[3 * 512 * 0 + 2 * 512 + 512 * 0 + 1024 + 5] ^= std::byte{0xff};
  ASSERT_TRUE(s->put("ds/shard-0000.tar", tar));
  auto ds = open_ds(s, "ds/");
  ASSERT_TRUE(ds);
  {
    Loader l(ds, {.shuffle = false});
    Result<std::optional<Sample>> r;
    while ((r = l.next()) && *r) {
    }
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Code::kCorruption);
    EXPECT_NE(r.error().message().find("shard-0000.tar at offset"), std::string::npos)
        << r.error().message();
  }
  Loader l(ds, {.shuffle = false, .skip_corrupt = true});
  auto reads = drain(l, *ds);
  EXPECT_EQ(reads.size(), ds->samples() - 1);
  EXPECT_EQ(l.stats().skipped_samples, 1u);
  // A corrupt shard without an index fails open, or is skipped and counted.
  auto tar2 = s->get("ds/shard-0001.tar").value();
  tar2[1024 + 10] ^= std::byte{0xff};  // the second header
  ASSERT_TRUE(s->put("ds/shard-0001.tar", tar2));
  auto bad = Dataset::open(s, "ds/");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("shard-0001.tar"), std::string::npos);
  auto skipped = open_ds(s, "ds/", {.skip_corrupt = true});
  ASSERT_TRUE(skipped);
  EXPECT_EQ(skipped->skipped_shards(), 1u);
  EXPECT_EQ(skipped->samples(), 8u);
}

TEST(Loader, SamplesWithMoreFieldsThanTheFirstKeepTheirOwn) {
  // A slice keeps one list of fields, reserved for as many a sample as its first has: here
  // the first sample has one and the others three, so the list grows while samples already
  // point into it. Each sample must still see its own fields, after the loader is gone too.
  std::shared_ptr<store::Store> s = store::make_memory_store();
  std::vector<std::byte> tar;
  TarWriter w([&](std::span<const std::byte> b) {
    tar.insert(tar.end(), b.begin(), b.end());
    return ok();
  });
  constexpr size_t kSamples = 300;
  for (size_t i = 0; i < kSamples; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "k%05zu", i);
    ASSERT_TRUE(w.add(std::string(key) + ".txt", as_bytes(key)));
    if (i == 0) continue;
    ASSERT_TRUE(w.add(std::string(key) + ".a", as_bytes("a" + std::to_string(i))));
    ASSERT_TRUE(w.add(std::string(key) + ".b", as_bytes("b" + std::to_string(i))));
  }
  ASSERT_TRUE(w.finish());
  ASSERT_TRUE(s->put("m/shard.tar", tar));
  auto ds = open_ds(s, "m/");
  ASSERT_TRUE(ds);
  std::vector<Sample> kept;
  {
    // One slice of all of them (the first slice holds a block), parsed from k00000 on.
    Loader l(ds, {.seed = 7, .block = 2 * kSamples});
    auto batch = l.next_batch(kSamples + 1);
    ASSERT_TRUE(batch) << batch.error().to_string();
    kept = std::move(*batch);
  }
  ASSERT_EQ(kept.size(), kSamples);
  std::set<uint64_t> seen;
  for (const Sample& x : kept) {
    seen.insert(x.index);
    auto text = [](const Field* f) {
      return f ? std::string(reinterpret_cast<const char*>(f->data.data()), f->data.size())
               : std::string("(none)");
    };
    EXPECT_EQ(text(x.field("txt")), std::string(x.key));
    const size_t i = std::stoul(std::string(x.key.substr(1)));
    if (i == 0) {
      EXPECT_EQ(x.fields.size(), 1u);
      continue;
    }
    ASSERT_EQ(x.fields.size(), 3u) << x.key;
    EXPECT_EQ(text(x.field("a")), "a" + std::to_string(i));
    EXPECT_EQ(text(x.field("b")), "b" + std::to_string(i));
  }
  EXPECT_EQ(seen.size(), kSamples);
}

TEST(Loader, ReplacedShardIsConflictNotMixedBytes) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  write_tar_dataset(*s, {4, 4});
  auto ds = open_ds(s, "ds/");
  write_tar_dataset(*s, {5, 5});  // replaced after the listing
  Loader l(ds, {.shuffle = false});
  auto r = l.next();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kConflict) << r.error().to_string();
}

TEST(Loader, SlowDownIsBackedOffNotFatal) {
  auto faults = std::make_shared<store::FaultInjectionStore>(store::make_memory_store());
  write_tar_dataset(*faults, {10, 10, 10});
  auto ds = open_ds(faults, "ds/");
  ASSERT_TRUE(ds);
  for (uint64_t n : {1, 2, 3, 5}) faults->fail_nth(store::FaultOp::kRead, n, Code::kUnavailable);
  Loader l(ds, {.seed = 1, .inflight = 4});
  auto reads = drain(l, *ds);
  EXPECT_EQ(reads.size(), 30u);
  EXPECT_GE(l.stats().throttled, 4u);
  // A store that never recovers fails with its error after the retries.
  faults->fail_always(store::FaultOp::kRead, Code::kUnavailable);
  Loader dead(ds, {.seed = 1, .inflight = 1});
  auto r = dead.next();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kUnavailable);
}

// Holds every read until opened, and counts what was asked.
class GatedStore : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options = {}) override {
    {
      std::unique_lock lock(mu);
      asked += dst.size();
      cv.wait(lock, [&] { return open; });
    }
    return StoreWrapper::read(key, offset, dst, options);
  }
  void set_open(bool o) {
    std::lock_guard lock(mu);
    open = o;
    cv.notify_all();
  }
  uint64_t asked_bytes() {
    std::lock_guard lock(mu);
    return asked;
  }

 private:
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  uint64_t asked = 0;
};

TEST(Loader, TheFirstSliceIsAboutABlockAndReadAlone) {
  auto gated = std::make_shared<GatedStore>(store::make_memory_store());
  write_tar_dataset(*gated, {200});
  auto ds = open_ds(gated, "ds/");
  ASSERT_TRUE(ds);
  const uint64_t opened = gated->asked_bytes();
  gated->set_open(false);
  // The budget holds the whole dataset many times over: before, the first slice was all
  // of it, and the first sample waited for every byte.
  Loader l(ds, {.seed = 3, .block = 4, .memory_bytes = 64 << 20});
  std::vector<Read> reads;
  std::thread reader([&] { reads = drain(l, *ds); });
  // Whatever the fetcher asks for while the first slice waits: at most what 4 samples and
  // the 64 KiB gaps between them can span, far from the shard's bytes.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t first = gated->asked_bytes() - opened;
  EXPECT_GT(first, 0u);
  EXPECT_LT(first, ds->bytes() / 3) << "of " << ds->bytes();
  gated->set_open(true);
  reader.join();
  ASSERT_EQ(reads.size(), 200u);
  std::set<uint64_t> seen;
  for (const Read& r : reads) seen.insert(r.index);
  EXPECT_EQ(seen.size(), 200u);
}

// A window larger than a slice is read in parts, each a few samples of every chunk. A cache
// without a RAM tier reads and checks the whole chunk for each part asked of it, so the
// loader reads a chunk once a slice and copies the samples out of it. Before, each sample
// was a whole-chunk read: an epoch of 256 MiB shards at the default budget ran at 0.21 GiB/s
// against 0.75 with this (docs/performance.md).
TEST(Loader, PartsOfAChunkAreOneReadFromACacheThatKeepsNoChunks) {
  testing::TempDir dir;
  std::unique_ptr<store::Store> backing = store::make_memory_store();
  // One shard of 320 samples of about 100 KiB: 9 chunks of 4 MiB, the last one short.
  constexpr size_t kSamples = 320;
  auto bin_of = [](size_t i) { return testing::random_bytes((100 << 10) + 37 * i, i); };
  {
    std::vector<std::byte> tar;
    TarWriter w([&](std::span<const std::byte> b) {
      tar.insert(tar.end(), b.begin(), b.end());
      return ok();
    });
    ShardIndex index;
    for (size_t i = 0; i < kSamples; ++i) {
      std::string key = sample_key(0, i);
      uint64_t start = w.bytes();
      ASSERT_TRUE(w.add(key + ".txt", as_bytes(key)));
      ASSERT_TRUE(w.add(key + ".bin", bin_of(i)));
      index.samples.push_back({key, start, w.bytes() - start});
    }
    ASSERT_TRUE(w.finish());
    index.shard_size = tar.size();
    ASSERT_TRUE(backing->put("ds/shard-0000.tar", tar));
    ASSERT_TRUE(backing->put("ds/shard-0000.tar.idx", encode_index(index)));
  }
  cache::CacheOptions co;
  co.directory = dir.path();
  co.ram_bytes = 0;
  co.chunk_size = 4 << 20;
  co.disk_bytes = 256 << 20;
  auto opened = cache::TieredCache::open(std::move(backing), co);
  ASSERT_TRUE(opened) << opened.error().to_string();
  cache::TieredCache* cache = opened->get();
  ASSERT_FALSE(cache->keeps_chunks());
  std::shared_ptr<store::Store> cached(std::move(*opened));
  auto ds = open_ds(cached, "ds/");
  ASSERT_TRUE(ds);
  const uint64_t chunks = (ds->shards()[0].size + co.chunk_size - 1) / co.chunk_size;
  // 32 MiB: slices of 8 MiB, and the window is the whole 33 MiB shard, in 5 parts.
  const LoaderOptions lo{.seed = 5, .memory_bytes = 32 << 20};
  auto read_epoch = [&] {
    Loader l(ds, lo);
    size_t n = 0;
    while (true) {
      auto s = l.next();
      ASSERT_TRUE(s) << s.error().to_string();
      if (!*s) break;
      const Field* bin = (*s)->field("bin");
      ASSERT_NE(bin, nullptr);
      auto want = bin_of((*s)->index);
      ASSERT_TRUE(std::ranges::equal(bin->data, want)) << (*s)->key;
      ++n;
    }
    EXPECT_EQ(n, kSamples);
  };
  read_epoch();  // cold: fills the NVMe tier
  for (int i = 0; i < 500 && cache->stats().disk.chunks < chunks; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(cache->stats().disk.chunks, chunks);  // and the index's
  const uint64_t before = cache->stats().disk.hits;
  read_epoch();
  const uint64_t reads = cache->stats().disk.hits - before;
  // At most each chunk once a part (5 parts; 6 for slack); a read per sample was ~300.
  EXPECT_GE(reads, chunks);
  EXPECT_LE(reads, 6 * chunks) << "whole-chunk reads from the NVMe tier for " << kSamples
                               << " samples in " << chunks << " chunks";
}

TEST(Loader, StatsAndBatches) {
  auto ds = tar_dataset({50, 50});
  Loader l(ds, {.seed = 1, .epochs = 2});
  size_t total = 0;
  while (true) {
    auto b = l.next_batch(16);
    ASSERT_TRUE(b);
    if (b->empty()) break;
    total += b->size();
  }
  EXPECT_EQ(total, 200u);
  auto st = l.stats();
  EXPECT_EQ(st.samples, 200u);
  EXPECT_GT(st.bytes, 0u);
  EXPECT_GT(st.requests, 0u);
  EXPECT_GT(st.first_batch_seconds, 0.0);
  // The token after the last epoch says so: resuming from it reads nothing.
  Loader done(ds, {.seed = 1, .epochs = 2, .resume = l.state()});
  auto r = done.next();
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
}

TEST(Loader, BatchCopiesIntoDeviceMemory) {
  auto ds = tar_dataset({20});
  Loader l(ds, {.seed = 1});
  auto batch = l.next_batch(8);
  ASSERT_TRUE(batch);
  auto device = mem::make_emulated_device(64 << 20);
  auto copied = copy_batch(*batch, *device);
  ASSERT_TRUE(copied) << copied.error().to_string();
  size_t i = 0;
  for (const auto& s : *batch)
    for (const auto& f : s.fields) {
      std::vector<std::byte> back(f.data.size());
      auto* src = static_cast<std::byte*>(copied->memory.get()) + copied->offsets[i++];
      auto t = device->copy_to_host(back.data(), src, back.size());
      ASSERT_TRUE(t);
      ASSERT_TRUE(device->wait(*t));
      EXPECT_TRUE(std::equal(back.begin(), back.end(), f.data.begin()));
    }
}

}  // namespace
}  // namespace sluice::stream

namespace sluice::stream {
namespace {

TEST(ShardPacker, ShardsStayWithinTargetAndEveryOneIsIndexed) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  ShardPacker packer(*s, "p/", {.shard_bytes = 16 << 10, .name = "part"});
  for (int i = 0; i < 100; ++i) {
    std::string key = "k" + std::to_string(1000 + i);
    auto data = testing::random_bytes(i == 50 ? 40000 : 700, i);  // one sample over the target
    std::string bin = key + ".bin", txt = key + ".txt";
    PackFile files[] = {{bin, data}, {txt, as_bytes(key)}};
    ASSERT_TRUE(packer.add(key, files));
  }
  ASSERT_TRUE(packer.finish());
  auto ds = open_ds(s, "p/");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->samples(), 100u);
  EXPECT_EQ(ds->shards().size(), packer.shards());
  for (const auto& sh : ds->shards()) {
    EXPECT_TRUE(sh.indexed) << sh.key;
    EXPECT_TRUE(sh.size <= (16u << 10) || sh.samples == 1) << sh.key << " " << sh.size;
  }
  EXPECT_EQ(ds->shards().front().key, "p/part-000000.tar");
  // A name that is not a field of the key is refused.
  ShardPacker bad(*s, "q/");
  PackFile wrong[] = {{"other.bin", as_bytes(std::string("x"))}};
  EXPECT_FALSE(bad.add("key", wrong));
}

TEST(ShardPacker, FailedWriteLeavesOnlyWholeIndexedShards) {
  auto faults = std::make_shared<store::FaultInjectionStore>(store::make_memory_store());
  {
    ShardPacker packer(*faults, "p/", {.shard_bytes = 8 << 10});
    faults->set_space_limit(30 << 10);
    Status st = ok();
    for (int i = 0; i < 100 && st; ++i) {
      std::string key = "k" + std::to_string(i), name = key + ".bin";
      auto data = testing::random_bytes(1000, i);
      PackFile files[] = {{name, data}};
      st = packer.add(key, files);
    }
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code(), Code::kNoSpace);
  }
  faults->clear();
  auto keys = faults->list_all("p/").value();
  std::erase_if(keys, [](const store::ObjectInfo& o) { return o.key == "p/.sluice-dataset"; });
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(keys.size() % 2, 0u);  // every shard with its index
  for (const auto& k : keys) EXPECT_TRUE(k.key.ends_with(".tar") || k.key.ends_with(".idx"));
  // Defect 8 of the hostile test: what a failed (or killed) pack published is whole, but it is
  // not a dataset: readers refuse it, naming why.
  auto ds = Dataset::open(faults, "p/", {});
  ASSERT_FALSE(ds);
  EXPECT_EQ(ds.error().code(), Code::kCorruption);
  EXPECT_NE(ds.error().message().find("not complete"), std::string::npos) << ds.error().message();
}

TEST(ShardPacker, ADatasetIsWholeOnlyAsItsRecordSays) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  {
    ShardPacker packer(*s, "p/", {.shard_bytes = 8 << 10});
    for (int i = 0; i < 40; ++i) {
      std::string key = "k" + std::to_string(i), name = key + ".bin";
      auto data = testing::random_bytes(1000, i);
      PackFile files[] = {{name, data}};
      ASSERT_TRUE(packer.add(key, files));
    }
    ASSERT_TRUE(packer.finish());
  }
  ASSERT_EQ(open_ds(s, "p/")->samples(), 40u);
  // A second pack into the prefix is refused when it would publish its first shard.
  ShardPacker again(*s, "p/", {});
  auto data = testing::random_bytes(10, 1);
  PackFile files[] = {{"x.bin", data}};
  ASSERT_TRUE(again.add("x", files));
  EXPECT_EQ(again.finish().error().code(), Code::kAlreadyExists);
  // A shard lost since: refused.
  const auto objs = s->list_all("p/").value();
  ASSERT_TRUE(s->remove(objs.front().key.ends_with(".tar") ? objs.front().key : objs[1].key));
  auto ds = Dataset::open(s, "p/", {});
  ASSERT_FALSE(ds);
  EXPECT_NE(ds.error().message().find("completion record says"), std::string::npos)
      << ds.error().message();
  // Damaged records.
  for (const std::string& bad :
       std::vector<std::string>{"", "sluice-dataset 1 complete 1 2 3 0000000000000000\n", "x\n",
                                encode_completion({true, 1, 2, 3}).substr(1)}) {
    EXPECT_EQ(decode_completion(bad, "r").error().code(), Code::kCorruption) << bad;
  }
  auto round = decode_completion(encode_completion({true, 7, 8, 9}), "r").value();
  EXPECT_TRUE(round.complete);
  EXPECT_EQ(round.samples, 8u);
}

}  // namespace
}  // namespace sluice::stream

namespace sluice::stream {
namespace {

TEST(Catalog, SecondOpenReadsTheNodeCatalogNotTheStore) {
  testing::TempDir dir;
  auto faults = std::make_shared<store::FaultInjectionStore>(store::make_memory_store());
  write_tar_dataset(*faults, {5, 7, 3});
  DatasetOptions o{.catalog_dir = dir.file("catalogs")};
  auto first = open_ds(faults, "ds/", o);
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->from_catalog());
  uint64_t lists = faults->calls(store::FaultOp::kList),
           reads = faults->calls(store::FaultOp::kRead);
  auto second = open_ds(faults, "ds/", o);
  ASSERT_TRUE(second);
  EXPECT_TRUE(second->from_catalog());
  EXPECT_EQ(faults->calls(store::FaultOp::kList), lists);
  EXPECT_EQ(faults->calls(store::FaultOp::kRead), reads);
  EXPECT_EQ(second->fingerprint(), first->fingerprint());
  EXPECT_EQ(second->samples(), first->samples());
  for (uint64_t i = 0; i < first->samples(); ++i) {
    EXPECT_EQ(second->sample_key(i), first->sample_key(i));
    EXPECT_EQ(second->sample(i).offset, first->sample(i).offset);
  }
  EXPECT_EQ(second->shards()[1].indexed, first->shards()[1].indexed);
  // Another prefix or option is another catalog.
  auto skip = open_ds(faults, "ds/", {.skip_corrupt = true, .catalog_dir = o.catalog_dir});
  ASSERT_TRUE(skip);
  EXPECT_FALSE(skip->from_catalog());
  // A damaged catalog is rebuilt; so is a stale one.
  for (const auto& e : std::filesystem::directory_iterator(o.catalog_dir)) {
    if (e.path().extension() != ".catalog") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto rebuilt = open_ds(faults, "ds/", o);
  ASSERT_TRUE(rebuilt);
  EXPECT_FALSE(rebuilt->from_catalog());
  EXPECT_EQ(rebuilt->fingerprint(), first->fingerprint());
  o.catalog_ttl = std::chrono::seconds(0);
  auto stale = open_ds(faults, "ds/", o);
  ASSERT_TRUE(stale);
  EXPECT_FALSE(stale->from_catalog());
  // Loaders over a catalog-opened dataset read the same order.
  Loader a(first, {.seed = 4}), b(second, {.seed = 4});
  EXPECT_EQ(drain(a, *first), drain(b, *second));
}

}  // namespace
}  // namespace sluice::stream

namespace sluice::stream {
namespace {

// Consumers in lockstep share one token even when the epoch does not divide evenly and
// the smaller shares are used up; resuming from it reads the rest once.
TEST(Loader, UnevenSharesStillGiveOneToken) {
  auto ds = tar_dataset({10, 10, 10, 10, 10});  // 50 samples, 3 consumers: 17, 17, 16
  std::multiset<uint64_t> seen;
  std::set<std::string> tokens;
  for (unsigned r = 0; r < 3; ++r) {
    Loader l(ds, {.seed = 4, .rank = r, .world = 3, .shuffle_window = 10});
    for (auto& x : drain(l, *ds, 16)) seen.insert(x.index);
    tokens.insert(l.state());
  }
  ASSERT_EQ(tokens.size(), 1u) << *tokens.begin();
  for (unsigned r = 0; r < 3; ++r) {
    Loader l(ds,
             {.seed = 4, .rank = r, .world = 3, .resume = *tokens.begin(), .shuffle_window = 10});
    for (auto& x : drain(l, *ds)) seen.insert(x.index);
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), 50u);
  // An epoch range that overflows is refused.
  Loader bad(ds, {.epoch = UINT64_MAX, .epochs = 2});
  EXPECT_FALSE(bad.next());
}

TEST(Dataset, StrayIndexAndBadIndexes) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  write_tar_dataset(*s, {4, 4, 4});
  // An index whose shard is gone does not make the dataset "plain objects".
  auto idx = s->get("ds/shard-0000.tar.idx").value();
  ASSERT_TRUE(s->put("ds/shard-0099.tar.idx", idx));
  auto ds = open_ds(s, "ds/");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->format(), Format::kTar);
  EXPECT_EQ(ds->samples(), 12u);
  // A damaged index fails open; with skip_corrupt the shard is scanned instead.
  ASSERT_TRUE(s->put("ds/shard-0000.tar.idx", as_bytes(std::string("garbage"))));
  auto bad = Dataset::open(s, "ds/");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("shard-0000.tar.idx"), std::string::npos);
  auto scanned = open_ds(s, "ds/", {.skip_corrupt = true});
  ASSERT_TRUE(scanned);
  EXPECT_EQ(scanned->samples(), 12u);
  EXPECT_FALSE(scanned->shards()[0].indexed);
}

TEST(Dataset, ObjectsOfOneKeyAreOneSampleWhereverTheyList) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  // "o/a-b.txt" sorts between "o/a" and "o/a.bin"; "__meta.json" is metadata.
  for (const char* k : {"o/a", "o/a.bin", "o/a.json", "o/a-b.txt", "o/__meta.json"})
    ASSERT_TRUE(s->put(k, as_bytes(std::string(k))));
  auto ds = open_ds(s, "o/");
  ASSERT_TRUE(ds);
  ASSERT_EQ(ds->samples(), 2u);
  EXPECT_EQ(ds->sample_key(0), "a");
  EXPECT_EQ(ds->sample(0).objects, 3u);
  EXPECT_EQ(ds->sample_key(1), "a-b");
  Loader l(ds, {.shuffle = false});
  auto first = l.next();
  ASSERT_TRUE(first && *first);
  ASSERT_EQ((*first)->fields.size(), 3u);
  EXPECT_EQ((*first)->fields[0].name, "data");
  EXPECT_EQ((*first)->fields[1].name, "bin");
}

}  // namespace
}  // namespace sluice::stream

namespace sluice::stream {
namespace {

// A store whose listings lie: sizes multiplied, or a key outside the prefix added.
class LyingListing : public store::StoreWrapper {
 public:
  LyingListing(std::unique_ptr<store::Store> target, bool huge, bool outside)
      : StoreWrapper(std::move(target)), huge_(huge), outside_(outside) {}
  Result<store::ListPage> list(const store::ListOptions& o) override {
    SLUICE_ASSIGN_OR_RETURN(auto page, StoreWrapper::list(o));
    for (auto& obj : page.objects)
      if (huge_) obj.size = uint64_t{1} << 50;
    if (outside_) page.objects.push_back({"elsewhere/x.bin", 1, 0, "e"});
    return page;
  }

 private:
  bool huge_, outside_;
};

TEST(Dataset, ListingsThatLieAreErrorsNotAborts) {
  auto make = [](bool huge, bool outside) {
    auto mem = store::make_memory_store();
    for (int i = 0; i < 5; ++i)
      EXPECT_TRUE(mem->put("o/" + std::to_string(i) + ".bin", testing::random_bytes(100, i)));
    return std::make_shared<LyingListing>(std::move(mem), huge, outside);
  };
  auto outside = Dataset::open(make(false, true), "o/");
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code(), Code::kCorruption);
  EXPECT_NE(outside.error().message().find("elsewhere/x.bin"), std::string::npos);
  // Objects listed at 1 PiB each: the loader fails cleanly instead of aborting.
  auto ds = open_ds(make(true, false), "o/");
  ASSERT_TRUE(ds);
  Loader l(ds, {.memory_bytes = 4 << 20});
  auto r = l.next();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kNoSpace) << r.error().to_string();
}

TEST(Loader, ASampleLargerThanTheBudgetIsAnErrorNamingIt) {
  std::shared_ptr<store::Store> s = store::make_memory_store();
  ASSERT_TRUE(s->put("o/small.bin", testing::random_bytes(100, 1)));
  ASSERT_TRUE(s->put("o/big.bin", testing::random_bytes(3 << 20, 2)));
  auto ds = open_ds(s, "o/");
  ASSERT_TRUE(ds);
  Loader l(ds, {.shuffle = false, .memory_bytes = 2 << 20});
  Result<std::optional<Sample>> r;
  while ((r = l.next()) && *r) {
  }
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kNoSpace);
  EXPECT_NE(r.error().message().find("'big'"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("memory budget"), std::string::npos) << r.error().message();
}

// `sluice dataset pack` as a library call: a directory of NAME.EXT files becomes a whole,
// indexed dataset; what is not a sample file is counted, not packed; a used prefix, an
// empty directory and cancellation are refused with their own codes.
TEST(PackDirectory, ADirectoryOfSampleFilesBecomesAWholeDataset) {
  sluice::testing::TempDir dir;
  for (int i = 0; i < 30; ++i) {
    std::string key = dir.file("k" + std::to_string(100 + i));
    std::ofstream(key + ".bin") << std::string(1000 + i, 'b');
    std::ofstream(key + ".cls") << i;
  }
  std::ofstream(dir.file("__notes")) << "not a sample";
  std::shared_ptr<store::Store> s = store::make_memory_store();
  uint64_t last_done = 0;
  PackDirectoryOptions o;
  o.pack = {.shard_bytes = 8 << 10, .name = "part"};
  o.on_progress = [&](uint64_t done, uint64_t samples, uint64_t) {
    EXPECT_EQ(done, last_done + 1);
    EXPECT_EQ(samples, 30u);
    last_done = done;
  };
  auto files = find_sample_files(dir.path());
  ASSERT_TRUE(files) << files.error().to_string();
  EXPECT_EQ(files->samples.size(), 30u);
  auto r = pack_directory(*files, *s, "ds/", o);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->samples, 30u);
  EXPECT_EQ(r->files, 60u);
  EXPECT_EQ(r->skipped_files, 1u);
  EXPECT_GT(r->shards, 1u);
  auto ds = open_ds(s, "ds/");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->samples(), 30u);
  EXPECT_EQ(ds->shards().size(), r->shards);

  EXPECT_EQ(pack_directory(*files, *s, "ds/", o).error().code(), Code::kAlreadyExists);
  sluice::testing::TempDir empty;
  EXPECT_EQ(find_sample_files(empty.path()).error().code(), Code::kNotFound);
  EXPECT_EQ(find_sample_files(dir.file("missing")).error().code(), Code::kNotFound);
  std::atomic<bool> cancel{true};
  PackDirectoryOptions stop;
  stop.cancel = &cancel;
  EXPECT_EQ(pack_directory(*files, *s, "stopped/", stop).error().code(), Code::kCancelled);
}

}  // namespace
}  // namespace sluice::stream
