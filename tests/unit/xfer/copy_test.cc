// xfer::copy between file://, mem:// and fault-injecting stores: bytes, budgets, failures,
// cancellation, and untrusted listings.
#include "sluice/xfer/copy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "sluice/store/wrapper.h"
#include "sluice/testing/fault_store.h"
#include "test_util.h"

namespace sluice::xfer {
namespace {

using sluice::testing::as_bytes;
using sluice::testing::random_bytes;
using sluice::testing::TempDir;
using store::Store;

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    out.push_back(std::filesystem::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

// Counts reads in flight at once, to check the budget.
class ConcurrencyProbe : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    int now = ++in_flight_;
    int seen = max_.load();
    while (now > seen && !max_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto r = StoreWrapper::read(key, offset, dst, options);
    --in_flight_;
    {
      std::lock_guard lock(mu_);
      largest_read_ = std::max(largest_read_, dst.size());
      if (!options.split) ++unsplit_reads_;
    }
    return r;
  }
  int max_in_flight() const { return max_.load(); }
  size_t largest_read() const { return largest_read_; }
  int unsplit_reads() const { return unsplit_reads_; }

 private:
  std::atomic<int> in_flight_{0}, max_{0};
  std::mutex mu_;
  size_t largest_read_ = 0;  // guarded by mu_
  int unsplit_reads_ = 0;    // guarded by mu_
};

// A source that lies: its stat and listing report `claimed` bytes for every object, and
// its listing may add keys that were not asked for.
class LyingStore : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::optional<uint64_t> claimed;
  std::vector<std::string> extra_keys;

  Result<store::ObjectInfo> stat(std::string_view key) override {
    SLUICE_ASSIGN_OR_RETURN(auto info, StoreWrapper::stat(key));
    if (claimed) info.size = *claimed;
    return info;
  }
  Result<store::ListPage> list(const store::ListOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(auto page, StoreWrapper::list(options));
    for (auto& k : extra_keys) page.objects.push_back(store::ObjectInfo{k, 1, 0, "x"});
    return page;
  }
};

TEST(Copy, BytesSurviveEveryPartLayout) {
  auto src = store::make_memory_store();
  TempDir dir;
  auto dst = store::open_store(dir.path()).value();
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kMiB - 1, kMiB, kMiB + 1, 5 * kMiB + 17}) {
    auto data = random_bytes(size, size + 1);
    std::string key = "obj-" + std::to_string(size);
    ASSERT_TRUE(src->put(key, data));
    for (uint64_t part : {uint64_t{0}, uint64_t{4096}, kMiB, 3 * kMiB}) {
      for (unsigned conc : {1u, 4u}) {
        CopyOptions o{.concurrency = conc, .part_size = part};
        std::string dkey = "d/" + key + "-" + std::to_string(part) + "-" + std::to_string(conc);
        auto info = copy(*src, key, *dst, dkey, o);
        ASSERT_TRUE(info) << info.error().to_string();
        EXPECT_EQ(info->size, size);
        EXPECT_EQ(dst->get(dkey).value(), data) << dkey;
      }
    }
  }
  // Nothing but the objects: no temporary directory is left beside them.
  EXPECT_FALSE(std::filesystem::exists(dir.file(".sluice-tmp")));
}

TEST(Copy, ReadsStayWithinTheBudgetAndAreNotSplitAgain) {
  auto mem = store::make_memory_store();
  auto probe_owner = std::make_unique<ConcurrencyProbe>(std::move(mem));
  ConcurrencyProbe& probe = *probe_owner;
  std::vector<CopyItem> items;
  for (int i = 0; i < 12; ++i) {
    std::string k = "in/" + std::to_string(i);
    ASSERT_TRUE(probe.put(k, random_bytes(3 * kMiB + 5, static_cast<uint64_t>(i))));
    items.push_back(CopyItem{k, "out/" + std::to_string(i), std::nullopt});
  }
  auto dst = store::make_memory_store();
  CopyOptions o{.concurrency = 3, .jobs = 8, .part_size = kMiB};
  auto report = copy_all(probe, *dst, items, o);
  EXPECT_EQ(report.objects, 12u);
  EXPECT_TRUE(report.failures.empty());
  EXPECT_LE(probe.max_in_flight(), 3);
  EXPECT_GE(probe.max_in_flight(), 2);  // the budget is used, not just respected
  EXPECT_LE(probe.largest_read(), kMiB);
  EXPECT_GT(probe.unsplit_reads(), 0);
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(dst->get("out/" + std::to_string(i)).value(),
              probe.get("in/" + std::to_string(i)).value());
}

TEST(Copy, BufferBytesBoundTheParallelism) {
  auto probe = std::make_unique<ConcurrencyProbe>(store::make_memory_store());
  ASSERT_TRUE(probe->put("big", random_bytes(16 * kMiB)));
  auto dst = store::make_memory_store();
  // 16 slots, but only 2 MiB of buffers for 1 MiB parts: two reads at once at most.
  CopyOptions o{.concurrency = 16, .part_size = kMiB, .max_buffer_bytes = 2 * kMiB};
  ASSERT_TRUE(copy(*probe, "big", *dst, "big", o));
  EXPECT_LE(probe->max_in_flight(), 2);
  EXPECT_EQ(dst->get("big").value(), probe->get("big").value());
}

TEST(Copy, HugePartSizeAllocatesOnlyWhatTheObjectNeeds) {
  // Defect 4: buffers were sized by the part size. A 100 GiB part for 10 bytes must work.
  auto src = store::make_memory_store();
  auto dst = store::make_memory_store();
  ASSERT_TRUE(src->put("small", as_bytes("ten bytes!")));
  CopyOptions o{.part_size = uint64_t{100} << 30};
  ASSERT_TRUE(copy(*src, "small", *dst, "small", o));
  EXPECT_EQ(dst->get("small").value().size(), 10u);
}

TEST(Copy, SourceShorterThanItsStatFailsAndPublishesNothing) {
  // Defect 6 (and a HEAD that disagrees with the body): the bytes read must be the bytes
  // planned.
  auto lying = std::make_unique<LyingStore>(store::make_memory_store());
  ASSERT_TRUE(lying->put("obj", random_bytes(3 * kMiB)));
  lying->claimed = 4 * kMiB;
  TempDir dir;
  auto dst = store::open_store(dir.path()).value();
  auto r = copy(*lying, "obj", *dst, "obj", CopyOptions{.part_size = kMiB});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kConflict);
  EXPECT_NE(r.error().message().find(std::to_string(3 * kMiB)), std::string::npos)
      << r.error().message();
  EXPECT_NE(r.error().message().find(std::to_string(4 * kMiB)), std::string::npos);
  EXPECT_TRUE(files_under(dir.path()).empty()) << files_under(dir.path()).front();
}

TEST(Copy, LocalFileThatShrinksMidCopyFails) {
  TempDir dir;
  auto src = store::open_store(dir.file("src")).value();
  auto dst = store::open_store(dir.file("dst")).value();
  ASSERT_TRUE(src->put("f", random_bytes(4 * kMiB)));
  auto info = src->stat("f").value();
  // The plan was made, then the file shrank (as under a concurrent truncate).
  ASSERT_EQ(::truncate(dir.file("src/f").c_str(), 1000), 0);
  std::vector<CopyItem> items{{"f", "f", info}};
  auto report = copy_all(*src, *dst, items, CopyOptions{.part_size = kMiB});
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_EQ(report.objects, 0u);
  EXPECT_EQ(report.failures[0].error.code(), Code::kConflict)
      << report.failures[0].error.to_string();
  EXPECT_TRUE(files_under(dir.file("dst")).empty());
}

TEST(Copy, FailuresAreReportedPerObjectAndLeaveNothing) {
  auto faults = std::make_unique<store::FaultInjectionStore>(store::make_memory_store());
  std::vector<CopyItem> items;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(faults->put("k" + std::to_string(i), random_bytes(2 * kMiB + 1)));
    items.push_back(CopyItem{"k" + std::to_string(i), "k" + std::to_string(i), std::nullopt});
  }
  items.push_back(CopyItem{"missing", "missing", std::nullopt});
  faults->fail_nth(store::FaultOp::kRead, 4, Code::kIoError);
  TempDir dir;
  auto dst = store::open_store(dir.path()).value();
  auto report =
      copy_all(*faults, *dst, items, CopyOptions{.concurrency = 1, .jobs = 1, .part_size = kMiB});
  EXPECT_EQ(report.objects, 4u);
  ASSERT_EQ(report.failures.size(), 2u);
  std::set<std::string> failed;
  for (auto& f : report.failures) failed.insert(f.src_key);
  EXPECT_TRUE(failed.count("missing"));
  for (auto& f : report.failures) {
    if (f.src_key == "missing") {
      EXPECT_EQ(f.error.code(), Code::kNotFound);
    }
  }
  auto listed = dst->list_all("").value();
  EXPECT_EQ(listed.size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(dir.file(".sluice-tmp")));
}

TEST(Copy, CancelStopsAndAbortsOpenWriters) {
  auto slow = std::make_unique<store::FaultInjectionStore>(store::make_memory_store());
  std::vector<CopyItem> items;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(slow->put("k" + std::to_string(i), random_bytes(8 * kMiB)));
    items.push_back(CopyItem{"k" + std::to_string(i), "k" + std::to_string(i), std::nullopt});
  }
  slow->set_latency(std::chrono::milliseconds(20));
  TempDir dir;
  auto dst = store::open_store(dir.path()).value();
  std::atomic<bool> cancel{false};
  std::atomic<int> ticks{0};
  CopyOptions o{.concurrency = 2, .jobs = 2, .part_size = kMiB};
  o.cancel = &cancel;
  o.progress_interval = std::chrono::milliseconds(10);
  o.on_progress = [&](const CopyProgress& p) {
    if (p.bytes_done > 0 && ++ticks == 2) cancel = true;
  };
  auto report = copy_all(*slow, *dst, items, o);
  EXPECT_TRUE(report.cancelled);
  EXPECT_TRUE(report.failures.empty());  // a cancel is not a failure
  EXPECT_LT(report.objects, 4u);
  // Only whole objects, and no temporary files.
  auto published = dst->list_all("").value();
  for (auto& obj : published) EXPECT_EQ(obj.size, 8 * kMiB);
  EXPECT_FALSE(std::filesystem::exists(dir.file(".sluice-tmp")));
}

TEST(Copy, ProgressEndsAtTheTotals) {
  auto src = store::make_memory_store();
  std::vector<CopyItem> items;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(src->put("p" + std::to_string(i), random_bytes(kMiB)));
  }
  auto plan = plan_prefix(*src, "p", "q/").value().items;
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].dst_key, "q/0");
  auto dst = store::make_memory_store();
  CopyProgress last;
  CopyOptions o;
  o.on_progress = [&](const CopyProgress& p) { last = p; };
  auto report = copy_all(*src, *dst, plan, o);
  EXPECT_EQ(report.objects, 3u);
  EXPECT_EQ(last.bytes_done, 3 * kMiB);
  EXPECT_EQ(last.bytes_total, 3 * kMiB);
  EXPECT_EQ(last.objects_done, 3u);
  EXPECT_EQ(last.objects_total, 3u);
}

TEST(PlanPrefix, UntrustedListingsAreChecked) {
  // Defect 5: a listing with a key outside the prefix is a clear error naming the key.
  auto lying = std::make_unique<LyingStore>(store::make_memory_store());
  ASSERT_TRUE(lying->put("data/a", as_bytes("a")));
  lying->extra_keys = {"data/dir/"};  // a folder marker (S3 consoles make them): skipped
  auto plan = plan_prefix(*lying, "data/", "out/").value();
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].dst_key, "out/a");
  EXPECT_TRUE(plan.rejected.empty());

  lying->extra_keys = {"elsewhere/evil"};
  auto r = plan_prefix(*lying, "data/", "out/");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  EXPECT_NE(r.error().message().find("elsewhere/evil"), std::string::npos);

  // A key that would escape the destination ("data/../x" -> "out/../x") is set aside as a
  // failure of that object, naming it; the rest of the prefix still copies.
  lying->extra_keys = {"data/../x"};
  auto escaping = plan_prefix(*lying, "data/", "out/").value();
  ASSERT_EQ(escaping.items.size(), 1u);
  ASSERT_EQ(escaping.rejected.size(), 1u);
  EXPECT_EQ(escaping.rejected[0].src_key, "data/../x");
  EXPECT_NE(escaping.rejected[0].error.message().find("no valid destination"), std::string::npos);
}

TEST(Copy, LongestLegalNamesFit) {
  // Defect 7: temporary names must fit NAME_MAX for every legal destination name.
  TempDir dir;
  auto src = store::make_memory_store();
  auto dst = store::open_store(dir.path()).value();
  for (size_t len : {240u, 250u, 255u}) {
    std::string name(len, 'n');
    ASSERT_TRUE(src->put(name, as_bytes("x")));
    auto r = copy(*src, name, *dst, "sub/" + name);
    ASSERT_TRUE(r) << len << ": " << r.error().to_string();
    EXPECT_TRUE(std::filesystem::exists(dir.file("sub/" + name)));
  }
}

TEST(Copy, ExclusiveCopyKeepsTheExistingObject) {
  auto src = store::make_memory_store();
  auto dst = store::make_memory_store();
  ASSERT_TRUE(src->put("k", as_bytes("new")));
  ASSERT_TRUE(dst->put("k", as_bytes("old")));
  auto r = copy(*src, "k", *dst, "k", CopyOptions{.overwrite = false});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kAlreadyExists);
  auto kept = dst->get("k").value();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(kept.data()), kept.size()), "old");
}

TEST(Copy, EmptyListedObjectsAreLookedAtAgain) {
  // An object listed empty costs no read; without a second look it would be published
  // empty even after it was deleted or replaced.
  auto src = store::make_memory_store();
  auto dst = store::make_memory_store();
  ASSERT_TRUE(src->put("e", as_bytes("")));
  auto plan = plan_prefix(*src, "", "").value().items;
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_TRUE(src->put("e", as_bytes("now with bytes")));  // replaced after the listing
  auto report = copy_all(*src, *dst, plan);
  ASSERT_EQ(report.objects, 1u);
  EXPECT_EQ(dst->get("e").value().size(), 14u);
  ASSERT_TRUE(src->remove("e"));  // deleted after the listing
  auto gone = copy_all(*src, *dst, plan);
  ASSERT_EQ(gone.failures.size(), 1u);
  EXPECT_EQ(gone.failures[0].error.code(), Code::kNotFound);
}

TEST(Copy, PositionalAndInOrderDestinationsGetTheSameBytes) {
  // file:// takes parts at their offsets as they arrive; mem:// gets them appended in order.
  auto slow = std::make_unique<store::FaultInjectionStore>(store::make_memory_store());
  auto data = random_bytes(9 * kMiB + 3, 77);
  ASSERT_TRUE(slow->put("obj", data));
  slow->set_latency(std::chrono::milliseconds(3));
  TempDir dir;
  auto file = store::open_store(dir.path()).value();
  auto mem = store::make_memory_store();
  CopyOptions o{.concurrency = 6, .part_size = kMiB};
  ASSERT_TRUE(copy(*slow, "obj", *file, "obj", o));
  ASSERT_TRUE(copy(*slow, "obj", *mem, "obj", o));
  EXPECT_EQ(file->get("obj").value(), data);
  EXPECT_EQ(mem->get("obj").value(), data);
}

TEST(PartSize, ChosenFromTheObjectSize) {
  EXPECT_EQ(part_size_for(0), 8 * kMiB);
  EXPECT_EQ(part_size_for(10 * kMiB), 8 * kMiB);
  EXPECT_EQ(part_size_for(256 * kMiB), 32 * kMiB);
  EXPECT_EQ(part_size_for(100 * kMiB), 25 * kMiB);
  EXPECT_EQ(part_size_for(100 * kMiB, 8), 13 * kMiB);
  EXPECT_EQ(part_size_for(1024 * kMiB), 32 * kMiB);
  EXPECT_EQ(part_size_for(uint64_t{1} << 40), 32 * kMiB);
}

// gc moves objects to the trash and back with keep_mtime: retention orders objects by
// their modification time, so a restored object must not come back as the newest.
TEST(Copy, KeepMtimeGivesTheCopyItsSourcesTime) {
  TempDir dir;
  auto file = store::make_posix_store(dir.path());
  auto mem = store::make_memory_store("keep-mtime");
  ASSERT_TRUE(file->put("old", as_bytes("old bytes")));
  const int64_t old_ns = int64_t{1'600'000'000} * 1'000'000'000 + 123'000;
  const timespec times[2] = {{0, UTIME_OMIT}, {1'600'000'000, 123'000}};
  ASSERT_EQ(::utimensat(AT_FDCWD, dir.file("old").c_str(), times, 0), 0);
  CopyOptions keep;
  keep.keep_mtime = true;
  ASSERT_TRUE(copy(*file, "old", *file, "copy", keep));
  EXPECT_EQ(file->stat("copy").value().mtime_ns, old_ns);
  ASSERT_TRUE(copy(*file, "old", *mem, "copy", keep));
  EXPECT_EQ(mem->stat("copy").value().mtime_ns, old_ns);
  ASSERT_TRUE(copy(*file, "old", *file, "fresh", CopyOptions{}));  // by default: now
  EXPECT_GT(file->stat("fresh").value().mtime_ns, old_ns);
}

}  // namespace
}  // namespace sluice::xfer
