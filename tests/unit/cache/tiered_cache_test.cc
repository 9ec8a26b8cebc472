// TieredCache over a memory or file:// backing store: byte-exact reads, single-flight,
// staleness, persistence, corruption, kill -9 during fills, limits under concurrency.
#include "sluice/cache/tiered_cache.h"
#include "sluice/mem/buffer_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "cache/chunk.h"
#include "cache/disk_tier.h"
#include "contract/store_contract.h"
#include "sluice/core/fd.h"
#include "sluice/io/file_handle.h"
#include "sluice/store/serving_peer.h"
#include "sluice/store/wrapper.h"
#include "sluice/telemetry/registry.h"
#include "sluice/testing/fault_store.h"
#include "test_util.h"

namespace sluice::cache {
namespace {

namespace fs = std::filesystem;
using store::FaultInjectionStore;
using store::FaultOp;

constexpr uint64_t kChunk = 64 << 10;

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

using sluice::testing::TempDir;

CacheOptions small_options(const std::string& dir = "") {
  CacheOptions o;
  o.directory = dir;
  o.chunk_size = kChunk;
  o.ram_bytes = 4 << 20;
  o.disk_bytes = 16 << 20;
  return o;
}

// A backing store shared with the test, so the test can replace objects behind the cache.
struct Backing {
  std::string name =
      "cache-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  std::unique_ptr<store::Store> open() { return store::open_named_memory_store(name); }
};

std::unique_ptr<TieredCache> open_cache(std::unique_ptr<store::Store> backing, CacheOptions o) {
  auto c = TieredCache::open(std::move(backing), std::move(o));
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
  return c ? std::move(*c) : nullptr;
}

std::vector<std::byte> read_range(store::Store& s, const std::string& key, uint64_t off,
                                  size_t len) {
  std::vector<std::byte> out(len);
  auto n = s.read_full(key, off, out);
  EXPECT_TRUE(n.has_value()) << key << " @" << off << ": " << (n ? "" : n.error().to_string());
  out.resize(n ? *n : 0);
  return out;
}

TEST(ChunkChecksum, CopyAndChecksumCopiesAndHashesLikeChecksum) {
  std::mt19937_64 rng(7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{256} << 10, (size_t{256} << 10) + 17,
                   size_t{4} << 20}) {
    std::vector<std::byte> src(n), dst(n + 1, std::byte{0x5a});
    for (auto& b : src) b = static_cast<std::byte>(rng());
    uint64_t h = sluice::cache::copy_and_checksum(dst, src);
    EXPECT_EQ(h, sluice::cache::checksum(src)) << n;
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << n;
    EXPECT_EQ(dst[n], std::byte{0x5a}) << n;  // nothing past the source
  }
}

TEST(TieredCache, ReadsAreByteExactForEveryRangeShape) {
  TempDir dir;
  Backing b;
  auto backing = b.open();
  const std::vector<size_t> sizes = {1, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 123};
  std::map<std::string, std::vector<std::byte>> objects;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string key = "obj/" + std::to_string(sizes[i]);
    objects[key] = pattern(sizes[i], i);
    ASSERT_TRUE(backing->put(key, objects[key]));
  }
  // RAM only, RAM and NVMe, NVMe only: each serves the same bytes, cold and warm.
  for (int variant = 0; variant < 3; ++variant) {
    CacheOptions o = small_options(variant == 0 ? "" : dir.path() + "/v" + std::to_string(variant));
    if (variant == 2) o.ram_bytes = 0;
    auto cache = open_cache(b.open(), o);
    ASSERT_TRUE(cache);
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& [key, want] : objects) {
        const uint64_t n = want.size();
        std::vector<std::pair<uint64_t, size_t>> shapes = {{0, n},       {0, 1},  {n - 1, 1},
                                                           {0, n + 100}, {n, 10}, {n / 2, n}};
        if (n > kChunk) {
          shapes.push_back({kChunk - 1, 2});            // across a boundary
          shapes.push_back({kChunk, kChunk});           // exactly one chunk
          shapes.push_back({kChunk - 7, kChunk + 14});  // a chunk and both neighbours' edges
        }
        for (auto [off, len] : shapes) {
          auto got = read_range(*cache, key, off, len);
          uint64_t end = std::min<uint64_t>(n, off + len);
          std::vector<std::byte> expect(want.begin() + std::min<uint64_t>(off, n),
                                        want.begin() + end);
          ASSERT_EQ(got, expect) << "variant " << variant << " pass " << pass << " " << key << " @"
                                 << off << "+" << len;
        }
      }
      if (variant == 2 && pass == 0) cache.reset(), cache = open_cache(b.open(), o);
    }
    CacheStats s = cache->stats();
    EXPECT_GT(s.ram.hits + s.disk.hits, 0u) << "variant " << variant;
  }
}

TEST(TieredCache, APrefaultedRamTierIsReadyInTheBackgroundAndServesReads) {
  Backing b;
  auto backing = b.open();
  const auto data = pattern(5 * kChunk + 7, 11);
  ASSERT_TRUE(backing->put("obj", data));
  CacheOptions o = small_options();
  o.prefault_ram = true;
  std::promise<std::pair<uint64_t, bool>> done;
  o.prefaulted = [&](uint64_t bytes, double seconds, const Status& outcome) {
    EXPECT_GE(seconds, 0.0);
    done.set_value({bytes, outcome.has_value()});
  };
  auto cache = open_cache(std::move(backing), o);
  ASSERT_TRUE(cache);
  // Reads need not wait for it (they take the buffers as they are ready).
  EXPECT_EQ(read_range(*cache, "obj", 0, data.size()), data);
  auto [bytes, ok] = done.get_future().get();
  EXPECT_TRUE(ok);
  // every chunk buffer of the RAM tier, less those the read allocated meanwhile
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, o.ram_bytes);
  EXPECT_EQ(read_range(*cache, "obj", kChunk, 2 * kChunk),
            std::vector<std::byte>(data.begin() + kChunk, data.begin() + 3 * kChunk));
  EXPECT_LE(cache->stats().ram.bytes, o.ram_bytes);
}

// Closing joins the prefaulting thread wherever it is (ASan and UBSan run this too).
TEST(TieredCache, ClosingWhileItsRamTierIsPrefaultedIsSafe) {
  Backing b;
  CacheOptions o = small_options();
  o.chunk_size = 1 << 20;
  o.ram_bytes = 1ULL << 30;  // long enough to be cut short
  o.prefault_ram = true;
  std::atomic<int> said{0};
  o.prefaulted = [&](uint64_t, double, const Status&) { said++; };
  auto cache = open_cache(b.open(), o);
  cache.reset();  // joins the prefaulting thread
  EXPECT_LE(said.load(), 1);
}

TEST(BufferPool, ReserveAddsTouchedBuffersUpToItsIdleLimitUntilStopped) {
  BufferPool pool(1 << 16, 3);
  std::atomic<bool> stop{false};
  auto added = pool.reserve(5, stop);
  ASSERT_TRUE(added) << added.error().to_string();
  EXPECT_EQ(*added, 3u);  // the idle limit
  EXPECT_EQ(pool.idle(), 3u);
  auto b = pool.acquire();
  ASSERT_TRUE(b);
  EXPECT_EQ(pool.idle(), 2u);
  stop = true;
  EXPECT_EQ(*pool.reserve(5, stop), 0u);
  EXPECT_EQ(pool.idle(), 2u);
}

TEST(BufferPool, ReserveCountsTheBuffersHandedOutAndShedGivesIdleOnesBack) {
  BufferPool pool(1 << 16, 10);
  std::atomic<bool> stop{false};
  auto a = pool.acquire(), b = pool.acquire();  // allocated by readers meanwhile
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*pool.reserve(5, stop), 3u);  // 5 in all, not 5 more
  EXPECT_EQ(pool.idle(), 3u);
  *a = PooledBuffer();  // back to the pool
  EXPECT_EQ(pool.idle(), 4u);
  EXPECT_EQ(*pool.reserve(5, stop), 0u);
  // Memory taken elsewhere gives back as much, in whole buffers, down to the floor.
  pool.shed(1 << 15, 1);
  EXPECT_EQ(pool.idle(), 4u);  // half a buffer owed
  pool.shed(1 << 15, 1);
  EXPECT_EQ(pool.idle(), 3u);
  pool.shed(10 << 16, 1);
  EXPECT_EQ(pool.idle(), 1u);             // the floor
  EXPECT_EQ(*pool.reserve(5, stop), 3u);  // 1 idle, 1 out: 3 more make 5
}

TEST(TieredCache, ConcurrentMissesOnOneChunkReadTheBackingStoreOnce) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(kChunk, 1)));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  faults->set_latency(std::chrono::milliseconds(50));
  FaultInjectionStore* f = faults.get();
  CacheOptions o = small_options();
  o.revalidate_after = std::chrono::hours(1);
  auto cache = open_cache(std::move(faults), o);
  ASSERT_TRUE(cache->stat("k").has_value());  // one stat, outside the race
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int i = 0; i < 16; ++i) {
    ts.emplace_back([&] {
      std::vector<std::byte> out(kChunk);
      auto n = cache->read_full("k", 0, out);
      if (n && *n == kChunk && out == pattern(kChunk, 1)) ++good;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), 16);
  EXPECT_EQ(f->calls(FaultOp::kRead), 1u);
  EXPECT_GT(cache->stats().singleflight_joins, 0u);
}

TEST(TieredCache, WithoutARamTierAlignedReadsWriteChunksThroughBeforeReturning) {
  // No RAM tier and a 4 KiB-aligned destination: each filled chunk goes to NVMe from the
  // reader's buffer (no copy), and is there when the read returns. Concurrent readers of
  // the same chunks still cause one backing read per chunk.
  TempDir dir;
  Backing b;
  const uint64_t size = 6 * kChunk + 123;
  ASSERT_TRUE(b.open()->put("k", pattern(size, 7)));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  faults->set_latency(std::chrono::milliseconds(30));
  FaultInjectionStore* f = faults.get();
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  o.revalidate_after = std::chrono::hours(1);
  auto cache = open_cache(std::move(faults), o);
  ASSERT_TRUE(cache->stat("k").has_value());
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&] {
      AlignedBuffer out = AlignedBuffer::allocate(size).value();
      auto n = cache->read_full("k", 0, std::span<std::byte>(out.data(), size));
      if (n && *n == size && std::equal(out.data(), out.data() + size, pattern(size, 7).begin()))
        ++good;
      EXPECT_GE(cache->stats().disk.chunks, 1u);  // written before the read returned
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), 8);
  EXPECT_EQ(cache->stats().misses, 7u);
  EXPECT_GT(cache->stats().singleflight_joins, 0u);  // waiters of written-through fills
  EXPECT_EQ(cache->stats().disk.chunks, 7u);         // no write left queued behind the reads
  EXPECT_LE(f->calls(FaultOp::kRead), 7u);
  // And they verify when read back from NVMe.
  auto rep = cache->verify();
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->chunks, 7u);
  EXPECT_TRUE(rep->corrupt.empty());
}

// A backing store that streams a read in pieces and tells ReadOptions::on_landed after
// each, as s3:// does for one request; it can start again after `retry_after` bytes (the
// first attempt's bytes inverted: a torn or wrong response), or fail after `fail_after`.
class Streaming : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  uint64_t piece = 16 << 10;
  uint64_t retry_after = 0, fail_after = 0;  // 0: never
  std::function<void(uint64_t end)> watch;   // called after each on_landed

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    auto land = [&](size_t to) {
      if (options.hooks.on_landed) options.hooks.on_landed(offset + to);
      if (watch) watch(offset + to);
    };
    SLUICE_ASSIGN_OR_RETURN(size_t n, target().read(key, offset, dst, options));
    if (retry_after) {  // the wrong bytes first, landed piece by piece, then a retry
      size_t to = 0;
      while (to < std::min<uint64_t>(retry_after, n)) {
        size_t from = to;
        to = std::min<size_t>(n, to + piece);
        for (size_t i = from; i < to; ++i) dst[i] = ~dst[i];
        land(to);
      }
      for (size_t i = 0; i < to; ++i) dst[i] = ~dst[i];
    }
    for (size_t to = std::min<size_t>(n, piece);; to = std::min<size_t>(n, to + piece)) {
      if (fail_after && to > fail_after) return fail(Code::kUnavailable, "reset mid-body");
      land(to);
      if (to == n) break;
    }
    return n;
  }
};

// The bytes of the chunk files' data regions (SEEK_DATA to SEEK_HOLE): pages holding bytes,
// holes punched excluded. Not st_blocks, which also counts the file system's own blocks:
// ext4 adds an extent-tree block to a file whose holes split it into more than four
// extents, which happens or not with writeback's timing (this test failed on it under
// load).
uint64_t chunk_file_bytes(const std::string& dir) {
  uint64_t total = 0;
  for (auto& e : fs::recursive_directory_iterator(fs::path(dir) / "chunks")) {
    if (!e.is_regular_file()) continue;
    UniqueFd fd(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) continue;
    off_t pos = 0;
    for (;;) {
      off_t data = ::lseek(fd.get(), pos, SEEK_DATA);
      if (data < 0) break;  // ENXIO: no data past pos
      off_t hole = ::lseek(fd.get(), data, SEEK_HOLE);
      if (hole < 0) break;
      total += static_cast<uint64_t>(hole - data);
      pos = hole;
    }
  }
  return total;
}

// A cache without a RAM tier (so fills are written through) over a Streaming store that
// holds `chunks` chunks of pattern(seed) under "k".
struct StreamedFill {
  TempDir dir;
  Backing b;
  Streaming* streaming = nullptr;
  std::unique_ptr<TieredCache> cache;
  uint64_t size;
  uint32_t seed;
  AlignedBuffer out;

  StreamedFill(uint64_t chunks, uint32_t seed_) : size(chunks * kChunk), seed(seed_) {
    EXPECT_TRUE(b.open()->put("k", pattern(size, seed)));
    auto s = std::make_unique<Streaming>(b.open());
    streaming = s.get();
    CacheOptions o = small_options(dir.path());
    o.ram_bytes = 0;
    o.revalidate_after = std::chrono::hours(1);
    cache = open_cache(std::move(s), o);
    out = AlignedBuffer::allocate(size).value();
  }
  // The whole object in one backing read (one run), as cp's parts ask.
  Result<size_t> read() {
    store::ReadOptions ro;
    ro.split = false;
    return cache->read_full("k", 0, std::span<std::byte>(out.data(), size), ro);
  }
  bool exact() const {
    return std::equal(out.data(), out.data() + size, pattern(size, seed).begin());
  }
};

TEST(TieredCache, WrittenThroughChunksGoToNvmeAsTheirBytesLand) {
  // A run's chunks are written while its backing read still streams, and recorded (readable)
  // only once the read has succeeded.
  StreamedFill f(8, 3);
  uint64_t on_disk_before_the_end = 0;
  size_t recorded_before_the_end = 0;
  f.streaming->watch = [&](uint64_t end) {
    if (end == f.size - f.streaming->piece) {
      on_disk_before_the_end = chunk_file_bytes(f.dir.path());
      recorded_before_the_end = f.cache->chunks("").size();
    }
  };
  auto n = f.read();
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  EXPECT_TRUE(f.exact());
  EXPECT_GE(on_disk_before_the_end, 7 * kChunk);  // every chunk but the last written
  EXPECT_EQ(recorded_before_the_end, 0u);         // and none readable yet
  EXPECT_EQ(f.cache->chunks("").size(), 8u);
  auto rep = f.cache->verify();
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->chunks, 8u);
  EXPECT_TRUE(rep->corrupt.empty());
}

TEST(TieredCache, ARetriedStreamRewritesWhatItWroteEarly) {
  // The first attempt lands wrong bytes for some chunks, which are written early; the retry
  // lands the right ones. Only the right ones are kept and served, also when the retry's
  // first piece is so large that the restart is not seen as one (pieces of 1 and 2 chunks).
  for (uint64_t piece : {uint64_t{16} << 10, kChunk, 2 * kChunk}) {
    for (uint64_t wrong : {kChunk + 100, 3 * kChunk + 100}) {
      SCOPED_TRACE("piece " + std::to_string(piece) + ", wrong " + std::to_string(wrong));
      StreamedFill f(8, 4);
      f.streaming->piece = piece;
      f.streaming->retry_after = wrong;
      auto n = f.read();
      ASSERT_TRUE(n.has_value()) << n.error().to_string();
      EXPECT_TRUE(f.exact());
      auto rep = f.cache->verify();
      ASSERT_TRUE(rep.has_value());
      EXPECT_EQ(rep->chunks, 8u);
      EXPECT_TRUE(rep->corrupt.empty());
      // Served from NVMe now: the same right bytes.
      const uint64_t misses = f.cache->stats().misses;
      EXPECT_EQ(read_range(*f.cache, "k", 0, f.size), pattern(f.size, 4));
      EXPECT_EQ(f.cache->stats().misses, misses);
      EXPECT_EQ(chunk_file_bytes(f.dir.path()), f.size);  // each chunk once, nothing left over
    }
  }
}

TEST(TieredCache, EvictWhileChunksAreWrittenEarlyLeavesNothingBehind) {
  // An evict in the middle of a streamed fill drops the chunks written so far but not yet
  // recorded: they are never recorded, their pages are freed, the read is still exact.
  StreamedFill f(8, 6);
  bool evicted = false;
  f.streaming->watch = [&](uint64_t end) {
    if (!evicted && end >= 4 * kChunk + 1) {
      evicted = true;
      EXPECT_TRUE(f.cache->evict("").has_value());
    }
  };
  auto n = f.read();
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  EXPECT_TRUE(evicted);
  EXPECT_TRUE(f.exact());
  auto rep = f.cache->verify();
  ASSERT_TRUE(rep.has_value());
  EXPECT_TRUE(rep->corrupt.empty());
  EXPECT_LE(rep->chunks, 4u);  // at most those begun after the evict
  EXPECT_EQ(chunk_file_bytes(f.dir.path()), rep->chunks * kChunk);
  f.streaming->watch = nullptr;
  EXPECT_EQ(read_range(*f.cache, "k", 0, f.size), pattern(f.size, 6));
}

TEST(TieredCache, AStreamThatFailsKeepsNothingItWroteEarly) {
  StreamedFill f(8, 5);
  f.streaming->fail_after = 5 * kChunk + 1;  // five chunks landed and written, then a reset
  auto n = f.read();
  ASSERT_FALSE(n.has_value());
  EXPECT_EQ(n.error().code(), Code::kUnavailable);
  EXPECT_TRUE(f.cache->chunks("").empty());
  EXPECT_EQ(f.cache->stats().disk.bytes, 0u);     // their room given back
  EXPECT_EQ(chunk_file_bytes(f.dir.path()), 0u);  // and their pages
  f.streaming->fail_after = 0;
  n = f.read();
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  EXPECT_TRUE(f.exact());
  EXPECT_EQ(f.cache->chunks("").size(), 8u);
}

TEST(TieredCache, AReaderThatKeepsItsOwnReadsInParallelIsNotSplitBehindIt) {
  // cp reads parts with split = false; through the cache the backing read of a run must
  // say so too, or an S3 store cuts each part into smaller requests, the first one alone.
  struct Recording : store::StoreWrapper {
    using StoreWrapper::StoreWrapper;
    std::vector<bool> splits;
    Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                        const store::ReadOptions& options) override {
      splits.push_back(options.split);
      return StoreWrapper::read(key, offset, dst, options);
    }
  };
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(4 * kChunk, 3)));
  auto rec = std::make_unique<Recording>(b.open());
  Recording* r = rec.get();
  auto cache = open_cache(std::move(rec), small_options());
  std::vector<std::byte> out(2 * kChunk);
  store::ReadOptions whole;
  whole.split = false;
  ASSERT_EQ(cache->read_full("k", 0, out, whole).value(), 2 * kChunk);
  ASSERT_EQ(cache->read_full("k", 2 * kChunk, out).value(), 2 * kChunk);
  EXPECT_EQ(r->splits, (std::vector<bool>{false, true}));
}

TEST(TieredCache, AMissOnManyWholeChunksIsOneBackingRead) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(6 * kChunk + 5, 1)));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* f = faults.get();
  auto cache = open_cache(std::move(faults), small_options());
  // Chunk 1 cached first: the run of misses stops at it and goes on after it.
  const auto want = pattern(6 * kChunk + 5, 1);
  EXPECT_EQ(read_range(*cache, "k", kChunk, kChunk),
            std::vector<std::byte>(want.begin() + kChunk, want.begin() + 2 * kChunk));
  EXPECT_EQ(f->calls(FaultOp::kRead), 1u);
  EXPECT_EQ(read_range(*cache, "k", 0, 7 * kChunk), pattern(6 * kChunk + 5, 1));
  EXPECT_EQ(f->calls(FaultOp::kRead), 3u);  // chunk 0; chunk 1 from RAM; chunks 2-6 in one
  EXPECT_EQ(cache->stats().misses, 7u);
  EXPECT_EQ(read_range(*cache, "k", 0, 7 * kChunk), pattern(6 * kChunk + 5, 1));
  EXPECT_EQ(f->calls(FaultOp::kRead), 3u);
}

bool eventually(const std::function<bool()>& f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(TieredCache, DeclaredReadsArePrefetchedWithinTheBudget) {
  Backing b;
  const auto want = pattern(8 * kChunk, 3);
  ASSERT_TRUE(b.open()->put("k", want));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* f = faults.get();
  CacheOptions o = small_options();
  o.prefetch_bytes = 3 * kChunk;
  o.revalidate_after = std::chrono::hours(1);
  auto cache = open_cache(std::move(faults), o);
  std::vector<PlannedRead> order = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(order).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cache->stats().prefetched, 3u);  // the budget holds it at three chunks ahead
  EXPECT_EQ(f->calls(FaultOp::kRead), 3u);
  for (uint64_t i = 0; i < 8; ++i) {
    auto got = read_range(*cache, "k", i * kChunk, kChunk);
    ASSERT_EQ(got,
              std::vector<std::byte>(want.begin() + i * kChunk, want.begin() + (i + 1) * kChunk));
  }
  // The three fetched before any read are hits; later ones race the reader, and a chunk
  // the reader passed before a prefetcher took it is neither fetched again nor waste.
  EXPECT_GE(cache->stats().prefetch_hits, 3u);
  EXPECT_EQ(cache->stats().prefetch_wasted, 0u);
  EXPECT_EQ(cache->stats().misses, 8u);  // every chunk read from the source once
}

TEST(TieredCache, AnEndlessDeclarationIsRefused) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(8 * kChunk, 5)));
  auto cache = open_cache(b.open(), small_options());
  // 8 chunks a read: one read past the bound is too many.
  std::vector<PlannedRead> order(kMaxDeclaredChunks / 8 + 1, {"k", 0, 0});
  auto r = cache->declare(order);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  order.pop_back();
  EXPECT_TRUE(cache->declare(order).has_value());
}

TEST(TieredCache, SkippedPrefetchesAreWasteAndFreeTheBudget) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(8 * kChunk, 4)));
  CacheOptions o = small_options();
  o.prefetch_bytes = 2 * kChunk;
  o.prefetch_reorder_chunks = 0;  // strictly in order: a read past a chunk skips it
  auto cache = open_cache(b.open(), o);
  std::vector<PlannedRead> order = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(order).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 2; }));
  read_range(*cache, "k", kChunk, kChunk);  // chunk 0 is skipped
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 4; }));
  EXPECT_EQ(cache->stats().prefetch_wasted, 1u);
  EXPECT_EQ(cache->stats().prefetch_hits, 1u);
}

// sluiced hands a chunk on NVMe to its reader (locate) instead of reading it: that is a
// read of a prefetched chunk too, or the budget would stay held and prefetch would stop.
TEST(TieredCache, APrefetchedChunkHandedOffByLocateIsAHitAndFreesTheBudget) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(4 * kChunk, 6)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  o.prefetch_bytes = 2 * kChunk;
  auto cache = open_cache(b.open(), o);
  std::vector<PlannedRead> order = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(order).has_value());
  for (uint64_t i = 0; i < 2; ++i) {  // once written (an entry is listed before that)
    ASSERT_TRUE(eventually([&] {
      auto x = cache->locate("k", i * kChunk);
      return x.has_value() && x->has_value();
    }));
  }
  EXPECT_EQ(cache->stats().prefetch_hits, 2u);
  // The two handed off no longer count against the budget: the next two are fetched.
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 4; }));
  EXPECT_EQ(cache->stats().prefetch_wasted, 0u);
}

// Evicts racing prefetch, write-behind and readers (no RAM tier: everything goes through
// the write queue): every read exact, nothing hangs, the queue's room is all given back.
TEST(TieredCache, EvictRacingPrefetchAndReadersStaysExact) {
  TempDir dir;
  Backing b;
  const auto want = pattern(32 * kChunk, 12);
  ASSERT_TRUE(b.open()->put("k", want));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  o.disk_write_queue_bytes = 8 * kChunk;
  o.prefetch_bytes = 8 * kChunk;
  auto cache = open_cache(b.open(), o);
  std::atomic<bool> done{false};
  std::thread evictor([&] {
    while (!done.load()) {
      EXPECT_TRUE(cache->evict("k").has_value());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::thread> readers;
  std::atomic<int> exact{0};
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      // Off 4 KiB alignment on one reader: through the queue; aligned on the other.
      AlignedBuffer buf = AlignedBuffer::allocate(32 * kChunk + 4096).value();
      std::byte* at = buf.data() + (t == 0 ? 8 : 0);
      for (int round = 0; round < 5; ++round) {
        std::vector<PlannedRead> order = {{"k", 0, 0}};
        EXPECT_TRUE(cache->declare(order).has_value());
        auto n = cache->read_full("k", 0, std::span(at, 32 * kChunk));
        if (n && *n == want.size() && std::equal(want.begin(), want.end(), at)) ++exact;
      }
    });
  }
  for (std::thread& r : readers) r.join();
  done = true;
  evictor.join();
  EXPECT_EQ(exact.load(), 10);
  EXPECT_EQ(read_range(*cache, "k", 0, want.size()), want);
}

// Another node's read (a daemon serving a peer) is not a read of this node's order.
TEST(TieredCache, ReadsServingAPeerLeaveTheDeclaredOrderAlone) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(4 * kChunk, 11)));
  CacheOptions o = small_options();
  o.prefetch_bytes = 2 * kChunk;
  auto cache = open_cache(b.open(), o);
  std::vector<PlannedRead> order = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(order).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 2; }));
  {
    store::ServingPeer peer;
    read_range(*cache, "k", 0, kChunk);
    read_range(*cache, "k", kChunk, kChunk);
  }
  EXPECT_EQ(cache->stats().prefetch_hits, 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cache->stats().prefetched, 2u);  // the budget is still the reader's
  read_range(*cache, "k", 0, kChunk);
  EXPECT_EQ(cache->stats().prefetch_hits, 1u);
}

// A reader with many reads in flight (the loader: about 128 chunks) reads out of the
// declared order: the chunks it reads later than their place are hits, not waste.
TEST(TieredCache, ReadsOutOfOrderWithinTheDefaultSlackWasteNothing) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(40 * kChunk, 11)));
  CacheOptions o = small_options();
  o.ram_bytes = 64 * kChunk;
  o.prefetch_bytes = 64 * kChunk;
  auto cache = open_cache(b.open(), o);
  std::vector<PlannedRead> all = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(all).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 40; }));
  const auto want = pattern(40 * kChunk, 11);
  for (uint64_t i : {39, 20}) read_range(*cache, "k", i * kChunk, kChunk);
  for (uint64_t i = 0; i < 39; ++i) {
    if (i == 20) continue;
    EXPECT_EQ(read_range(*cache, "k", i * kChunk, kChunk),
              std::vector<std::byte>(want.begin() + i * kChunk, want.begin() + (i + 1) * kChunk));
  }
  EXPECT_EQ(cache->stats().prefetch_hits, 40u);
  EXPECT_EQ(cache->stats().prefetch_wasted, 0u);
}

// A reader that declares and goes away (a killed job, `cat | head`) must not hold the
// prefetch budget from the next one: reading far past its chunks releases them.
TEST(TieredCache, AnAbandonedDeclarationDoesNotStallTheNextReader) {
  Backing b;
  ASSERT_TRUE(b.open()->put("gone", pattern(20 * kChunk, 9)));
  ASSERT_TRUE(b.open()->put("next", pattern(4 * kChunk, 10)));
  CacheOptions o = small_options();
  o.ram_bytes = 64 * kChunk;
  o.prefetch_bytes = 2 * kChunk;
  o.prefetch_reorder_chunks = 16;  // "gone" is 20 chunks: the read of "next" is past them
  auto cache = open_cache(b.open(), o);
  std::vector<PlannedRead> gone = {{"gone", 0, 0}};
  ASSERT_TRUE(cache->declare(gone).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched == 2; }));
  std::vector<PlannedRead> next = {{"next", 0, 0}};
  ASSERT_TRUE(cache->declare(next).has_value());
  // Its first chunk is still queued behind "gone"'s (never prefetched): the read passes
  // the abandoned ones, which stop holding the budget.
  const auto want = pattern(4 * kChunk, 10);
  EXPECT_EQ(read_range(*cache, "next", 0, kChunk),
            std::vector<std::byte>(want.begin(), want.begin() + kChunk));
  EXPECT_GE(cache->stats().prefetch_wasted, 2u);
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched > 2; }));
}

// Holds a thread (the NVMe writer, in an admit_chunk hook) until opened. Open it on every
// way out of a test with an OpenOnExit declared after the cache: an ASSERT that returns
// early would otherwise leave the cache's destructor joining a writer that never wakes.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.release(); }
};

// An evict also drops the NVMe writes still queued behind fills (they would bring the
// chunks back a moment later), and waits for the one being written.
TEST(TieredCache, EvictDropsQueuedWritesToo) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(4 * kChunk, 7)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  Gate gate;
  std::atomic<int> admitted{0};
  // The writer stops at the first chunk it admits until the test lets it go on.
  o.admit_chunk = [&](std::string_view, std::string_view, uint64_t) {
    if (admitted.fetch_add(1) == 0) gate.wait();
    return std::optional<uint32_t>(0);
  };
  auto cache = open_cache(b.open(), o);
  OpenOnExit open_on_exit{gate};
  // Into a buffer off 4 KiB alignment: the chunks go through the write queue (an aligned
  // one would be written by the reader itself).
  AlignedBuffer buf = AlignedBuffer::allocate(kChunk + 4096).value();
  for (uint64_t i = 0; i < 4; ++i) {
    auto n = cache->read_full("k", i * kChunk, std::span(buf.data() + 8, kChunk));
    ASSERT_TRUE(n.has_value() && *n == kChunk);
  }
  ASSERT_TRUE(eventually([&] { return admitted.load() == 1; }));
  auto evicting = std::async(std::launch::async, [&] { return cache->evict("k"); });
  EXPECT_EQ(evicting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  gate.release();
  auto n = evicting.get();
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 4u);  // three queued writes and the chunk that was being written
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(admitted.load(), 1);  // the three dropped were never written
  EXPECT_EQ(cache->stats().disk.chunks, 0u);
  EXPECT_EQ(read_range(*cache, "k", 0, kChunk), pattern(kChunk, 7));  // fetched again
}

// The charge tag admit_chunk gives a chunk comes back to chunk_freed when it leaves; a
// chunk with tag 0 never does; at open every chunk found is adopted (defect 11 of the
// hostile test: the cache told the charger only a key, so the charger uncharged chunks it
// had never charged).
TEST(TieredCache, ChargeTagsFollowEachChunk) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("paid", pattern(2 * kChunk, 1)));
  ASSERT_TRUE(b.open()->put("free", pattern(kChunk, 2)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  std::mutex mu;
  std::map<uint32_t, uint64_t> freed, adopted;
  o.admit_chunk = [](std::string_view, std::string_view key, uint64_t) {
    return std::optional<uint32_t>(key == "paid" ? 7 : 0);
  };
  o.chunk_freed = [&](uint32_t tag, uint64_t bytes) {
    std::lock_guard lock(mu);
    freed[tag] += bytes;
  };
  o.chunk_adopted = [&](std::string_view, std::string_view key, uint64_t bytes) {
    std::lock_guard lock(mu);
    adopted[key == "paid" ? 9 : 10] += bytes;
    return key == "paid" ? uint32_t{9} : uint32_t{0};
  };
  {
    auto cache = open_cache(b.open(), o);
    EXPECT_EQ(read_range(*cache, "paid", 0, 2 * kChunk), pattern(2 * kChunk, 1));
    EXPECT_EQ(read_range(*cache, "free", 0, kChunk), pattern(kChunk, 2));
    ASSERT_TRUE(eventually([&] { return cache->stats().disk.chunks == 3; }));
    ASSERT_EQ(cache->evict("free").value(), 1u);
    ASSERT_EQ(cache->evict("paid").value(), 2u);
    std::lock_guard lock(mu);
    EXPECT_EQ(freed.size(), 1u);  // tag 0 is never told
    EXPECT_EQ(freed[7], 2 * kChunk);
    EXPECT_TRUE(adopted.empty());
    EXPECT_EQ(read_range(*cache, "paid", 0, 2 * kChunk), pattern(2 * kChunk, 1));
    EXPECT_EQ(read_range(*cache, "free", 0, kChunk), pattern(kChunk, 2));
    ASSERT_TRUE(eventually([&] { return cache->stats().disk.chunks == 3; }));
  }
  freed.clear();
  auto cache = open_cache(b.open(), o);  // reopened: every chunk found is adopted
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(adopted[9], 2 * kChunk);
    EXPECT_EQ(adopted[10], kChunk);
  }
  ASSERT_EQ(cache->evict("").value(), 3u);
  std::lock_guard lock(mu);
  EXPECT_EQ(freed.size(), 1u);
  EXPECT_EQ(freed[9], 2 * kChunk);  // the tag adopt gave
}

// Without a RAM tier, prefetch waits for the NVMe write queue (under half full) rather
// than fetch chunks the full queue would refuse and the reader would fetch again.
TEST(TieredCache, PrefetchWithoutARamTierWaitsForTheDisk) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(16 * kChunk, 8)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  o.disk_write_queue_bytes = 4 * kChunk;
  o.prefetch_bytes = 16 * kChunk;
  Gate gate;
  o.admit_chunk = [&](std::string_view, std::string_view, uint64_t) {  // a stuck disk
    gate.wait();
    return std::optional<uint32_t>(0);
  };
  auto cache = open_cache(b.open(), o);
  OpenOnExit open_on_exit{gate};
  std::vector<PlannedRead> order = {{"k", 0, 0}};
  ASSERT_TRUE(cache->declare(order).has_value());
  ASSERT_TRUE(eventually([&] { return cache->stats().prefetched >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(cache->stats().prefetched, 2u);  // room for two reserved in the queue's half
  EXPECT_EQ(cache->stats().disk_writes_skipped, 0u);
  gate.release();
  ASSERT_TRUE(eventually([&] { return cache->stats().disk.chunks == 16; }));
  EXPECT_EQ(cache->stats().disk_writes_skipped, 0u);
  EXPECT_EQ(read_range(*cache, "k", 0, 16 * kChunk), pattern(16 * kChunk, 8));
  EXPECT_EQ(cache->stats().misses, 16u);  // nothing fetched twice
}

TEST(TieredCache, AChunkFileRemovedBehindTheCacheIsCachedAgain) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(kChunk, 1)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  auto cache = open_cache(b.open(), o);
  read_range(*cache, "k", 0, kChunk);
  ASSERT_TRUE(eventually([&] { return cache->chunks("").size() == 1; }));  // written
  for (auto& e : fs::recursive_directory_iterator(dir.path() + "/chunks")) {
    if (e.is_regular_file()) fs::remove(e.path());
  }
  EXPECT_EQ(read_range(*cache, "k", 0, kChunk), pattern(kChunk, 1));
  ASSERT_TRUE(
      eventually([&] { return cache->stats().disk.chunks == 1 && cache->stats().misses == 2; }));
  EXPECT_EQ(read_range(*cache, "k", 0, kChunk), pattern(kChunk, 1));
}

TEST(TieredCache, AReplacedObjectIsNeverServedAfterRevalidation) {
  TempDir dir;
  Backing b;
  auto writer = b.open();
  ASSERT_TRUE(writer->put("k", pattern(3 * kChunk, 1)));
  CacheOptions o = small_options(dir.path());
  o.revalidate_after = std::chrono::milliseconds(0);  // every read checks
  auto cache = open_cache(b.open(), o);
  EXPECT_EQ(read_range(*cache, "k", 0, 3 * kChunk), pattern(3 * kChunk, 1));
  ASSERT_TRUE(writer->put("k", pattern(2 * kChunk, 2)));  // behind the cache's back
  EXPECT_EQ(read_range(*cache, "k", 0, 3 * kChunk), pattern(2 * kChunk, 2));
  EXPECT_GT(cache->stats().stale_drops, 0u);
  ASSERT_TRUE(writer->remove("k"));
  std::vector<std::byte> out(10);
  auto r = cache->read("k", 0, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kNotFound);
  EXPECT_TRUE(cache->chunks("k").empty());
}

TEST(TieredCache, WritesAndRemovesThroughTheCacheDropTheCachedCopy) {
  Backing b;
  CacheOptions o = small_options();
  o.revalidate_after = std::chrono::hours(1);  // only the write itself can invalidate
  auto cache = open_cache(b.open(), o);
  ASSERT_TRUE(cache->put("k", pattern(100, 1)));
  EXPECT_EQ(read_range(*cache, "k", 0, 100), pattern(100, 1));
  ASSERT_TRUE(cache->put("k", pattern(100, 2)));
  EXPECT_EQ(read_range(*cache, "k", 0, 100), pattern(100, 2));
  ASSERT_TRUE(cache->remove("k"));
  std::vector<std::byte> out(10);
  EXPECT_FALSE(cache->read("k", 0, out).has_value());
}

TEST(TieredCache, WhatItKnowsOfObjectsStaysWithinItsBound) {
  TempDir dir;
  Backing b;
  auto writer = b.open();
  for (int i = 0; i <= 40; ++i) ASSERT_TRUE(writer->put("k" + std::to_string(i), pattern(100, i)));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* counted = faults.get();
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  o.max_objects = 8;
  o.revalidate_after = std::chrono::hours(1);  // a stat now means the cache had forgotten
  auto cache = open_cache(std::move(faults), o);
  auto read = [&](int i) {
    std::string k = "k" + std::to_string(i);
    EXPECT_EQ(read_range(*cache, k, 0, 100), pattern(100, i)) << k;
  };
  // Objects with a chunk waiting for its NVMe write are kept (the write checks them).
  for (int i = 0; i < 40; ++i) read(i);
  ASSERT_TRUE(eventually([&] { return cache->stats().disk.chunks == 40; }))
      << cache->stats().disk.chunks << " " << cache->stats().disk_writes_skipped;
  read(40);
  EXPECT_LE(cache->stats().objects_known, 8u);
  EXPECT_GE(cache->stats().objects_known, 7u);  // an eighth forgotten at a time
  uint64_t stats = counted->calls(FaultOp::kStat);
  read(40);  // remembered: no stat
  EXPECT_EQ(counted->calls(FaultOp::kStat), stats);
  // Forgotten ones are stat'ed again, but their bytes still come from the NVMe tier.
  for (int i = 0; i <= 40; ++i) {
    read(i);
    EXPECT_LE(cache->stats().objects_known, 8u);
  }
  EXPECT_GT(counted->calls(FaultOp::kStat), stats + 30);
  EXPECT_EQ(cache->stats().misses, 41u);
  o.max_objects = 0;
  auto refused = TieredCache::open(b.open(), o);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), Code::kInvalidArgument);
}

TEST(TieredCache, OfflineTrustsWhatItKnows) {
  Backing b;
  auto writer = b.open();
  ASSERT_TRUE(writer->put("k", pattern(100, 1)));
  CacheOptions o = small_options();
  o.offline = true;
  auto cache = open_cache(b.open(), o);
  EXPECT_EQ(read_range(*cache, "k", 0, 100), pattern(100, 1));
  ASSERT_TRUE(writer->put("k", pattern(100, 2)));
  EXPECT_EQ(read_range(*cache, "k", 0, 100), pattern(100, 1));  // as documented
}

TEST(TieredCache, RestartServesFromNvmeWithoutTheBackingStore) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("a", pattern(5 * kChunk + 7, 1)));
  ASSERT_TRUE(b.open()->put("b", pattern(100, 2)));
  {
    auto cache = open_cache(b.open(), small_options(dir.path()));
    read_range(*cache, "a", 0, 6 * kChunk);
    read_range(*cache, "b", 0, 100);
  }  // closing drains the NVMe writes
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* f = faults.get();
  CacheOptions o = small_options(dir.path());
  o.offline = true;
  auto cache = open_cache(std::move(faults), o);
  EXPECT_EQ(read_range(*cache, "a", 0, 6 * kChunk), pattern(5 * kChunk + 7, 1));
  EXPECT_EQ(read_range(*cache, "b", 0, 100), pattern(100, 2));
  EXPECT_EQ(f->calls(FaultOp::kRead), 0u);
  EXPECT_EQ(f->calls(FaultOp::kStat), 0u);
  EXPECT_EQ(cache->stats().disk.chunks, 7u);
  auto x = cache->locate("a", kChunk + 5);
  ASSERT_TRUE(x.has_value() && x->has_value());
  EXPECT_EQ((*x)->object_offset, kChunk);
  EXPECT_EQ((*x)->length, kChunk);
  EXPECT_TRUE((*x)->fd.valid());
}

// Parts of one chunk asked at once (a loader's slice takes several samples of a chunk) share
// one read of it from the NVMe tier, and a part asked after finds it in RAM. Before, each part
// read and checked the whole chunk (a loader's first epoch from NVMe: 0.44 against 1.52 GiB/s).
TEST(TieredCache, PartsOfAChunkAskedAtOnceAreOneNvmeRead) {
  TempDir dir;
  Backing b;
  const auto bytes = pattern(2 * kChunk, 3);
  ASSERT_TRUE(b.open()->put("a", bytes));
  {
    auto cache = open_cache(b.open(), small_options(dir.path()));
    read_range(*cache, "a", 0, 2 * kChunk);
  }  // closing drains the NVMe writes; the next cache's RAM tier starts empty
  auto cache = open_cache(b.open(), small_options(dir.path()));
  ASSERT_TRUE(cache);
  constexpr size_t kParts = 16;
  constexpr size_t kPart = kChunk / kParts;
  std::vector<std::vector<std::byte>> got(kParts);
  std::atomic<size_t> waiting{kParts};
  std::vector<std::thread> readers;
  for (size_t i = 0; i < kParts; ++i) {
    readers.emplace_back([&, i] {
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      got[i] = read_range(*cache, "a", i * kPart, kPart - 1);  // parts, never the whole
    });
  }
  for (auto& t : readers) t.join();
  for (size_t i = 0; i < kParts; ++i) {
    std::vector<std::byte> want(bytes.begin() + i * kPart, bytes.begin() + (i + 1) * kPart - 1);
    EXPECT_EQ(got[i], want) << "part " << i;
  }
  // Later parts, and the chunk's other half, come from RAM.
  EXPECT_EQ(read_range(*cache, "a", 7, 100),
            std::vector<std::byte>(bytes.begin() + 7, bytes.begin() + 107));
  // One read of the NVMe tier; every part's bytes counted where they were served from.
  CacheStats st = cache->stats();
  EXPECT_EQ(st.disk.hits, 1u);
  EXPECT_EQ(st.misses, 0u);
  EXPECT_EQ(st.ram.hits + st.singleflight_joins, kParts);
  EXPECT_EQ(st.disk.hit_bytes + st.ram.hit_bytes, kParts * (kPart - 1) + 100);
}

// Flips one byte in every chunk on disk (segments hold whole chunks at multiples of kChunk).
void flip_every_chunk(const std::string& dir) {
  for (auto& e : fs::recursive_directory_iterator(dir + "/chunks")) {
    if (!e.is_regular_file()) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t at = 10; at < e.file_size(); at += kChunk) {
      f.seekg(static_cast<std::streamoff>(at));
      char c = 0;
      f.read(&c, 1);
      c ^= 0x20;
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&c, 1);
    }
  }
}

// Whether the file system under `dir` frees punched ranges (the segment layout's tests
// need it; elsewhere every chunk gets a segment of its own).
bool punches_holes(const std::string& dir) {
  std::string probe = dir + "/punch-probe";
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return false;
  bool ok = ::ftruncate(fd, 8192) == 0 &&
            ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0;
  ::close(fd);
  ::unlink(probe.c_str());
  return ok;
}

uint64_t allocated_bytes(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

std::vector<fs::path> segment_files(const std::string& dir) {
  std::vector<fs::path> out;
  for (auto& e : fs::recursive_directory_iterator(dir + "/chunks")) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// An index append cut short (here by RLIMIT_FSIZE, as a full disk would) is cut off the
// log, so the records appended after it survive a restart.
TEST(TieredCache, ATornIndexAppendDoesNotLoseTheRecordsAfterIt) {
  TempDir dir;
  Backing b;
  auto writer = b.open();
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(writer->put("s" + std::to_string(i), pattern(10, i)));
  ASSERT_TRUE(writer->put("torn", pattern(10, 1000)));
  ASSERT_TRUE(writer->put("after", pattern(10, 1001)));
  {
    auto cache = open_cache(b.open(), small_options(dir.path()));
    for (int i = 0; i < 600; ++i) read_range(*cache, "s" + std::to_string(i), 0, 10);
  }
  {
    auto cache = open_cache(b.open(), small_options(dir.path()));  // the log is compacted
    uint64_t log = fs::file_size(dir.path() + "/index.log");
    ASSERT_GT(log, 16u << 10);  // larger than a chunk file, so only the log hits the limit
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit tight = old;
    tight.rlim_cur = log + 20;  // room for 20 bytes of the next record
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
    read_range(*cache, "torn", 0, 10);
    for (int i = 0; i < 500 && cache->stats().disk_writes_skipped == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_EQ(cache->stats().disk_writes_skipped, 1u);
    EXPECT_EQ(fs::file_size(dir.path() + "/index.log"), log);  // the torn part is gone
    read_range(*cache, "after", 0, 10);
  }
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* f = faults.get();
  CacheOptions o = small_options(dir.path());
  o.offline = true;
  auto cache = open_cache(std::move(faults), o);
  EXPECT_EQ(read_range(*cache, "after", 0, 10), pattern(10, 1001));
  EXPECT_EQ(f->calls(FaultOp::kRead), 0u);
  EXPECT_EQ(cache->stats().disk.chunks, 601u);  // 's*' and 'after'; 'torn' had no record
}

// fuzz/disk_log_fuzz: a record naming segment 2^48 - 1 (its file id's top bits all set)
// made the next segment number wrap: a new chunk was admitted at file id 0 and left behind
// in the index, unreadable, and the chunks after it were placed in segments 1, 2, ...,
// over live chunks' bytes. Such a record is now dropped at open, and so is a file whose
// name says such a segment.
TEST(DiskTier, RecordsNamingTheLastSegmentNumbersAreDropped) {
  TempDir dir;
  auto io = io::Context::open({}).value();
  cache::DiskTier::Options o;
  o.directory = dir.path();
  o.capacity = 64 << 20;
  o.chunk_size = kChunk;
  o.io = io;
  alignas(4096) static std::byte bytes[3][4096];
  auto chunk = [&](const std::string& key, int fill) {
    std::memset(bytes[fill], fill + 1, 4096);
    return std::pair{cache::ChunkKey{"mem://b", key, "\"e\"", 0}, std::span(bytes[fill], 4096)};
  };
  auto write = [&](cache::DiskTier& t, const std::string& key, int fill) {
    auto [k, b] = chunk(key, fill);
    return t.write({k, b, cache::checksum(b), b.size(), 0}, false);
  };
  {
    auto t = cache::DiskTier::open(o).value();
    ASSERT_TRUE(write(*t, "live", 0).value());
    ASSERT_TRUE(write(*t, "patched", 1).value());
  }
  // The second record's file id becomes segment 2^48 - 1, page 0, its XXH3 made right.
  std::string log;
  {
    std::ifstream in(dir.path() + "/index.log", std::ios::binary);
    log.assign(std::istreambuf_iterator<char>(in), {});
  }
  size_t pos = 24;
  pos += 16 + (static_cast<uint8_t>(log[pos]) | static_cast<uint8_t>(log[pos + 1]) << 8);
  const uint64_t id = 0xffffffffffff0000ull;
  for (int i = 0; i < 8; ++i) log[pos + 8 + i] = static_cast<char>(id >> (8 * i));
  const size_t len = static_cast<uint8_t>(log[pos]) | static_cast<uint8_t>(log[pos + 1]) << 8;
  const uint64_t sum = cache::checksum(std::as_bytes(std::span(log.data() + pos, 8 + len)));
  for (int i = 0; i < 8; ++i) log[pos + 8 + len + i] = static_cast<char>(sum >> (8 * i));
  std::ofstream(dir.path() + "/index.log", std::ios::binary | std::ios::trunc) << log;
  // A file under that segment's name is debris too.
  fs::create_directories(dir.path() + "/chunks/ff");
  std::ofstream(dir.path() + "/chunks/ff/0000ffffffffffff.seg") << "x";

  auto t = cache::DiskTier::open(o).value();
  EXPECT_EQ(t->open_report().restored, 1u);  // the patched record is no record at all
  EXPECT_EQ(t->open_report().orphans, 2u);   // its old segment, and the file of that name
  EXPECT_FALSE(fs::exists(dir.path() + "/chunks/ff/0000ffffffffffff.seg"));
  for (int i = 1; i < 3; ++i) {
    const std::string key = "new" + std::to_string(i);
    ASSERT_TRUE(write(*t, key, i).value()) << key;
    auto e = t->find(chunk(key, i).first);
    ASSERT_TRUE(e) << key;
    EXPECT_GT(e->file_id >> 16, 1u) << key;  // neither 0 nor the live chunk's segment
  }
  auto live = t->find(chunk("live", 0).first);
  ASSERT_TRUE(live);
  std::vector<std::byte> back(4096);
  ASSERT_TRUE(t->read(*live, back)) << "the live chunk's bytes were overwritten";
  EXPECT_EQ(t->chunk_count(), 3u);  // live, new1, new2: nothing left half-placed
}

TEST(TieredCache, BitFlipsAreDetectedAndRefetched) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("a", pattern(3 * kChunk, 1)));
  { read_range(*open_cache(b.open(), small_options(dir.path())), "a", 0, 3 * kChunk); }
  flip_every_chunk(dir.path());
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  {
    auto cache = open_cache(b.open(), o);
    EXPECT_EQ(read_range(*cache, "a", 0, 3 * kChunk), pattern(3 * kChunk, 1));
    EXPECT_EQ(cache->stats().checksum_failures, 3u);
    EXPECT_EQ(cache->stats().misses, 3u);
  }
  // verify finds flips too, and drops what it finds.
  flip_every_chunk(dir.path());
  auto cache = open_cache(b.open(), o);
  auto rep = cache->verify();
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->chunks, 3u);
  EXPECT_EQ(rep->corrupt.size(), 3u);
  EXPECT_EQ(cache->stats().disk.chunks, 0u);
}

// A part of a chunk with a RAM tier is read through the fill's single flight: a flipped
// bit there is found, counted and refetched as a whole read's is.
TEST(TieredCache, BitFlipsUnderAPartReadAreCountedToo) {
  TempDir dir;
  Backing b;
  const auto whole = pattern(3 * kChunk, 1);
  ASSERT_TRUE(b.open()->put("a", whole));
  { read_range(*open_cache(b.open(), small_options(dir.path())), "a", 0, 3 * kChunk); }
  flip_every_chunk(dir.path());
  auto cache = open_cache(b.open(), small_options(dir.path()));
  EXPECT_EQ(read_range(*cache, "a", kChunk + 5, 100),
            std::vector<std::byte>(whole.begin() + kChunk + 5, whole.begin() + kChunk + 105));
  EXPECT_EQ(cache->stats().checksum_failures, 1u);
  EXPECT_EQ(cache->stats().misses, 1u);
}

TEST(TieredCache, OpenDropsOrphansRecordsWithoutFilesAndATornTail) {
  TempDir dir;
  if (!punches_holes(dir.path())) GTEST_SKIP() << "the file system cannot punch holes";
  Backing b;
  ASSERT_TRUE(b.open()->put("a", pattern(4 * kChunk, 1)));
  ASSERT_TRUE(b.open()->put("b", pattern(100, 2)));
  {
    auto c = open_cache(b.open(), small_options(dir.path()));
    read_range(*c, "a", 0, 4 * kChunk);
    read_range(*c, "b", 0, 100);
  }
  // One segment for a's four chunks, one for b.
  std::vector<fs::path> files = segment_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  const fs::path seg_a = fs::file_size(files[0]) > 100 ? files[0] : files[1];
  const fs::path seg_b = seg_a == files[0] ? files[1] : files[0];
  // An orphan segment, a file of the older one-file-per-chunk layout, a missing segment,
  // bytes after a's last chunk that no record names (a fill cut short), a torn append.
  std::ofstream(dir.path() + "/chunks/00/00000000000000ff.seg") << "no record names this";
  std::ofstream(dir.path() + "/chunks/00/0000000000000001") << "an older layout";
  fs::remove(seg_b);
  {
    std::ofstream tail(seg_a, std::ios::app | std::ios::binary);
    std::vector<char> junk(1 << 20, 'x');
    tail.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  ::sync();
  ASSERT_GE(allocated_bytes(seg_a), (1u << 20) + 4 * kChunk);
  std::ofstream(dir.path() + "/index.log", std::ios::app) << "\x30\x00\x00\x00\x01garbage";
  CacheOptions o = small_options(dir.path());
  auto cache = open_cache(b.open(), o);
  EXPECT_EQ(cache->stats().disk.chunks, 4u);
  EXPECT_FALSE(fs::exists(dir.path() + "/chunks/00/00000000000000ff.seg"));
  EXPECT_FALSE(fs::exists(dir.path() + "/chunks/00/0000000000000001"));
  EXPECT_LT(allocated_bytes(seg_a), 4 * kChunk + (64u << 10));  // the unnamed tail freed
  EXPECT_EQ(read_range(*cache, "a", 0, 4 * kChunk), pattern(4 * kChunk, 1));
  EXPECT_EQ(read_range(*cache, "b", 0, 100), pattern(100, 2));
}

TEST(TieredCache, AFifoOrSymlinkUnderASegmentsNameIsRemovedNotOpened) {
  // Hostile debris in the chunks directory: a FIFO where the next segment will be made (an
  // open for writing would wait forever), a symlink that would send writes elsewhere.
  TempDir dir, elsewhere;
  Backing b;
  ASSERT_TRUE(b.open()->put("a", pattern(3 * kChunk, 1)));
  fs::create_directories(dir.path() + "/chunks/00");
  ASSERT_EQ(::mkfifo((dir.path() + "/chunks/00/0000000000000001.seg").c_str(), 0600), 0);
  std::ofstream(elsewhere.file("victim")) << "keep me";
  fs::create_symlink(elsewhere.file("victim"), dir.path() + "/chunks/00/0000000000000002.seg");
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  auto cache = open_cache(b.open(), o);
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir.path() + "/chunks/00/0000000000000001.seg")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir.path() + "/chunks/00/0000000000000002.seg")));
  AlignedBuffer out = AlignedBuffer::allocate(3 * kChunk).value();
  ASSERT_EQ(cache->read_full("a", 0, std::span<std::byte>(out.data(), 3 * kChunk)).value(),
            3 * kChunk);
  EXPECT_TRUE(std::equal(out.data(), out.data() + 3 * kChunk, pattern(3 * kChunk, 1).begin()));
  EXPECT_EQ(cache->stats().disk.chunks, 3u);
  std::ifstream victim(elsewhere.file("victim"));
  std::string text((std::istreambuf_iterator<char>(victim)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "keep me");
}

TEST(TieredCache, EvictedChunksFreeTheirPagesAndAnEmptySegmentGoes) {
  TempDir dir;
  if (!punches_holes(dir.path())) GTEST_SKIP() << "the file system cannot punch holes";
  Backing b;
  ASSERT_TRUE(b.open()->put("a", pattern(4 * kChunk, 1)));
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 0;
  auto cache = open_cache(b.open(), o);
  // Aligned reads on this thread: written through, into this thread's one lane.
  AlignedBuffer all = AlignedBuffer::allocate(4 * kChunk).value();
  ASSERT_EQ(cache->read_full("a", 0, std::span<std::byte>(all.data(), 4 * kChunk)).value(),
            4 * kChunk);
  ASSERT_EQ(cache->stats().disk.chunks, 4u);
  std::vector<fs::path> files = segment_files(dir.path());
  ASSERT_EQ(files.size(), 1u);  // one object's chunks share a segment
  EXPECT_GE(allocated_bytes(files[0]), 4 * kChunk);
  // Chunk 0 dropped (a bit flip found by a read): its pages are freed, and its refetched
  // copy is appended to the segment (never written over freed pages).
  flip_every_chunk(dir.path());
  ASSERT_TRUE(cache->read_full("a", 0, std::span<std::byte>(all.data(), kChunk)));
  EXPECT_EQ(cache->stats().checksum_failures, 1u);
  ASSERT_EQ(cache->stats().disk.chunks, 4u);
  ::sync();
  EXPECT_EQ(fs::file_size(files[0]), 5 * kChunk);
  EXPECT_LT(allocated_bytes(files[0]), 4 * kChunk + (32u << 10));
  // Everything of `a` evicted: its segments go.
  ASSERT_TRUE(cache->evict("a"));
  EXPECT_EQ(cache->stats().disk.chunks, 0u);
  EXPECT_TRUE(segment_files(dir.path()).empty());
}

TEST(TieredCache, ADirectoryCutAtAnotherChunkSizeIsRefused) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(3 * kChunk, 1)));
  { read_range(*open_cache(b.open(), small_options(dir.path())), "k", 0, 3 * kChunk); }
  CacheOptions o = small_options(dir.path());
  o.chunk_size = 2 * kChunk;  // chunk 1 would be other bytes of the same length
  auto c = TieredCache::open(b.open(), o);
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), Code::kInvalidArgument);
  EXPECT_NE(c.error().message().find("--chunk-size"), std::string::npos) << c.error().message();
  EXPECT_EQ(read_range(*open_cache(b.open(), small_options(dir.path())), "k", 0, 3 * kChunk),
            pattern(3 * kChunk, 1));
}

TEST(TieredCache, ABadIndexHeaderIsAClearError) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::ofstream(dir.path() + "/index.log") << "this is not an index file at all";
  Backing b;
  auto c = TieredCache::open(b.open(), small_options(dir.path()));
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), Code::kCorruption);
  EXPECT_NE(c.error().message().find("index.log"), std::string::npos);
}

TEST(TieredCache, ASecondOwnerOfTheDirectoryIsToldToUseTheDaemon) {
  TempDir dir;
  Backing b;
  auto first = open_cache(b.open(), small_options(dir.path()));
  // OFD locks belong to an open file description, so a second open in this process is
  // refused as another process's would be. (A forked child of this multi-threaded test
  // once hung under ASan tearing down its I/O threads; no fork is needed to prove this.)
  auto c = TieredCache::open(b.open(), small_options(dir.path()));
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), Code::kUnavailable);
  EXPECT_NE(c.error().message().find("sluiced"), std::string::npos) << c.error().message();
}

TEST(TieredCache, BackingFailuresCacheNothing) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(2 * kChunk, 1)));
  auto faults = std::make_unique<FaultInjectionStore>(b.open());
  FaultInjectionStore* f = faults.get();
  auto cache = open_cache(std::move(faults), small_options());
  f->fail_nth(FaultOp::kRead, 1, Code::kUnavailable);
  std::vector<std::byte> out(2 * kChunk);
  auto r = cache->read_full("k", 0, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kUnavailable);
  EXPECT_TRUE(cache->chunks("").empty() || cache->chunks("").size() == 0u);
  EXPECT_EQ(read_range(*cache, "k", 0, 2 * kChunk), pattern(2 * kChunk, 1));
}

// A backing store whose stat claims more bytes than its reads give.
class LyingStat : public store::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<store::ObjectInfo> stat(std::string_view key) override {
    auto s = target().stat(key);
    if (s) s->size += 10;
    return s;
  }
};

TEST(TieredCache, AnObjectShorterThanItsSizeIsCorruptionAndNotCached) {
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(100, 1)));
  auto cache = open_cache(std::make_unique<LyingStat>(b.open()), small_options());
  std::vector<std::byte> out(200);
  auto r = cache->read("k", 0, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorruption);
  EXPECT_NE(r.error().message().find("'k'"), std::string::npos);
  EXPECT_TRUE(cache->chunks("").empty());
}

TEST(TieredCache, LimitsHoldWithSixteenReadersOverThreeTimesTheCache) {
  TempDir dir;
  Backing b;
  CacheOptions o = small_options(dir.path());
  o.ram_bytes = 1 << 20;
  o.disk_bytes = 2 << 20;
  const int kObjects = 24;  // 24 x 4 chunks x 64 KiB = 6 MiB: 3x the NVMe tier
  for (int i = 0; i < kObjects; ++i)
    ASSERT_TRUE(b.open()->put("o" + std::to_string(i), pattern(4 * kChunk, i)));
  auto cache = open_cache(b.open(), o);
  std::atomic<bool> done{false}, over{false}, wrong{false};
  std::thread watch([&] {
    while (!done) {
      CacheStats s = cache->stats();
      if (s.ram.bytes > o.ram_bytes || s.disk.bytes > o.disk_bytes) over = true;
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 16; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 150; ++i) {
        int obj = rng() % kObjects;
        uint64_t off = rng() % (4 * kChunk), len = 1 + rng() % (2 * kChunk);
        std::vector<std::byte> out(len);
        auto n = cache->read_full("o" + std::to_string(obj), off, out);
        auto want = pattern(4 * kChunk, obj);
        uint64_t end = std::min<uint64_t>(4 * kChunk, off + len);
        if (!n || *n != end - off ||
            !std::equal(out.begin(), out.begin() + *n, want.begin() + off)) {
          wrong = true;
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  done = true;
  watch.join();
  EXPECT_FALSE(wrong);
  EXPECT_FALSE(over);
  CacheStats s = cache->stats();
  EXPECT_LE(s.ram.bytes, o.ram_bytes);
  EXPECT_LE(s.disk.bytes, o.disk_bytes);
  EXPECT_GT(s.evictions, 0u);
}

// kill -9 at random moments while a child fills the cache from a file:// store; every
// restart must find a consistent index and serve only correct bytes.
TEST(TieredCache, KillNineDuringFillsNeverServesACorruptChunk) {
  TempDir data, dir;
  const int kObjects = 12;
  {
    auto s = store::open_store("file://" + data.path()).value();
    for (int i = 0; i < kObjects; ++i)
      ASSERT_TRUE(s->put("o" + std::to_string(i), pattern(8 * kChunk + i, i)));
  }
  std::mt19937 rng(99);
  for (int round = 0; round < 12; ++round) {
    pid_t pid = ::fork();
    if (pid == 0) {
      CacheOptions o = small_options(dir.path());
      o.disk_bytes = 3 << 20;  // smaller than the data: evictions and index records churn
      // Odd rounds: no RAM tier and aligned reads from two threads, so chunks are written
      // through from the readers' buffers into two lanes; even rounds: the write queue.
      if (round % 2) o.ram_bytes = 0;
      auto c = TieredCache::open(store::open_store("file://" + data.path()).value(), o);
      if (!c) ::_exit(3);
      auto reader = [&](unsigned seed) {
        std::mt19937 r(seed);
        AlignedBuffer out = AlignedBuffer::allocate(8 * kChunk + kObjects).value();
        for (;;) {
          (void)(*c)->read_full("o" + std::to_string(r() % kObjects), 0,
                                std::span<std::byte>(out.data(), out.size()));
        }
      };
      std::thread other(reader, round + 1000);
      reader(round);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status))
        << "round " << round << " child exited " << WEXITSTATUS(status);

    CacheOptions o = small_options(dir.path());
    o.disk_bytes = 3 << 20;
    o.ram_bytes = 0;
    auto cache = open_cache(store::open_store("file://" + data.path()).value(), o);
    ASSERT_TRUE(cache);
    auto rep = cache->verify();
    ASSERT_TRUE(rep.has_value());
    EXPECT_TRUE(rep->corrupt.empty()) << "round " << round << ": " << rep->corrupt.front();
    for (int i = 0; i < kObjects; ++i) {
      ASSERT_EQ(read_range(*cache, "o" + std::to_string(i), 0, 9 * kChunk),
                pattern(8 * kChunk + i, i))
          << "round " << round;
    }
  }
}

TEST(TieredCache, PinnedChunksStayAndEvictDropsByPrefix) {
  Backing b;
  CacheOptions o = small_options();
  o.ram_bytes = 8 * kChunk;
  for (int i = 0; i < 32; ++i)
    ASSERT_TRUE(b.open()->put("d/" + std::to_string(i), pattern(kChunk, i)));
  ASSERT_TRUE(b.open()->put("keep/x", pattern(kChunk, 100)));
  auto cache = open_cache(b.open(), o);
  ASSERT_TRUE(cache->pin("keep/").has_value());
  read_range(*cache, "keep/x", 0, kChunk);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 32; ++i) read_range(*cache, "d/" + std::to_string(i), 0, kChunk);
  }
  auto kept = cache->chunks("keep/");
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_TRUE(kept[0].pinned && kept[0].in_ram);
  auto n = cache->evict("keep/");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE(cache->chunks("keep/").empty());
}

TEST(TieredCache, ConcurrentPinsLeaveAWholePinsFileAndSubPrefixUnpinsKeepTheParent) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("ds/val/x", pattern(kChunk, 1)));
  {
    auto cache = open_cache(b.open(), small_options(dir.path()));
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 20; ++i) {
          ASSERT_TRUE(cache->pin("p" + std::to_string(t) + "/", i % 2 == 0).has_value());
        }
        ASSERT_TRUE(cache->pin("q" + std::to_string(t) + "/").has_value());
      });
    }
    for (auto& th : threads) th.join();
    // A parent pin, then the child unpinned: the chunk stays pinned by the parent.
    ASSERT_TRUE(cache->pin("ds/").has_value());
    ASSERT_TRUE(cache->pin("ds/val/").has_value());
    read_range(*cache, "ds/val/x", 0, kChunk);
    ASSERT_TRUE(cache->pin("ds/val/", false).has_value());
    auto c = cache->chunks("ds/");
    ASSERT_EQ(c.size(), 1u);
    EXPECT_TRUE(c[0].pinned);
  }
  // The file is whole: every "q" pin and "ds/" survive a reopen, no "p" pin (each ended
  // unpinned) and nothing torn.
  std::ifstream in(dir.path() + "/pins");
  std::string line;
  int q = 0, other = 0;
  bool ds = false;
  while (std::getline(in, line)) {
    std::string prefix = line.substr(line.find('\t') + 1);
    if (prefix.starts_with("q") && prefix.ends_with("/"))
      ++q;
    else if (prefix == "ds/")
      ds = true;
    else
      ++other;
  }
  EXPECT_EQ(q, 16);
  EXPECT_TRUE(ds);
  EXPECT_EQ(other, 0);
  auto reopened = open_cache(b.open(), small_options(dir.path()));
  read_range(*reopened, "ds/val/x", 0, kChunk);
  auto c = reopened->chunks("ds/");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].pinned);
}

TEST(TieredCache, ChunksWhoseRecordCouldNotBeReadBackStayOffTheNvmeTier) {
  TempDir dir;
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(2 * kChunk, 3)));
  CacheOptions o = small_options(dir.path());
  o.store_id = std::string(3000, 's');  // over the longest store id the index reads back
  {
    auto cache = open_cache(b.open(), o);
    EXPECT_EQ(read_range(*cache, "k", 0, 2 * kChunk), pattern(2 * kChunk, 3));
    // Given the time to reach NVMe (milliseconds), they are not written there.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(cache->stats().disk.chunks, 0u);
    cache.reset();  // finishes queued NVMe writes
  }
  auto again = open_cache(b.open(), o);
  EXPECT_EQ(again->stats().disk.chunks, 0u);  // never written, so nothing dropped at open
  EXPECT_EQ(read_range(*again, "k", 0, 2 * kChunk), pattern(2 * kChunk, 3));
}

TEST(TieredCache, StoresSharingADirectoryStayApartAndPinsPersist) {
  TempDir dir;
  Backing a, b;
  ASSERT_TRUE(a.open()->put("k", pattern(100, 1)));
  ASSERT_TRUE(b.open()->put("k", pattern(100, 2)));
  {
    auto ca = open_cache(a.open(), small_options(dir.path()));
    ASSERT_TRUE(ca->pin("k").has_value());
    EXPECT_EQ(read_range(*ca, "k", 0, 100), pattern(100, 1));
  }
  {
    auto cb = open_cache(b.open(), small_options(dir.path()));
    EXPECT_EQ(read_range(*cb, "k", 0, 100), pattern(100, 2));
    EXPECT_EQ(cb->chunks("").size(), 1u);
    EXPECT_EQ(cb->chunks("", true).size(), 2u);
    EXPECT_FALSE(cb->chunks("")[0].pinned);
  }
  auto ca = open_cache(a.open(), small_options(dir.path()));
  auto mine = ca->chunks("");
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_TRUE(mine[0].pinned);
  EXPECT_EQ(mine[0].store, a.open()->uri());
}

TEST(TieredCache, RejectsBadOptionsAndKeys) {
  Backing b;
  CacheOptions o = small_options();
  o.chunk_size = 100;
  auto c = TieredCache::open(b.open(), o);
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), Code::kInvalidArgument);
  auto cache = open_cache(b.open(), small_options());
  std::vector<std::byte> out(1);
  EXPECT_EQ(cache->read("../x", 0, out).error().code(), Code::kInvalidArgument);
  EXPECT_EQ(cache->stat("").error().code(), Code::kInvalidArgument);
}

TEST(TieredCache, ChunksAreKeyedByTheBackingStoresIdentity) {
  // A wrapper whose identity differs from its URI, like an S3 store (URI plus endpoint).
  struct OnServer : store::StoreWrapper {
    using StoreWrapper::StoreWrapper;
    std::string identity() const override { return uri() + " at http://server-a"; }
  };
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(100, 1)));
  auto cache = open_cache(std::make_unique<OnServer>(b.open()), small_options());
  EXPECT_EQ(read_range(*cache, "k", 0, 100), pattern(100, 1));
  std::vector<CachedChunk> c = cache->chunks("k");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].store, "mem://" + b.name + " at http://server-a");
  EXPECT_EQ(cache->identity(), "cache+mem://" + b.name + " at http://server-a");
}

TEST(TieredCache, OpensByUri) {
  register_scheme();
  Backing b;
  ASSERT_TRUE(b.open()->put("k", pattern(100, 1)));
  auto s = store::open_store("cache+mem://" + b.name);
  ASSERT_TRUE(s.has_value()) << s.error().to_string();
  EXPECT_EQ((*s)->uri(), "cache+mem://" + b.name);
  EXPECT_EQ(read_range(**s, "k", 0, 100), pattern(100, 1));
}

// The cache is a Store and keeps the store contract of its backing store: writes,
// overwrites and removals through it are read back at once (RAM only, and RAM and NVMe).
sluice::testing::TempDir& contract_dir() {
  static sluice::testing::TempDir dir;
  return dir;
}
std::unique_ptr<store::Store> cache_over_mem(const std::string& scope, bool disk) {
  auto o = small_options(disk ? contract_dir().file(scope) : "");
  if (!disk) o.disk_bytes = 0;
  return open_cache(store::make_memory_store("contract-cache-" + std::to_string(disk) + scope), o);
}
using sluice::testing::ContractBackend;
using sluice::testing::StoreContract;
INSTANTIATE_TEST_SUITE_P(Cache, StoreContract,
                         ::testing::Values(ContractBackend{"ram_over_mem",
                                                           [](const std::string& scope) {
                                                             return cache_over_mem(scope, false);
                                                           }},
                                           ContractBackend{"ram_and_nvme_over_mem",
                                                           [](const std::string& scope) {
                                                             return cache_over_mem(scope, true);
                                                           }}),
                         sluice::testing::contract_name);

// Capabilities are asked for by type and forwarded by every decorator, so a cache wrapped in
// telemetry and fault injection is still found (where dynamic_cast would see the wrapper).
TEST(TieredCache, CapabilitiesAreFoundThroughDecorators) {
  Backing b;
  auto owned = open_cache(b.open(), small_options());
  ASSERT_TRUE(owned);
  TieredCache* cache = owned.get();
  telemetry::Registry registry;
  auto wrapped = std::make_unique<store::FaultInjectionStore>(
      store::with_telemetry(std::move(owned), registry));
  EXPECT_EQ(wrapped->capability<TieredCache>(), cache);
  EXPECT_EQ(wrapped->capability<ReadAhead>(), static_cast<ReadAhead*>(cache));
  EXPECT_EQ(wrapped->capability<ReadAhead>()->chunk_size(), kChunk);
  EXPECT_EQ(wrapped->capability<store::StoreWrapper>(), nullptr);
  // What the backing store offers is not offered through the cache.
  EXPECT_EQ(b.open()->capability<ReadAhead>(), nullptr);
}

}  // namespace
}  // namespace sluice::cache
