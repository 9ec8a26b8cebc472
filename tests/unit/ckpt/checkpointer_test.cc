// Checkpoints: save and restore across tiers, commit protocol, crash consistency, bit
// flips, full tiers, several ranks, device memory, retention.
#include "sluice/ckpt/checkpointer.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "sluice/ckpt/live.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/target.h"
#include "sluice/store/wrapper.h"
#include "sluice/testing/fault_store.h"
#include "test_util.h"

namespace sluice::ckpt {
namespace {

using sluice::testing::TempDir;

// A model state: a few tensors of odd sizes (unaligned ends, a chunk boundary inside).
struct State {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorView> views;

  explicit State(uint64_t seed, std::vector<uint64_t> sizes = {1000, 70000, 5 << 20, 4, 0}) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < sizes.size(); ++i) {
      data.emplace_back(sizes[i]);
      for (auto& b : data.back()) b = static_cast<std::byte>(rng());
    }
    for (size_t i = 0; i < sizes.size(); ++i)
      views.push_back({"t" + std::to_string(i),
                       "uint8",
                       {static_cast<int64_t>(sizes[i])},
                       data[i].data(),
                       sizes[i],
                       nullptr});
  }

  // Restores step into fresh buffers and compares.
  void expect_restored(Checkpointer& cp, uint64_t step, RestoreReport* out = nullptr) const {
    std::vector<std::vector<std::byte>> got;
    std::vector<TensorDest> dests;
    for (const auto& d : data) got.emplace_back(d.size());
    for (size_t i = 0; i < data.size(); ++i)
      dests.push_back({views[i].name, -1, got[i].data(), got[i].size(), nullptr});
    auto r = cp.restore(step, dests);
    ASSERT_TRUE(r) << r.error().message();
    for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(got[i], data[i]) << views[i].name;
    if (out) *out = *r;
  }
};

Tier mem_tier(const std::string& name, std::shared_ptr<store::Store> s = nullptr) {
  Tier t;
  t.name = name;
  t.store = s ? std::move(s) : std::shared_ptr<store::Store>(store::make_memory_store(name));
  return t;
}

CheckpointerOptions small_options(std::vector<Tier> tiers) {
  CheckpointerOptions o;
  o.series = "model";
  o.tiers = std::move(tiers);
  o.staging_bytes = 4 << 20;  // smaller than State: saves stream through the ring
  o.segment_bytes = 1 << 20;
  o.chunk_size = 1 << 20;
  return o;
}

TEST(Manifest, RoundTripsAndRejectsDamage) {
  ShardRecord r;
  r.series = "s";
  r.step = 7;
  r.chunk_size = 4096;
  r.save_id = "0123456789abcdef0123456789abcdef";
  r.tensors = {{"a", "float32", {2, 3}, 0, 24, {1}}, {"b", "uint8", {}, 0, 5000, {2, 3}}};
  r.bytes = layout(r.tensors);
  EXPECT_EQ(r.tensors[1].offset, 4096u);
  Manifest m{"s", 7, 1, 123, {r}};
  std::string text = encode_manifest(m);
  auto back = decode_manifest(text, "m");
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->shards[0].tensors[1].chunks, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(encode_manifest(*back), text);

  std::string flipped = text;
  flipped[flipped.find("5000")] = '6';
  auto bad = decode_manifest(flipped, "m");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Code::kCorruption);
  EXPECT_NE(bad.error().message().find("checksum"), std::string::npos);
  EXPECT_FALSE(decode_manifest("{", "m"));
  EXPECT_FALSE(decode_manifest(encode_record(r), "m"));  // a record is not a manifest
  EXPECT_TRUE(decode_record(encode_record(r), "r"));

  // Checksummed but inconsistent: overlapping tensors, a wrong chunk count.
  ShardRecord overlap = r;
  overlap.tensors[1].offset = 0;
  EXPECT_FALSE(decode_record(encode_record(overlap), "r"));
  ShardRecord chunks = r;
  chunks.tensors[1].chunks.push_back(9);
  EXPECT_FALSE(decode_record(encode_record(chunks), "r"));
  ShardRecord dtype = r;
  dtype.tensors[0].bytes = 23;
  EXPECT_FALSE(decode_record(encode_record(dtype), "r"));

  EXPECT_FALSE(validate_series(""));
  EXPECT_FALSE(validate_series("../x"));
  EXPECT_FALSE(validate_series(".hidden"));
  EXPECT_TRUE(validate_series("llama-8b_v1.2"));
  uint64_t step = 0;
  std::string leaf;
  ASSERT_TRUE(parse_step_key("s", shard_key("s", 42, 3, "ab"), step, leaf));
  EXPECT_EQ(step, 42u);
  EXPECT_EQ(leaf, "rank-00003-ab.shard");
  EXPECT_FALSE(parse_step_key("s", "s/step-12/x", step, leaf));
  // A document nested thousands deep is refused before it is parsed.
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  auto d = decode_manifest(deep, "deep");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message().find("nested"), std::string::npos);
}

// Found by fuzzing (fuzz/ckpt_*_fuzz): a field of the wrong type, a float or an integer out
// of range where an integer goes, is Corruption naming it, never a crash or a wrapped value.
TEST(Manifest, MistypedAndOutOfRangeFieldsAreCorruption) {
  EXPECT_EQ(decode_manifest("{\"format\":1}", "m").error().code(), Code::kCorruption);
  EXPECT_EQ(decode_record("{\"format\":[]}", "r").error().code(), Code::kCorruption);
  ShardRecord r;
  r.series = "s";
  r.step = 7;
  r.chunk_size = 4096;
  r.save_id = "0123456789abcdef0123456789abcdef";
  r.tensors = {{"a", "uint8", {5}, 0, 5, {1}}};
  r.bytes = layout(r.tensors);
  auto reseal = [](nlohmann::json doc) {
    doc.erase("checksum");
    const std::string body = doc.dump();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(xxh3_64(body.data(), body.size())));
    doc["checksum"] = hex;
    return doc.dump();
  };
  const auto good = nlohmann::json::parse(encode_record(r));
  ASSERT_TRUE(decode_record(reseal(good), "r"));
  for (auto [field, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"created_ns", 1.7e22},
                                                           {"step", 7.7e85},
                                                           {"rank", uint64_t{1} << 32},
                                                           {"world", -1},
                                                           {"chunk_size", "4096"},
                                                           {"bytes", 1.5}}) {
    auto doc = good;
    doc[field] = value;
    auto got = decode_record(reseal(doc), "r");
    ASSERT_FALSE(got) << field;
    EXPECT_EQ(got.error().code(), Code::kCorruption) << field;
    EXPECT_NE(got.error().message().find(field), std::string::npos) << got.error().message();
  }
  auto doc = good;
  doc["tensors"][0]["shape"] = nlohmann::json::array({1e300});
  EXPECT_EQ(decode_record(reseal(doc), "r").error().code(), Code::kCorruption);
}

TEST(Checkpointer, SavesStreamingAndRestoresBitExact) {
  auto cp = Checkpointer::open(small_options({mem_tier("a")})).value();
  State s1(1), s2(2);
  auto h = cp->save(1, s1.views).value();
  ASSERT_TRUE(h->wait()) << h->wait().error().message();
  auto h2 = cp->save(2, s2.views).value();
  ASSERT_TRUE(h2->wait());
  auto p = h2->progress();
  EXPECT_TRUE(p.finished);
  EXPECT_EQ(p.bytes_staged, p.bytes_total);
  EXPECT_EQ(p.tiers[0].state, TierState::kCommitted);
  EXPECT_EQ(cp->latest().value(), 2u);
  s1.expect_restored(*cp, 1);
  s2.expect_restored(*cp, 2);
  auto steps = cp->list().value();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].bytes, 1000u + 70000 + (5 << 20) + 4);

  // The same step again is refused before anything is written.
  auto again = cp->save(2, s1.views);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), Code::kAlreadyExists);
  s2.expect_restored(*cp, 2);
}

TEST(Checkpointer, SavesAnEmptyState) {
  auto cp = Checkpointer::open(small_options({mem_tier("empty")})).value();
  State none(5, {0, 0});
  ASSERT_TRUE(cp->save(1, none.views).value()->wait());
  ASSERT_TRUE(cp->save(2, {}).value()->wait());
  EXPECT_EQ(cp->latest().value(), 2u);
  none.expect_restored(*cp, 1);
}

TEST(Checkpointer, RejectsBadInput) {
  auto cp = Checkpointer::open(small_options({mem_tier("bad")})).value();
  std::vector<std::byte> b(8);
  TensorView v{"x", "float32", {2}, b.data(), 8, nullptr};
  std::vector<TensorView> dup{v, v};
  EXPECT_EQ(cp->save(1, dup).error().code(), Code::kInvalidArgument);
  TensorView odd{"y", "float32", {}, b.data(), 7, nullptr};
  EXPECT_EQ(cp->save(1, std::span(&odd, 1)).error().code(), Code::kInvalidArgument);
  TensorView bad_utf8{"\xff\xfe", "uint8", {}, b.data(), 8, nullptr};
  EXPECT_EQ(cp->save(1, std::span(&bad_utf8, 1)).error().code(), Code::kInvalidArgument);
  EXPECT_EQ(cp->save(kMaxStep + 1, std::span(&v, 1)).error().code(), Code::kInvalidArgument);
  TensorView null{"z", "uint8", {}, nullptr, 7, nullptr};
  EXPECT_EQ(cp->save(1, std::span(&null, 1)).error().code(), Code::kInvalidArgument);
  ASSERT_TRUE(cp->save(1, std::span(&v, 1)).value()->wait());

  std::vector<std::byte> out(8);
  TensorDest missing{"nope", -1, out.data(), 8, nullptr};
  EXPECT_EQ(cp->restore(1, std::span(&missing, 1)).error().code(), Code::kNotFound);
  TensorDest wrong{"x", -1, out.data(), 4, nullptr};
  EXPECT_EQ(cp->restore(1, std::span(&wrong, 1)).error().code(), Code::kInvalidArgument);
  EXPECT_EQ(cp->restore(9, std::span(&wrong, 1)).error().code(), Code::kNotFound);
  EXPECT_EQ(cp->latest().value(), 1u);

  CheckpointerOptions o = small_options({});
  EXPECT_FALSE(Checkpointer::open(o));
  o = small_options({mem_tier("bad2")});
  o.series = "../etc";
  EXPECT_FALSE(Checkpointer::open(o));
  auto twice = mem_tier("bad4");
  o = small_options({twice, twice});
  EXPECT_EQ(Checkpointer::open(o).error().code(), Code::kInvalidArgument);
  o = small_options({mem_tier("bad3")});
  o.rank = 2;
  o.world = 2;
  EXPECT_FALSE(Checkpointer::open(o));
}

TEST(Checkpointer, LocalTierThenCopyAndBitFlipFallsBack) {
  TempDir dir;
  auto local = open_tier(dir.path() + "/nvme").value();
  auto o = small_options({local, mem_tier("remote")});
  o.staging_bytes = 64 << 20;  // fits: the ring keeps the whole state
  auto cp = Checkpointer::open(o).value();
  State s(3);
  auto h = cp->save(5, s.views).value();
  ASSERT_TRUE(h->wait()) << h->wait().error().message();
  auto p = h->progress();
  EXPECT_EQ(p.tiers[0].state, TierState::kCommitted);
  EXPECT_EQ(p.tiers[1].state, TierState::kCommitted);
  auto steps = cp->list().value();
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].tiers.size(), 2u);
  RestoreReport clean;
  s.expect_restored(*cp, 5, &clean);
  EXPECT_EQ(clean.bytes_by_tier[1], 0u);  // all from the local tier
  EXPECT_EQ(clean.chunks_failed_over, 0u);

  // Flip one bit in the middle of the big tensor's shard bytes on the local tier.
  auto m = cp->manifest(5).value();
  const TensorEntry& big = m.shards[0].tensors[2];
  const std::string key = shard_key("model", 5, 0, m.shards[0].save_id);
  std::string path = local.local_dir + "/" + key;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(big.offset + 3 * (1 << 20) + 17));
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(big.offset + 3 * (1 << 20) + 17));
    f.write(&c, 1);
  }
  auto v = cp->verify(5, 0).value();
  EXPECT_EQ(v.bad_chunks, 1u);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_NE(v.problems[0].find("tensor 't2'"), std::string::npos) << v.problems[0];
  EXPECT_EQ(cp->verify(5, 1).value().bad_chunks, 0u);
  RestoreReport r;
  s.expect_restored(*cp, 5, &r);
  EXPECT_EQ(r.chunks_failed_over, 1u);
  EXPECT_EQ(r.bytes_by_tier[1], 1u << 20);

  // Both copies damaged: a clear error, never bytes.
  auto remote = cp->options().tiers[1].store;
  auto bytes = remote->get(key).value();
  bytes[big.offset + 3 * (1 << 20) + 100] ^= std::byte{1};
  ASSERT_TRUE(remote->put(key, bytes));
  std::vector<std::byte> out(big.bytes);
  TensorDest d{"t2", -1, out.data(), out.size(), nullptr};
  auto bad = cp->restore(5, std::span(&d, 1));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Code::kCorruption);
  EXPECT_NE(bad.error().message().find("intact on no tier"), std::string::npos);
}

TEST(Checkpointer, FailedFirstTierFallsToTheNextFromStaging) {
  auto faulty = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("f1"));
  auto o = small_options({mem_tier("first", faulty), mem_tier("second")});
  o.staging_bytes = 64 << 20;
  auto cp = Checkpointer::open(o).value();
  State s(4);
  faulty->set_space_limit(1 << 20);
  auto h = cp->save(1, s.views).value();
  auto st = h->wait();
  ASSERT_FALSE(st);  // the first tier is required
  EXPECT_EQ(st.error().code(), Code::kNoSpace);
  auto p = h->progress();
  EXPECT_EQ(p.tiers[0].state, TierState::kFailed);
  EXPECT_EQ(p.tiers[1].state, TierState::kCommitted);
  s.expect_restored(*cp, 1);
  // Nothing of the failed attempt is listed on the full tier.
  EXPECT_TRUE(faulty->list_all("model/").value().empty());
}

TEST(Checkpointer, SyncCopiesWhatALaterTierMissed) {
  auto flaky = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("later"));
  auto later = mem_tier("later", flaky);
  later.required = false;
  auto o = small_options({mem_tier("near"), later});
  auto cp = Checkpointer::open(o).value();
  State s(60);
  flaky->fail_always(store::FaultOp::kCreate, Code::kUnavailable);
  auto h = cp->save(4, s.views).value();
  ASSERT_TRUE(h->wait());  // the later tier is not required
  EXPECT_EQ(h->progress().tiers[1].state, TierState::kFailed);
  flaky->clear();
  // Corrupt near copy: sync refuses to spread it.
  auto near = o.tiers[0].store;
  const std::string key = shard_key("model", 4, 0, cp->manifest(4).value().shards[0].save_id);
  auto bytes = near->get(key).value();
  bytes[10] ^= std::byte{1};
  ASSERT_TRUE(near->put(key, bytes));
  auto bad = cp->sync().value();
  EXPECT_TRUE(bad.copied.empty());
  ASSERT_FALSE(bad.problems.empty());
  bytes[10] ^= std::byte{1};
  ASSERT_TRUE(near->put(key, bytes));
  // Told to fill only the near tier (which has it), sync copies nothing to the later one.
  SyncOptions near_only;
  near_only.fill = {0};
  EXPECT_TRUE(cp->sync(near_only).value().copied.empty());
  SyncOptions no_such;
  no_such.fill = {7};
  EXPECT_EQ(cp->sync(no_such).error().code(), Code::kInvalidArgument);
  // Cancelled while copying: nothing committed on the later tier, the report says so.
  std::atomic<bool> stop{false};
  SyncOptions cut;
  cut.cancel = &stop;
  cut.on_progress = [&](const SyncProgress& p) {
    if (p.phase == SyncPhase::kCopying) stop = true;
  };
  auto cancelled = cp->sync(cut).value();
  EXPECT_TRUE(cancelled.cancelled);
  EXPECT_TRUE(cancelled.copied.empty());
  EXPECT_TRUE(cancelled.problems.empty());  // a cancel is not a failed copy
  EXPECT_FALSE(flaky->stat(manifest_key("model", 4)));
  SyncOptions watched;
  std::vector<std::string> phases;
  uint64_t last_done = 0, last_total = 0;
  watched.on_progress = [&](const SyncProgress& p) {
    EXPECT_EQ(p.step, 4u);
    const std::string what = std::string(to_string(p.phase)) + " " + p.tier;
    if (phases.empty() || phases.back() != what) phases.push_back(what);
    EXPECT_LE(p.done, p.total);
    last_done = p.done;
    last_total = p.total;
  };
  auto r = cp->sync(watched).value();
  ASSERT_EQ(r.copied.size(), 1u);
  EXPECT_EQ(r.copied[0].tier, "later");
  EXPECT_TRUE(r.problems.empty());
  EXPECT_FALSE(r.cancelled);
  EXPECT_EQ(r.steps, 1u);
  // Checked on the near tier, then copied to the later one, to the last byte.
  EXPECT_EQ(phases, (std::vector<std::string>{"verifying near", "copying later"}));
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, r.copied[0].bytes);
  SyncOptions one;
  one.step = 4;
  EXPECT_TRUE(cp->sync(one).value().copied.empty());  // nothing left to do
  // The later tier alone restores it.
  auto only = small_options({later});
  auto cp2 = Checkpointer::open(only).value();
  s.expect_restored(*cp2, 4);
  EXPECT_EQ(cp2->verify(4).value().bad_chunks, 0u);
}

TEST(Checkpointer, ARecordOfAnEarlierRunIsNeverCommitted) {
  auto shared = std::shared_ptr<store::Store>(store::make_memory_store("runs"));
  auto options = [&](unsigned rank, std::string run) {
    auto o = small_options({mem_tier("runs", shared)});
    o.rank = rank;
    o.world = 2;
    o.run_id = std::move(run);
    o.commit_timeout = std::chrono::seconds(5);
    return o;
  };
  State old1(70, {9000}), new0(71, {9000}), new1(72, {9000});
  {
    // Run "a" crashed after rank 1 published its shard and record of step 3.
    auto r1 = Checkpointer::open(options(1, "a")).value();
    auto o = options(1, "a");
    o.commit_timeout = std::chrono::milliseconds(50);
    auto quick = Checkpointer::open(o).value();
    EXPECT_FALSE(quick->save(3, old1.views).value()->wait());  // nobody commits run a
  }
  // Run "b": rank 0 must wait for rank 1 of run b, not take run a's record.
  auto r0 = Checkpointer::open(options(0, "b")).value();
  auto h0 = r0->save(3, new0.views).value();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(h0->progress().finished);
  auto r1 = Checkpointer::open(options(1, "b")).value();
  ASSERT_TRUE(r1->save(3, new1.views).value()->wait());
  ASSERT_TRUE(h0->wait());
  new1.expect_restored(*r1, 3);
  new0.expect_restored(*r0, 3);
  // Several ranks without a run id are refused.
  EXPECT_FALSE(Checkpointer::open(options(0, "")));
}

TEST(Checkpointer, AFailingFirstTierStopsAStreamingSave) {
  auto faulty = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("stream"));
  auto o = small_options({mem_tier("stream", faulty)});  // 4 MiB of staging, state over 5 MiB
  auto cp = Checkpointer::open(o).value();
  State big(80, {12 << 20});
  faulty->fail_always(store::FaultOp::kCreate, Code::kUnavailable);
  auto h = cp->save(1, big.views);  // must return, not hang on a ring nobody drains
  if (h) {
    EXPECT_FALSE((*h)->wait());
  }
  faulty->clear();
  faulty->fail_nth(store::FaultOp::kAppend, 2, Code::kNoSpace);  // mid-stream
  auto h2 = cp->save(2, big.views);
  if (h2) {
    EXPECT_FALSE((*h2)->wait());
  }
  faulty->clear();
  ASSERT_TRUE(cp->save(3, big.views).value()->wait());
  big.expect_restored(*cp, 3);
  EXPECT_EQ(cp->latest().value(), 3u);
}

TEST(Checkpointer, ASaveWhoseStagingFailedDoesNotHandTheNextOnesSegmentsOut) {
  // A save whose source fails gives its segments up; the next save's first segment must
  // still wait for its own bytes (it was once marked filled by the failed save, and the
  // writer stored whatever the slot held before).
  auto cp = Checkpointer::open(small_options({mem_tier("next")})).value();
  State big(81, {6 << 20});
  std::vector<TensorView> failing = big.views;
  failing[0].data = nullptr;
  failing[0].source = [](uint64_t, std::span<std::byte>) -> Status {
    return fail(Code::kIoError, "source went away");
  };
  auto h = cp->save(1, failing);
  if (h) {
    EXPECT_FALSE((*h)->wait());
  }
  std::vector<TensorView> slow = big.views;
  slow[0].data = nullptr;
  slow[0].source = [&big](uint64_t off, std::span<std::byte> dst) -> Status {
    if (off == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::memcpy(dst.data(), big.data[0].data() + off, dst.size());
    return ok();
  };
  ASSERT_TRUE(cp->save(2, slow).value()->wait());
  big.expect_restored(*cp, 2);
}

TEST(Checkpointer, StreamsThroughTheSmallestRingToALocalTier) {
  // Two slots, and writes in flight on the data path: the writer must free a slot before
  // it waits for the caller to fill the next one (this deadlocked once).
  TempDir dir;
  auto o = small_options({open_tier(dir.path()).value()});
  o.staging_bytes = 2 << 20;
  auto cp = Checkpointer::open(o).value();
  State big(85, {(9 << 20) + 5});
  ASSERT_TRUE(cp->save(1, big.views).value()->wait());
  big.expect_restored(*cp, 1);
}

TEST(Checkpointer, AStepBeingSavedIsNotSavedTwice) {
  auto slow = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("twice"));
  slow->set_latency(std::chrono::milliseconds(20));
  auto cp = Checkpointer::open(small_options({mem_tier("twice", slow)})).value();
  State a(90), b(91);
  auto h = cp->save(7, a.views).value();
  auto again = cp->save(7, b.views);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), Code::kAlreadyExists);
  ASSERT_TRUE(h->wait());
  slow->set_latency(std::chrono::milliseconds(0));
  a.expect_restored(*cp, 7);
}

TEST(Checkpointer, TwoSavesRacingOnOneStepLeaveOneIntactCheckpoint) {
  auto shared = std::shared_ptr<store::Store>(store::make_memory_store("race"));
  for (int round = 0; round < 20; ++round) {
    auto o = small_options({mem_tier("race", shared)});
    o.series = "race" + std::to_string(round);
    auto a = Checkpointer::open(o).value();
    auto b = Checkpointer::open(o).value();
    State sa(200 + round), sb(300 + round);
    Status ra, rb;
    std::thread ta([&] {
      auto h = a->save(1, sa.views);
      ra = h ? (*h)->wait() : Status(std::unexpected(h.error()));
    });
    std::thread tb([&] {
      auto h = b->save(1, sb.views);
      rb = h ? (*h)->wait() : Status(std::unexpected(h.error()));
    });
    ta.join();
    tb.join();
    ASSERT_TRUE(static_cast<bool>(ra) != static_cast<bool>(rb)) << round;  // exactly one wins
    EXPECT_EQ(a->verify(1).value().bad_chunks, 0u) << round;
    (ra ? sa : sb).expect_restored(*a, 1);
    // The loser left no orphan shard (defect 12 of the hostile test).
    size_t shards = 0;
    const auto objs = shared->list_all(step_prefix(o.series, 1)).value();
    for (const auto& obj : objs) shards += obj.key.ends_with(".shard");
    EXPECT_EQ(shards, 1u) << round;
  }
}

TEST(Checkpointer, RestoresATensorInParts) {
  auto cp = Checkpointer::open(small_options({mem_tier("parts")})).value();
  State s(100, {(5 << 20) + 123});
  ASSERT_TRUE(cp->save(1, s.views).value()->wait());
  const uint64_t size = s.data[0].size(), cs = 1 << 20;
  std::vector<std::byte> got(size);
  for (uint64_t off = 0; off < size; off += 2 * cs) {
    uint64_t n = std::min(2 * cs, size - off);
    TensorDest d{"t0", -1, got.data() + off, n, nullptr, off};
    ASSERT_TRUE(cp->restore(1, std::span(&d, 1))) << off;
  }
  EXPECT_EQ(got, s.data[0]);
  TensorDest unaligned{"t0", -1, got.data(), cs, nullptr, 100};
  EXPECT_EQ(cp->restore(1, std::span(&unaligned, 1)).error().code(), Code::kInvalidArgument);
  TensorDest ragged{"t0", -1, got.data(), cs + 1, nullptr, 0};
  EXPECT_EQ(cp->restore(1, std::span(&ragged, 1)).error().code(), Code::kInvalidArgument);
  TensorDest past{"t0", -1, got.data(), cs, nullptr, 6 * cs};
  EXPECT_EQ(cp->restore(1, std::span(&past, 1)).error().code(), Code::kInvalidArgument);
}

TEST(Checkpointer, SeveralRanksCommitOnceEveryRecordIsThere) {
  auto shared = std::shared_ptr<store::Store>(store::make_memory_store("ranks"));
  constexpr unsigned kWorld = 3;
  std::vector<std::unique_ptr<Checkpointer>> cps;
  std::vector<State> states;
  for (unsigned r = 0; r < kWorld; ++r) {
    auto o = small_options({mem_tier("shared", shared)});
    o.rank = r;
    o.world = kWorld;
    o.run_id = "run-1";
    o.commit_timeout = std::chrono::seconds(2);  // rank 1 waits for a step 9 that never commits
    cps.push_back(Checkpointer::open(o).value());
    states.emplace_back(10 + r, std::vector<uint64_t>{3000, 1 << 20});  // same names per rank
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(kWorld);
  for (unsigned r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] { results[r] = cps[r]->save(8, states[r].views).value()->wait(); });
  for (auto& t : threads) t.join();
  for (unsigned r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r]) << results[r].error().message();
  auto m = cps[0]->manifest(8).value();
  EXPECT_EQ(m.world, kWorld);
  for (unsigned r = 0; r < kWorld; ++r) states[r].expect_restored(*cps[r], 8);  // own shard
  // A named rank from any checkpointer; an ambiguous name without a rank is refused.
  std::vector<std::byte> out(3000);
  TensorDest d{"t0", 2, out.data(), out.size(), nullptr};
  ASSERT_TRUE(cps[0]->restore(8, std::span(&d, 1)));
  EXPECT_EQ(out, states[2].data[0]);

  // Rank 2 never saves step 9: rank 0 gives up and names it.
  cps[0].reset();
  auto o = small_options({mem_tier("shared", shared)});
  o.world = kWorld;
  o.run_id = "run-1";
  o.commit_timeout = std::chrono::milliseconds(300);
  auto cp0 = Checkpointer::open(o).value();
  auto h1 = cps[1]->save(9, states[1].views).value();
  auto st = cp0->save(9, states[0].views).value()->wait();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), Code::kTimedOut);
  EXPECT_NE(st.error().message().find("rank(s) 2"), std::string::npos) << st.error().message();
  EXPECT_EQ(cp0->latest().value(), 8u);
}

// A crash at every store operation of a save: afterwards the latest checkpoint is the old
// one or the new one, complete and bit-exact, never a mix.
TEST(Checkpointer, CrashAtEveryStepLeavesOldOrNew) {
  auto faulty = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("crash"));
  State old_state(20, {5000, 3 << 20}), new_state(21, {5000, 3 << 20});
  {
    auto cp = Checkpointer::open(small_options({mem_tier("c", faulty)})).value();
    ASSERT_TRUE(cp->save(1, old_state.views).value()->wait());
  }
  int crashes = 0;
  for (uint64_t n = 1;; ++n) {
    auto o = small_options({mem_tier("c", faulty)});
    auto cp = Checkpointer::open(o).value();
    const uint64_t calls_before = faulty->calls(store::FaultOp::kAny);
    faulty->fail_nth(store::FaultOp::kAny, n, Code::kIoError);
    auto h = cp->save(2, new_state.views);
    bool saved = h && (*h)->wait();
    cp->flush();
    // Whether the fault was reached: one on a best-effort call (a live marker) is absorbed.
    const bool faulted = faulty->calls(store::FaultOp::kAny) - calls_before >= n;
    faulty->clear();
    faulty->crash();
    faulty->restart();
    auto after = Checkpointer::open(o).value();
    uint64_t latest = after->latest().value();
    if (saved) {
      ASSERT_EQ(latest, 2u);
      new_state.expect_restored(*after, 2);
      if (!faulted) break;
      // Absorbed: take step 2 back and go on with the next call.
      auto keys = faulty->list_all(step_prefix("model", 2)).value();
      for (const auto& k : keys) ASSERT_TRUE(faulty->remove(k.key));
      continue;
    }
    ++crashes;
    ASSERT_TRUE(latest == 1 || latest == 2) << latest;
    (latest == 1 ? old_state : new_state).expect_restored(*after, latest);
    if (latest == 2) break;  // the commit landed before the fault: nothing later to test
    // Debris of the failed attempt is removed by gc (grace 0), the old step stays.
    auto go = o;
    go.incomplete_grace = std::chrono::seconds(0);
    auto g = Checkpointer::open(go).value()->gc().value();
    EXPECT_TRUE(g.removed_steps.empty());
    ASSERT_LT(n, 200u);
  }
  EXPECT_GT(crashes, 3);
}

TEST(Checkpointer, LocalTierFullFailsEarlyAndKeepsOlderCheckpoints) {
  sluice::testing::ScratchMount tmpfs("tmpfs", "size=8m");
  if (!tmpfs.ok()) GTEST_SKIP() << tmpfs.why();
  auto o = small_options({open_tier(tmpfs.file("ckpt")).value()});
  auto cp = Checkpointer::open(o).value();
  State small(30, {100000}), big(31, {16 << 20});
  ASSERT_TRUE(cp->save(1, small.views).value()->wait());
  auto h = cp->save(2, big.views);
  ASSERT_FALSE(h);
  EXPECT_EQ(h.error().code(), Code::kNoSpace);
  EXPECT_NE(h.error().message().find("free"), std::string::npos) << h.error().message();
  EXPECT_EQ(cp->latest().value(), 1u);
  small.expect_restored(*cp, 1);
}

TEST(Checkpointer, DeviceMemoryGoesThroughTheTarget) {
  TempDir dir;
  auto dev = mem::make_emulated_device(64 << 20);
  auto o = small_options({open_tier(dir.path()).value()});
  auto cp = Checkpointer::open(o).value();
  State s(40, {3 << 20, 12345});
  std::vector<mem::Allocation> on_dev;
  std::vector<TensorView> views = s.views;
  for (size_t i = 0; i < s.data.size(); ++i) {
    on_dev.push_back(dev->allocate(s.data[i].size()).value());
    ASSERT_TRUE(dev->wait(
        dev->copy_to_target(on_dev[i].get(), s.data[i].data(), s.data[i].size()).value()));
    views[i].data = on_dev[i].get();
    views[i].target = dev.get();
  }
  ASSERT_TRUE(cp->save(3, views).value()->wait());
  std::vector<mem::Allocation> back;
  std::vector<TensorDest> dests;
  for (size_t i = 0; i < s.data.size(); ++i) {
    back.push_back(dev->allocate(s.data[i].size()).value());
    dests.push_back({views[i].name, -1, back[i].get(), s.data[i].size(), dev.get()});
  }
  ASSERT_TRUE(cp->restore(3, dests));
  for (size_t i = 0; i < s.data.size(); ++i) {
    std::vector<std::byte> host(s.data[i].size());
    ASSERT_TRUE(dev->wait(dev->copy_to_host(host.data(), back[i].get(), host.size()).value()));
    EXPECT_EQ(host, s.data[i]);
  }
}

TEST(Checkpointer, RetentionKeepsLastAndEveryKth) {
  auto t = mem_tier("ret");
  t.retention = {2, 5};
  auto cp = Checkpointer::open(small_options({t})).value();
  State s(50, {4096});
  for (uint64_t step = 1; step <= 12; ++step) ASSERT_TRUE(cp->save(step, s.views).value()->wait());
  std::vector<uint64_t> left;
  auto steps = cp->list().value();
  for (const auto& i : steps) left.push_back(i.step);
  EXPECT_EQ(left, (std::vector<uint64_t>{5, 10, 11, 12}));
  // Nothing of the removed steps is left behind.
  auto objs = t.store->list_all("model/").value();
  for (const auto& obj : objs) {
    uint64_t step = 0;
    std::string leaf;
    ASSERT_TRUE(parse_step_key("model", obj.key, step, leaf));
    EXPECT_TRUE(step == 5 || step >= 10) << obj.key;
  }
}

// Issue 48: retention honours the pins it is given (the ledger's, through the client
// layer), asked at each gc; a pin it cannot read stops the tier's gc instead of being
// skipped.
TEST(Checkpointer, RetentionNeverRemovesAPinnedStep) {
  auto t = mem_tier("pins");
  std::vector<std::string> pins = {"model/step-000000000002/"};
  bool ledger_down = false;
  t.retention.keep_last = 1;
  t.retention.pinned = [&]() -> Result<std::vector<std::string>> {
    if (ledger_down) return fail(Code::kUnavailable, "ledger down");
    return pins;
  };
  auto o = small_options({t});
  o.gc_after_save = false;
  auto cp = Checkpointer::open(std::move(o)).value();
  State s(51, {4096});
  for (uint64_t step = 1; step <= 4; ++step) ASSERT_TRUE(cp->save(step, s.views).value()->wait());
  ledger_down = true;
  auto down = cp->gc();
  ASSERT_FALSE(down);
  EXPECT_EQ(down.error().code(), Code::kUnavailable);
  EXPECT_NE(down.error().message().find("pins"), std::string::npos) << down.error().message();
  EXPECT_EQ(cp->list().value().size(), 4u);  // nothing went
  ledger_down = false;
  auto r = cp->gc().value();
  EXPECT_EQ(r.removed_steps, (std::vector<uint64_t>{1, 3}));
  std::vector<uint64_t> left;
  const auto listed = cp->list().value();
  for (const auto& i : listed) left.push_back(i.step);
  EXPECT_EQ(left, (std::vector<uint64_t>{2, 4}));
  s.expect_restored(*cp, 2);
  // A pin of the whole tier ("") keeps everything; a pin of one object keeps its step.
  pins = {""};
  ASSERT_TRUE(cp->save(5, s.views).value()->wait());
  EXPECT_TRUE(cp->gc().value().removed_steps.empty());
  pins = {"model/step-000000000004/manifest.json"};
  EXPECT_EQ(cp->gc().value().removed_steps, (std::vector<uint64_t>{2}));
}

}  // namespace
}  // namespace sluice::ckpt

namespace sluice::ckpt {
namespace {

// The shard object of `step` on a store holding one rank's save.
std::string only_shard(store::Store& s, uint64_t step) {
  const auto objs = s.list_all(step_prefix("model", step)).value();
  for (const auto& obj : objs)
    if (obj.key.ends_with(".shard")) return obj.key;
  return {};
}

// Defects 1 and 10 of the hostile test: a newest step whose shard is lost or truncated is not
// a checkpoint: not listed, not latest, and never kept by retention in place of an older one.
TEST(Checkpointer, RetentionAndListingCountOnlyWholeSteps) {
  for (bool truncate : {false, true}) {
    auto t = mem_tier("whole");
    t.retention = {1, 0};
    auto o = small_options({t});
    o.gc_after_save = false;
    auto cp = Checkpointer::open(o).value();
    State s1(60, {70000}), s2(61, {70000});
    ASSERT_TRUE(cp->save(1, s1.views).value()->wait());
    ASSERT_TRUE(cp->save(2, s2.views).value()->wait());
    const std::string shard = only_shard(*t.store, 2);
    ASSERT_FALSE(shard.empty());
    if (truncate) {
      std::vector<std::byte> part(100);
      ASSERT_TRUE(t.store->put(shard, part));
    } else {
      ASSERT_TRUE(t.store->remove(shard));
    }
    auto steps = cp->list().value();
    ASSERT_EQ(steps.size(), 1u);
    EXPECT_EQ(steps[0].step, 1u);
    EXPECT_EQ(cp->latest().value(), 1u);
    auto g = cp->gc().value();
    EXPECT_TRUE(g.removed_steps.empty()) << "removed " << g.removed_steps[0];
    s1.expect_restored(*cp, 1);
    // A damaged manifest likewise.
    const std::string torn = "{\"format\":";
    ASSERT_TRUE(t.store->put(manifest_key("model", 1), std::as_bytes(std::span(torn))));
    EXPECT_TRUE(cp->list().value().empty());
    EXPECT_EQ(cp->latest().error().code(), Code::kNotFound);
  }
}

// Defect 12: a save that fails after publishing its shard (a full tier when the record is
// written) removes the shard; so does the loser of two saves of one step.
TEST(Checkpointer, AFailedSaveRemovesWhatItPublished) {
  auto faulty = std::make_shared<store::FaultInjectionStore>(store::make_memory_store("full"));
  auto o = small_options({mem_tier("f", faulty)});
  State s(80, {70000});
  int failures = 0;
  for (uint64_t n = 1; n <= 4; ++n) {
    auto cp = Checkpointer::open(o).value();
    faulty->fail_nth(store::FaultOp::kCommit, n, Code::kNoSpace);
    auto st = cp->save(n, s.views).value()->wait();
    cp->flush();
    faulty->clear();
    if (st) continue;
    ++failures;
    EXPECT_TRUE(only_shard(*faulty, n).empty()) << "commit " << n << ": " << st.error().message();
  }
  EXPECT_GE(failures, 2);
}

// Issue 47: saves killed with kill -9 left their shards and markers for the whole grace
// (an hour by default; 35 kills left 290 MB). Once a marker proves its process gone (this
// host, boot and PID namespace: live_owner_gone), gc removes that save's shard and marker at
// once; a marker that proves nothing (an older one, another boot) and a shard with no marker
// wait for the grace, as does a save still running.
TEST(Checkpointer, GcRemovesTheShardOfASaveProvenGone) {
  auto t = mem_tier("killed");
  auto o = small_options({t});
  o.gc_after_save = false;
  auto cp = Checkpointer::open(o).value();
  State s(90, {70000});
  ASSERT_TRUE(cp->save(1, s.views).value()->wait());
  cp->flush();  // the save's end (its marker removed, its step no longer active) is past
  // This process's marker, with its pid replaced by one above any pid_max (never running).
  std::string alive = live_text();
  ASSERT_TRUE(alive.starts_with("sluice-live 2 "));
  std::istringstream in(alive);
  std::string magic, version, host, pid, ticks, boot, ns;
  ASSERT_TRUE(in >> magic >> version >> host >> pid >> ticks >> boot >> ns);
  ASSERT_NE(boot, "-");
  const std::string dead =
      "sluice-live 2 " + host + " 2147483647 " + ticks + " " + boot + " " + ns + "\n";
  const std::string old_dead = "sluice-live 1 " + host + " 2147483647 " + ticks + "\n";
  const std::string other_boot =
      "sluice-live 2 " + host + " 2147483647 " + ticks + " another-boot " + ns + "\n";
  EXPECT_TRUE(live_owner_gone(dead));
  EXPECT_FALSE(live_owner_gone(alive));
  EXPECT_FALSE(live_owner_gone(old_dead));
  EXPECT_FALSE(live_owner_gone(other_boot));
  const std::vector<std::byte> shard_bytes(50000, std::byte{7});
  auto put = [&](uint64_t step, const std::string& leaf, std::span<const std::byte> b) {
    ASSERT_TRUE(t.store->put(step_prefix("model", step) + leaf, b));
  };
  auto text = [](const std::string& x) { return std::as_bytes(std::span(x)); };
  // Step 2: a save killed mid-write. Step 1: a second save of it, killed after its shard.
  put(2, "rank-00000-dead02.shard", shard_bytes);
  put(2, "rank-00000-dead02.live", text(dead));
  put(1, "rank-00000-dead01.shard", shard_bytes);
  put(1, "rank-00000-dead01.live", text(dead));
  // Step 3: a shard with no marker. Step 4: a save still running. Steps 5 and 6: markers
  // that do not hold but prove nothing.
  put(3, "rank-00000-nomark.shard", shard_bytes);
  put(4, "rank-00000-alive4.shard", shard_bytes);
  put(4, "rank-00000-alive4.live", text(alive));
  put(5, "rank-00000-older5.shard", shard_bytes);
  put(5, "rank-00000-older5.live", text(old_dead));
  put(6, "rank-00000-boot06.shard", shard_bytes);
  put(6, "rank-00000-boot06.live", text(other_boot));
  auto g = cp->gc().value();
  EXPECT_TRUE(g.removed_incomplete.empty());
  EXPECT_EQ(g.objects_removed, 4u);
  EXPECT_TRUE(t.store->list_all(step_prefix("model", 2)).value().empty());
  const auto step1 = t.store->list_all(step_prefix("model", 1)).value();
  for (const auto& obj : step1) EXPECT_EQ(obj.key.find("dead01"), std::string::npos) << obj.key;
  EXPECT_EQ(t.store->list_all(step_prefix("model", 3)).value().size(), 1u);
  for (uint64_t step : {4, 5, 6})
    EXPECT_EQ(t.store->list_all(step_prefix("model", step)).value().size(), 2u) << step;
  s.expect_restored(*cp, 1);
}

// Defect 3: a gc with no grace (another process) while rank 0 waits for rank 1 leaves the
// step alone, and a shard removed meanwhile fails the commit instead of being named.
TEST(Checkpointer, AMultiRankSaveIsNeverCommittedBroken) {
  auto shared = std::shared_ptr<store::Store>(store::make_memory_store("live"));
  auto opts = [&](unsigned rank, int timeout_s = 20) {
    auto o = small_options({mem_tier("shared", shared)});
    o.rank = rank;
    o.world = 2;
    o.run_id = "run-1";
    o.commit_timeout = std::chrono::seconds(timeout_s);
    return o;
  };
  State s0(70, {3000, 1 << 20}), s1(71, {3000, 1 << 20});
  {
    auto r0 = Checkpointer::open(opts(0)).value();
    auto r1 = Checkpointer::open(opts(1)).value();
    auto h0 = r0->save(5, s0.views).value();
    // Rank 0's shard and record are published; it waits for rank 1.
    while (only_shard(*shared, 5).empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto go = opts(0);
    go.incomplete_grace = std::chrono::seconds(0);
    auto g = Checkpointer::open(go).value()->gc().value();
    EXPECT_TRUE(g.removed_incomplete.empty());
    EXPECT_FALSE(only_shard(*shared, 5).empty());
    ASSERT_TRUE(r1->save(5, s1.views).value()->wait());
    ASSERT_TRUE(h0->wait());
    s0.expect_restored(*r0, 5);
    s1.expect_restored(*r1, 5);
  }
  {
    auto r0 = Checkpointer::open(opts(0)).value();
    auto r1 = Checkpointer::open(opts(1, 2)).value();  // gives up soon after rank 0 fails
    auto h0 = r0->save(6, s0.views).value();
    std::string shard;
    while ((shard = only_shard(*shared, 6)).empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(shared->remove(shard));  // an operator, or a gc that does not know the rule
    auto st1 = r1->save(6, s1.views).value()->wait();
    auto st0 = h0->wait();
    ASSERT_FALSE(st0);
    EXPECT_EQ(st0.error().code(), Code::kConflict) << st0.error().message();
    EXPECT_FALSE(st1);
    EXPECT_EQ(r0->latest().value(), 5u);
  }
}

// Issue 48: a host name names no machine (containers on several machines share one). A
// marker of another machine with this host name, a version 1 one (it names only the host)
// or a version 2 one of another boot, is never judged by a local pid: it holds its step for
// its lease and proves nothing, and a gc with no grace leaves that step alone.
TEST(Checkpointer, AMarkerOfAnotherMachineWithThisHostNameIsNotJudgedByALocalPid) {
  std::istringstream in(live_text());
  std::string magic, version, host, pid, ticks, boot, ns;
  ASSERT_TRUE(in >> magic >> version >> host >> pid >> ticks >> boot >> ns);
  ASSERT_NE(boot, "-");
  // Pid 2147483647 is above any pid_max: no process of this machine has it.
  const std::string v1 = "sluice-live 1 " + host + " 2147483647 " + ticks + "\n";
  const std::string other_machine =
      "sluice-live 2 " + host + " 2147483647 " + ticks + " another-boot " + ns + "\n";
  const std::string here_dead =
      "sluice-live 2 " + host + " 2147483647 " + ticks + " " + boot + " " + ns + "\n";
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t fresh = now - 1'000'000'000, stale = now - 31'000'000'000;
  EXPECT_TRUE(live_marker_holds(v1, fresh, now));
  EXPECT_TRUE(live_marker_holds(other_machine, fresh, now));
  EXPECT_FALSE(live_owner_gone(v1));
  EXPECT_FALSE(live_owner_gone(other_machine));
  EXPECT_FALSE(live_marker_holds(v1, stale, now));         // the lease still runs out
  EXPECT_FALSE(live_marker_holds(here_dead, fresh, now));  // this machine's: the pid tells
  EXPECT_TRUE(live_owner_gone(here_dead));

  auto t = mem_tier("hosts");
  auto o = small_options({t});
  o.gc_after_save = false;
  o.incomplete_grace = std::chrono::seconds(0);
  auto cp = Checkpointer::open(o).value();
  const std::vector<std::byte> shard(50000, std::byte{7});
  auto put = [&](uint64_t step, const std::string& leaf, std::span<const std::byte> b) {
    ASSERT_TRUE(t.store->put(step_prefix("model", step) + leaf, b));
  };
  auto text = [](const std::string& x) { return std::as_bytes(std::span(x)); };
  put(2, "rank-00000-v1mark.shard", shard);
  put(2, "rank-00000-v1mark.live", text(v1));
  put(3, "rank-00000-other3.shard", shard);
  put(3, "rank-00000-other3.live", text(other_machine));
  put(4, "rank-00000-dead04.shard", shard);
  put(4, "rank-00000-dead04.live", text(here_dead));
  ASSERT_TRUE(cp->gc());
  EXPECT_EQ(t.store->list_all(step_prefix("model", 2)).value().size(), 2u);
  EXPECT_EQ(t.store->list_all(step_prefix("model", 3)).value().size(), 2u);
  EXPECT_TRUE(t.store->list_all(step_prefix("model", 4)).value().empty());
}

// Counts the requests a store is sent as an S3 tier would bill them (stat: HEAD, read: GET,
// create: PUT, list: LIST, remove: DELETE), and by request and key. Live-marker writes (a
// PUT per rank every kLiveRefresh) are lease traffic, counted apart.
class CountingStore final : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  struct Counts {
    uint64_t requests = 0, markers = 0;
    std::map<std::string, uint64_t> calls;  // "HEAD key", "LIST prefix", ...
    uint64_t of(const std::string& call) const {
      auto it = calls.find(call);
      return it == calls.end() ? 0 : it->second;
    }
  };
  Counts counts() const {
    MutexLock lk(mu_);
    return counts_;
  }

  Result<store::ObjectInfo> stat(std::string_view key) override {
    count("HEAD", key);
    return StoreWrapper::stat(key);
  }
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options = {}) override {
    count("GET", key);
    return StoreWrapper::read(key, offset, dst, options);
  }
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override {
    count("PUT", key);
    return StoreWrapper::create(key, options);
  }
  Result<store::ListPage> list(const store::ListOptions& options) override {
    count("LIST", options.prefix);
    return StoreWrapper::list(options);
  }
  Status remove(std::string_view key) override {
    count("DELETE", key);
    return StoreWrapper::remove(key);
  }
  Status remove_many(std::span<const std::string> keys) override {
    for (size_t at = 0; at < keys.size(); at += 1000) count("DELETE", keys[at]);
    return StoreWrapper::remove_many(keys);
  }

 private:
  void count(std::string_view op, std::string_view key) {
    MutexLock lk(mu_);
    if (key.ends_with(".live")) {
      ++counts_.markers;
      return;
    }
    ++counts_.requests;
    ++counts_.calls[std::string(op) + " " + std::string(key)];
  }
  mutable Mutex mu_;
  Counts counts_ SLUICE_GUARDED_BY(mu_);
};

struct CommitCost {
  double rank0_per_round = 0;  // rank 0's requests per poll round while it waits alone
  uint64_t rank0_rounds = 0;
  uint64_t rank0_total = 0, others_total = 0;  // the whole save's requests
  uint64_t others_max = 0;                     // the most one other rank sent
  uint64_t rank0_step_lists = 0;               // LISTs of the step rank 0 sent in all
};

// A save of `world` ranks on one tier (each rank's requests counted on its own): rank 0
// comes first and waits alone for 1.5 s, then every other rank saves at once.
CommitCost measure_commit(unsigned world) {
  auto shared = std::shared_ptr<store::Store>(store::make_memory_store("cost"));
  std::vector<std::shared_ptr<CountingStore>> stores;
  std::vector<std::unique_ptr<Checkpointer>> cps;
  std::vector<State> states;
  for (unsigned r = 0; r < world; ++r) {
    stores.push_back(std::make_shared<CountingStore>(shared));
    auto o = small_options({mem_tier("cost", stores.back())});
    o.rank = r;
    o.world = world;
    o.run_id = "run-1";
    o.staging_bytes = 2 << 20;
    o.gc_after_save = false;
    o.commit_timeout = std::chrono::seconds(60);
    cps.push_back(Checkpointer::open(o).value());
    states.emplace_back(200 + r, std::vector<uint64_t>{4096});
  }
  auto h0 = cps[0]->save(1, states[0].views).value();
  while (!shared->stat(record_key("model", 1, 0)))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto before = stores[0]->counts();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto after = stores[0]->counts();
  // A round asks once for the last rank's record (a stat per missing rank) or lists the
  // step once (one paged LIST): either counts the rounds.
  auto rounds = [&](const CountingStore::Counts& c) {
    return c.of("HEAD " + record_key("model", 1, world - 1)) +
           c.of("LIST " + step_prefix("model", 1));
  };
  CommitCost cost;
  cost.rank0_rounds = rounds(after) - rounds(before);
  cost.rank0_per_round = cost.rank0_rounds ? static_cast<double>(after.requests - before.requests) /
                                                 static_cast<double>(cost.rank0_rounds)
                                           : 0;
  std::vector<std::thread> threads;
  std::vector<Status> results(world);
  for (unsigned r = 1; r < world; ++r)
    threads.emplace_back([&, r] { results[r] = cps[r]->save(1, states[r].views).value()->wait(); });
  for (auto& t : threads) t.join();
  results[0] = h0->wait();
  for (unsigned r = 0; r < world; ++r) EXPECT_TRUE(results[r]) << results[r].error().message();
  cost.rank0_total = stores[0]->counts().requests;
  cost.rank0_step_lists = stores[0]->counts().of("LIST " + step_prefix("model", 1));
  std::map<std::string, uint64_t> by_op;  // "HEAD" -> requests of every rank
  for (unsigned r = 0; r < world; ++r) {
    const auto c = stores[r]->counts();
    for (const auto& [call, n] : c.calls) by_op[call.substr(0, call.find(' '))] += n;
    if (r == 0) continue;
    cost.others_total += c.requests;
    cost.others_max = std::max(cost.others_max, c.requests);
  }
  std::string ops;
  for (const auto& [op, n] : by_op) ops += " " + op + " " + std::to_string(n);
  std::printf(
      "world %u: rank 0 waiting alone: %.2f requests per poll round (%llu rounds); whole save "
      "(rank 0 listed the step %llu times): "
      "rank 0 %llu requests, the others %llu (at most %llu each), %llu in all:%s\n",
      world, cost.rank0_per_round, static_cast<unsigned long long>(cost.rank0_rounds),
      static_cast<unsigned long long>(cost.rank0_step_lists),
      static_cast<unsigned long long>(cost.rank0_total),
      static_cast<unsigned long long>(cost.others_total),
      static_cast<unsigned long long>(cost.others_max),
      static_cast<unsigned long long>(cost.rank0_total + cost.others_total), ops.c_str());
  return cost;
}

// Issue 48: a multi-rank commit on S3 costs O(world) requests per poll round in all: rank 0
// lists the step once a round (one page up to 333 ranks), not a stat per missing rank (world
// - 1 requests a round: 3 and 15 here before), and reads each record once; the other ranks
// poll only the manifest.
TEST(Checkpointer, AMultiRankCommitCostsOneListARoundOnRankZero) {
  for (unsigned world : {4u, 16u}) {
    const CommitCost c = measure_commit(world);
    ASSERT_GT(c.rank0_rounds, 2u);
    EXPECT_LE(c.rank0_per_round, 1.0) << "world " << world;
    // Rank 0's whole save: a LIST a round and a GET per record, besides a few requests for
    // its shard, record and manifest and the checks around them (44 and 176 before).
    EXPECT_LE(c.rank0_total, 12u + c.rank0_step_lists + world) << "world " << world;
  }
}

}  // namespace
}  // namespace sluice::ckpt
