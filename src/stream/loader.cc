// Loader: the epoch order, the consumer's share of it, and the read-ahead; see dataset.h.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <new>
#include <optional>
#include <semaphore>
#include <thread>

#include "core/executor.h"
#include "sluice/cache/read_ahead.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/buffer_pool.h"
#include "sluice/stream/dataset.h"
#include "sluice/stream/tar.h"
#include "sluice/telemetry/registry.h"
#include "stream/backoff.h"

namespace sluice::stream {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A small deterministic generator; the order must not depend on the standard library's
// distributions, which differ between implementations.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t epoch, uint64_t stream, uint64_t tag) {
    for (uint64_t v : {seed, epoch, stream, tag}) {
      state_ ^= v;
      splitmix64(state_);
    }
  }
  uint64_t next() { return splitmix64(state_); }
  uint64_t below(uint64_t n) {  // uniform in [0, n), by rejection
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;)
      if (uint64_t v = next(); v < limit) return v % n;
  }

 private:
  uint64_t state_ = 0x5eed5eed5eed5eedULL;
};

template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

constexpr uint64_t kShardTag = 1, kWindowTag = 2;
// Where a request costs little (a local file, a cache), samples this close still share one.
constexpr uint64_t kNearGap = uint64_t{64} << 10;

// The order of one epoch: units (tar shards, or single samples of a plain-object dataset)
// shuffled, cut into windows of at least `window` samples, each window's samples shuffled.
class EpochPlan {
 public:
  EpochPlan(const Dataset& ds, uint64_t seed, uint64_t epoch, bool shuffled, uint64_t window)
      : ds_(ds), seed_(seed), epoch_(epoch), shuffled_(shuffled) {
    tar_ = ds.format() == Format::kTar;
    uint64_t units = tar_ ? ds.shards().size() : ds.samples();
    units_.resize(units);
    for (uint64_t i = 0; i < units; ++i) units_[i] = static_cast<uint32_t>(i);
    if (shuffled) {
      Rng rng(seed, epoch, 0, kShardTag);
      shuffle(units_, rng);
    }
    uint64_t pos = 0, in_window = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (in_window == 0) {
        starts_.push_back(pos);
        first_unit_.push_back(u);
      }
      uint64_t n = unit_samples(units_[u]);
      pos += n;
      in_window += n;
      if (in_window >= window) in_window = 0;
    }
    starts_.push_back(pos);
    first_unit_.push_back(units_.size());
  }
  uint64_t epoch() const { return epoch_; }
  uint64_t size() const { return starts_.back(); }
  size_t window_of(uint64_t position) const {
    return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), position) -
                               starts_.begin() - 1);
  }
  uint64_t window_start(size_t w) const { return starts_[w]; }
  size_t windows() const { return starts_.size() - 1; }
  // The dataset-wide sample number at `position`.
  uint64_t sample_at(uint64_t position) {
    if (loaded_ == SIZE_MAX || position < starts_[loaded_] || position >= starts_[loaded_ + 1])
      load(window_of(position));
    return order_[position - starts_[loaded_]];
  }

 private:
  uint64_t unit_samples(uint32_t u) const { return tar_ ? ds_.shards()[u].samples : 1; }
  void load(size_t w) {  // sample_at calls it only for a window other than loaded_
    order_.clear();
    for (size_t u = first_unit_[w]; u < first_unit_[w + 1]; ++u) {
      if (!tar_) {
        order_.push_back(units_[u]);
        continue;
      }
      const ShardInfo& s = ds_.shards()[units_[u]];
      for (uint64_t i = 0; i < s.samples; ++i) order_.push_back(s.first + i);
    }
    if (shuffled_) {
      Rng rng(seed_, epoch_, w, kWindowTag);
      shuffle(order_, rng);
    }
    loaded_ = w;
  }
  const Dataset& ds_;
  uint64_t seed_, epoch_;
  bool shuffled_, tar_;
  std::vector<uint32_t> units_;
  std::vector<uint64_t> starts_;    // window w covers positions [starts_[w], starts_[w+1])
  std::vector<size_t> first_unit_;  // and units [first_unit_[w], first_unit_[w+1])
  size_t loaded_ = SIZE_MAX;
  std::vector<uint64_t> order_;  // window loaded_'s samples in order
};

// Limits the reads in flight; halves the limit when the store pushes back, and grows it
// again by one for each limit's worth of successes (additive increase).
class ReadGate {
 public:
  explicit ReadGate(unsigned max) : max_(max), limit_(max) {}
  void acquire() {
    UniqueLock lock(mu_);
    cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return running_ < limit_; });
    ++running_;
  }
  void release(bool throttled) {
    MutexLock lock(mu_);
    --running_;
    if (throttled) {
      limit_ = std::max(1u, limit_ / 2);
      successes_ = 0;
    } else if (++successes_ >= limit_ && limit_ < max_) {
      ++limit_;
      successes_ = 0;
    }
    cv_.notify_all();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  const unsigned max_;
  unsigned limit_ SLUICE_GUARDED_BY(mu_);
  unsigned running_ SLUICE_GUARDED_BY(mu_) = 0;
  unsigned successes_ SLUICE_GUARDED_BY(mu_) = 0;
};

// A run of samples for this consumer, read and parsed.
struct Slice {
  uint64_t epoch = 0;
  std::vector<Sample> samples;
  uint64_t bytes = 0;  // of its buffer
  std::optional<Error> error;
  bool end = false;  // nothing follows
};

// A part of a gathered read: `length` bytes of the object from `offset`, to `buffer_offset`.
struct Piece {
  uint64_t offset, buffer_offset, length;
};

// One read of a slice: `length` bytes of a shard from `offset`, into the slice's buffer at
// `buffer_offset`; or, with `pieces`, into scratch memory, from which the pieces are copied.
struct Range {
  uint32_t shard;
  uint64_t offset, length, buffer_offset;
  std::vector<Piece> pieces;
};

}  // namespace

struct Loader::Impl {
  std::shared_ptr<const Dataset> ds;
  LoaderOptions o;
  uint64_t block = 1;  // samples a worker takes at a time (LoaderOptions::block)
  uint64_t first_epoch = 0, end_epoch = UINT64_MAX, start = 0;  // start: of first_epoch
  uint64_t window = 0;  // the shuffle window in effect; 0: no shuffle
  std::optional<Error> bad_options;
  Clock::time_point created = Clock::now();
  cache::ReadAhead* cache = nullptr;  // the dataset's store, where it takes declarations
  bool cheap_requests = false;        // the store's requests cost little (Store::cheap_requests)

  // The consumer's side (the caller's thread).
  std::shared_ptr<Slice> current;
  size_t current_i = 0;
  bool first_delivered = false;
  // What has been consumed, for state() (which may be called from another thread than
  // next()).
  mutable Mutex state_mu;
  uint64_t token_epoch SLUICE_GUARDED_BY(state_mu) = 0;
  uint64_t token_position SLUICE_GUARDED_BY(state_mu) = 0;

  // The fetcher's side.
  Mutex mu;
  CondVar cv;
  std::deque<std::shared_ptr<Slice>> ready SLUICE_GUARDED_BY(mu);
  uint64_t queued_bytes SLUICE_GUARDED_BY(mu) = 0;
  bool stopping SLUICE_GUARDED_BY(mu) = false;
  ReadGate gate;
  std::unique_ptr<Executor> io;
  std::thread fetcher;
  // Slice buffers, reused once the consumer drops a slice's samples: a fresh allocation is
  // zeroed by the kernel on first touch, which cost a warm epoch most of its CPU. Up to
  // the memory budget is kept idle.
  std::shared_ptr<BufferRecycler> buffers;
  // Gathered reads in progress at once, each holding a chunk's scratch memory (set with
  // the cache, where gathered reads are used).
  std::optional<std::counting_semaphore<>> gather_slots;

  struct Counters {  // relaxed: statistics, only reported (stats()); they order nothing
    std::atomic<uint64_t> samples{0}, bytes{0}, requests{0}, read_bytes{0}, throttled{0},
        skipped{0}, stall_ns{0}, first_ns{0}, window_parts{0};
  } counts;
  telemetry::Counter *m_samples = nullptr, *m_bytes = nullptr, *m_stall_us = nullptr,
                     *m_throttled = nullptr, *m_requests = nullptr;
  telemetry::Gauge* m_first_ms = nullptr;

  Impl(std::shared_ptr<const Dataset> d, LoaderOptions opts)
      : ds(std::move(d)),
        o(std::move(opts)),
        gate(std::clamp(o.inflight, 1u, 1024u)),
        buffers(BufferRecycler::create(o.memory_bytes)) {}

  // This consumer's i-th position of an epoch read from `from`. Rank r's positions are
  // from + r + world * j (its stream, j = 0, 1, ...); the rank's workers take that stream in
  // blocks of `block`, round-robin: worker w the blocks w, w + workers, ...
  uint64_t position(uint64_t from, uint64_t i) const {
    uint64_t q = i / block, t = i % block;
    uint64_t j = (q * o.workers + o.worker) * block + t;
    return from + o.rank + uint64_t{o.world} * j;
  }
  // How many positions of an epoch (from `from`) this consumer reads.
  uint64_t share(uint64_t from) const {
    uint64_t n = ds->samples();
    if (from + o.rank >= n) return 0;
    uint64_t stream = (n - from - o.rank + o.world - 1) / o.world;  // the rank's
    uint64_t blocks = (stream + block - 1) / block;
    if (blocks <= o.worker) return 0;
    uint64_t mine = (blocks - o.worker + o.workers - 1) / o.workers;
    uint64_t count = mine * block;
    if ((blocks - 1) % o.workers == o.worker && stream % block) count -= block - stream % block;
    return count;
  }
  // The first i whose position is at least p (share(from) when there is none).
  uint64_t first_at_or_after(uint64_t from, uint64_t p) const {
    uint64_t lo = 0, hi = share(from);
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (position(from, mid) < p)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }

  Status validate() {
    if (o.world == 0 || o.rank >= o.world)
      return fail(Code::kInvalidArgument, "loader: rank " + std::to_string(o.rank) +
                                              " is not below world " + std::to_string(o.world));
    if (o.workers == 0 || o.worker >= o.workers)
      return fail(Code::kInvalidArgument, "loader: worker " + std::to_string(o.worker) +
                                              " is not below workers " + std::to_string(o.workers));
    if (o.memory_bytes < (uint64_t{1} << 20))
      return fail(Code::kInvalidArgument, "loader: memory budget below 1 MiB");
    window = Loader::shuffle_window_for(*ds, o);
    if (o.block == 0) return fail(Code::kInvalidArgument, "loader: a block of 0 samples");
    block = o.block;
    first_epoch = o.epoch;
    if (o.epochs && o.epochs > UINT64_MAX - o.epoch)
      return fail(Code::kInvalidArgument, "loader: epochs " + std::to_string(o.epoch) + " + " +
                                              std::to_string(o.epochs) + " overflow");
    if (o.epochs) end_epoch = o.epoch + o.epochs;
    if (!o.resume.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto p, parse_token(o.resume));
      if (p.fingerprint != ds->fingerprint() || p.samples != ds->samples())
        return fail(Code::kInvalidArgument,
                    "loader: the resume token was made for another dataset (" +
                        std::to_string(p.samples) + " samples; this one has " +
                        std::to_string(ds->samples()) + ", or its shards changed)");
      // Tokens before v3 carry only the layout: they are checked as far as they can be.
      if (p.version >= 3 && p.identity != ds->identity())
        return fail(Code::kInvalidArgument,
                    "loader: the resume token was made for another dataset with the same "
                    "shards, sizes and sample counts: a shard's etag or sample table differs "
                    "(the dataset was regenerated, or the token is another dataset's)");
      if (p.seed != o.seed)
        return fail(Code::kInvalidArgument, "loader: the resume token was made with seed " +
                                                std::to_string(p.seed) + ", not " +
                                                std::to_string(o.seed));
      if (p.epoch < o.epoch || p.epoch > end_epoch)
        return fail(Code::kInvalidArgument, "loader: the resume token's epoch " +
                                                std::to_string(p.epoch) +
                                                " is outside the epochs asked for");
      if ((p.window == 0) != (window == 0) || (o.shuffle_window && p.window != window))
        return fail(Code::kInvalidArgument,
                    "loader: the resume token was made with " +
                        (p.window ? "shuffle window " + std::to_string(p.window) : "no shuffle") +
                        ", not " +
                        (window ? "shuffle window " + std::to_string(window) : "no shuffle"));
      // A v1 token has no checksum: one cut short in its last field (the window) would
      // still parse, so it must name the window this loader would use itself.
      if (p.version == 1 && p.window != window)
        return fail(Code::kInvalidArgument,
                    "loader: the v1 resume token names shuffle window " + std::to_string(p.window) +
                        ", this read uses " + std::to_string(window) + ": pass --shuffle-window " +
                        std::to_string(p.window) + " if the token is whole");
      window = p.window;  // an automatic window follows the token's
      first_epoch = p.epoch;
      start = p.position;
    }
    MutexLock lock(state_mu);  // no other thread yet: for the analysis
    token_epoch = first_epoch;
    token_position = start;
    return ok();
  }

  // ---- reads ----------------------------------------------------------------------------

  Status read_range(const std::string& key, uint64_t offset, std::span<std::byte> dst,
                    const store::ReadOptions& ro) {
    auto got = retry_unavailable(
        [&] {
          gate.acquire();
          auto r = ds->store().read_full(key, offset, dst, ro);
          gate.release(!r && r.error().code() == Code::kUnavailable);
          counts.requests.fetch_add(1, std::memory_order_relaxed);
          if (m_requests) m_requests->add();
          return r;
        },
        [&] {
          counts.throttled.fetch_add(1, std::memory_order_relaxed);
          if (m_throttled) m_throttled->add();
        });
    if (!got) {
      std::string context = "dataset object " + key;
      if (got.error().code() == Code::kConflict)
        context +=
            " (it changed since the dataset was opened: open it again; sluice dataset "
            "read --refresh)";
      return std::unexpected(got.error().with_context(context));
    }
    counts.read_bytes.fetch_add(*got, std::memory_order_relaxed);
    if (*got != dst.size())
      return fail(Code::kCorruption, "dataset object " + key + ": " + std::to_string(dst.size()) +
                                         " bytes at offset " + std::to_string(offset) +
                                         " expected, " + std::to_string(*got) +
                                         " read (it shrank)");
    return ok();
  }

  // Runs the reads of `ranges` on the I/O threads and waits for all of them.
  Status read_all(const std::vector<Range>& ranges, std::byte* buffer) {
    Mutex done_mu;
    CondVar done_cv;
    size_t left = ranges.size();
    std::optional<Error> first;
    for (const Range& range : ranges) {
      io->post([&, r = &range] {
        const ShardInfo& s = ds->shards()[r->shard];
        store::ReadOptions ro{.if_match = s.etag, .object_size = s.size};
        auto st = r->pieces.empty()
                      ? read_range(s.key, r->offset, {buffer + r->buffer_offset, r->length}, ro)
                      : read_gathered(s.key, *r, buffer, ro);
        MutexLock lock(done_mu);
        if (!st && !first) first = st.error();
        if (--left == 0) done_cv.notify_all();
      });
    }
    UniqueLock lock(done_mu);
    done_cv.wait(lock, [&] { return left == 0; });
    if (first) return std::unexpected(*first);
    return ok();
  }

  // `r`'s chunk read whole into scratch memory and its pieces copied into the slice: from a
  // cache that keeps no chunks, each part asked of a chunk costs a read and a check of the
  // whole chunk.
  Status read_gathered(const std::string& key, const Range& r, std::byte* buffer,
                       const store::ReadOptions& ro) {
    gather_slots->acquire();
    struct Release {
      std::counting_semaphore<>& slots;
      ~Release() { slots.release(); }
    } release{*gather_slots};
    auto scratch = buffers->acquire(r.length);
    if (!scratch)
      return fail(Code::kNoSpace, "loader: cannot allocate " + std::to_string(r.length) +
                                      " bytes to read " + key + " at offset " +
                                      std::to_string(r.offset));
    SLUICE_RETURN_IF_ERROR(read_range(key, r.offset, {(*scratch)->data(), r.length}, ro));
    for (const Piece& p : r.pieces)
      std::memcpy(buffer + p.buffer_offset, (*scratch)->data() + (p.offset - r.offset), p.length);
    return ok();
  }

  // A sample of a slice, in the order of the places in the slice's buffer: `i`, its index
  // in the slice's order; `sample`, its dataset-wide number; `where`, its place.
  struct Placed {
    size_t i;
    uint64_t sample, where;
  };

  // `samples` (dataset-wide numbers) in the order of their places in the dataset, each with
  // its index in `samples` (`where` left 0).
  std::vector<Placed> in_place_order(const std::vector<uint64_t>& samples) const {
    std::vector<Placed> placed(samples.size());
    if (samples.empty()) return placed;
    auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
    if (ds->numbered_in_place() && *hi - *lo < uint64_t{4} * samples.size()) {
      // Sample numbers go by (shard, offset) and, a window's whole shards shuffled, fill
      // most of their range: each index goes straight to its number's place, no sort.
      std::vector<size_t> at(static_cast<size_t>(*hi - *lo + 1), SIZE_MAX);
      for (size_t i = 0; i < samples.size(); ++i) at[samples[i] - *lo] = i;
      size_t n = 0;
      for (size_t j = 0; j < at.size() && n < placed.size(); ++j)
        if (at[j] != SIZE_MAX) placed[n++] = {at[j], *lo + j, 0};
      if (n == samples.size()) return placed;
      // A number twice (in no plan of ours): sorted below like any other.
    }
    for (size_t i = 0; i < samples.size(); ++i) placed[i] = {i, samples[i], 0};
    if (ds->numbered_in_place()) {
      std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
        return std::tie(a.sample, a.i) < std::tie(b.sample, b.i);
      });
    } else {
      std::sort(placed.begin(), placed.end(), [&](const Placed& a, const Placed& b) {
        const auto &x = ds->sample(a.sample), &y = ds->sample(b.sample);
        return std::tie(x.shard, x.offset, a.i) < std::tie(y.shard, y.offset, b.i);
      });
    }
    return placed;
  }

  // The requests that read `samples` (dataset-wide numbers): for tar, ranges of one shard
  // closer than coalesce_gap merge (up to 4 MiB a request, so a slice reads in parallel). The
  // samples go to `placed` in the order of their places in the buffer, with those places.
  std::vector<Range> plan_reads(const std::vector<uint64_t>& samples, std::vector<Placed>& placed,
                                uint64_t& total) const {
    std::vector<Range> ranges;
    total = 0;
    if (ds->format() == Format::kObjects) {
      placed.resize(samples.size());
      for (size_t i = 0; i < samples.size(); ++i) {
        const auto& ref = ds->sample(samples[i]);
        placed[i] = {i, samples[i], total};
        for (uint32_t f = 0; f < ref.objects; ++f) {
          uint64_t size = ds->shards()[ref.shard + f].size;
          ranges.push_back(Range{ref.shard + f, 0, size, total});
          total += size;
        }
      }
      return ranges;
    }
    // Runs: samples of one shard that lie closer than the gap, read into one contiguous
    // piece of the buffer. A remote store's request costs as much as reading the gap; a
    // local file's or a cache's costs little, so there only near neighbours merge (tar
    // headers between a slice's samples): a DataLoader worker takes a few of every chunk's
    // samples, and a 1 MiB gap read every worker the whole chunk (3.6x the bytes with 4).
    const uint64_t chunk = cache ? cache->chunk_size() : 0;
    const uint64_t gap =
        chunk || cheap_requests ? std::min(o.coalesce_gap, kNearGap) : o.coalesce_gap;
    placed = in_place_order(samples);
    struct Run {
      uint32_t shard;
      uint64_t begin, end;
      size_t first, last;   // in placed
      bool gather = false;  // read by whole chunks into scratch memory (read_gathered)
    };
    std::vector<Run> runs;
    for (size_t n = 0; n < placed.size(); ++n) {
      const auto& ref = ds->sample(placed[n].sample);
      Run* r = runs.empty() ? nullptr : &runs.back();
      if (r && r->shard == ref.shard && ref.offset >= r->end && ref.offset - r->end <= gap) {
        r->end = ref.offset + ref.length;
        r->last = n;
      } else {
        runs.push_back(Run{ref.shard, ref.offset, ref.offset + ref.length, n, n});
      }
    }
    if (chunk) {
      // Through a cache, runs whose chunks this slice mostly reads become whole chunks, one
      // request for neighbours up to 16 MiB: a whole chunk is handed off by sluiced or read
      // once from the NVMe tier and checked, and a cold miss is one large backing read (0.95x
      // and 0.89x sluice cp in two 5-round runs, against 0.76x twice with single-chunk
      // requests). Where the slice reads less than half of the chunks' bytes (one of several
      // DataLoader workers, or a part of a window larger than a slice) its runs stay as they
      // are: the cache checks a chunk once as it comes into its RAM tier, and serves parts of
      // it from there. A cache without a RAM tier reads and checks the whole chunk for every
      // part asked of it, so there each chunk is read once and the runs copied out of it
      // (a warm epoch of 256 MiB shards at the default budget read 0.21 GiB/s before, 0.75 now).
      const bool gather = gather_slots.has_value();
      std::vector<Run> merged;
      size_t group_first = 0;
      uint64_t used = 0;
      auto close_group = [&](size_t end_run) {
        Run& g = merged.back();
        if (used * 2 >= g.end - g.begin) return;
        merged.pop_back();
        for (size_t i = group_first; i < end_run; ++i) {
          merged.push_back(runs[i]);
          merged.back().gather = gather;
        }
      };
      for (size_t i = 0; i < runs.size(); ++i) {
        const Run& r = runs[i];
        uint64_t size = ds->shards()[r.shard].size;
        Run w{r.shard, r.begin / chunk * chunk, std::min(size, (r.end + chunk - 1) / chunk * chunk),
              r.first, r.last};
        Run* g = merged.empty() ? nullptr : &merged.back();
        if (g && g->shard == w.shard && w.begin <= g->end) {
          g->end = std::max(g->end, w.end);
          g->last = w.last;
          used += r.end - r.begin;
          continue;
        }
        if (g) close_group(i);
        merged.push_back(w);
        group_first = i;
        used = r.end - r.begin;
      }
      if (!merged.empty()) close_group(runs.size());
      runs = std::move(merged);
    }
    const uint64_t max_request =
        chunk ? std::max<uint64_t>(chunk, uint64_t{16} << 20) / chunk * chunk : uint64_t{4} << 20;
    for (auto& r : runs) {
      for (size_t n = r.first; n <= r.last; ++n)
        placed[n].where = total + (ds->sample(placed[n].sample).offset - r.begin);
      if (r.gather) {
        // A request per chunk, shared by the runs in it (runs go by offset, so a chunk's
        // come one after another).
        const uint64_t size = ds->shards()[r.shard].size;
        for (uint64_t off = r.begin; off < r.end;) {
          uint64_t begin = off / chunk * chunk, end = std::min(size, begin + chunk);
          uint64_t next = std::min(r.end, end);
          Piece piece{off, total + (off - r.begin), next - off};
          Range* last = ranges.empty() ? nullptr : &ranges.back();
          if (last && !last->pieces.empty() && last->shard == r.shard && last->offset == begin)
            last->pieces.push_back(piece);
          else
            ranges.push_back(Range{r.shard, begin, end - begin, 0, {piece}});
          off = next;
        }
      } else {
        // Through a cache, pieces end on multiples of max_request in the object: a run of
        // whole chunks then never shares a chunk between two of its requests.
        for (uint64_t off = r.begin; off < r.end;) {
          uint64_t next = chunk ? (off / max_request + 1) * max_request : off + max_request;
          next = std::min(r.end, next);
          ranges.push_back(Range{r.shard, off, next - off, total + (off - r.begin)});
          off = next;
        }
      }
      // Each run starts on an O_DIRECT boundary of the buffer, even after a shard's short
      // last chunk: an unaligned destination is read through a bounce buffer and copied.
      total += (r.end - r.begin + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    }
    return ranges;
  }

  // Reads and parses the samples at `positions` of `plan`'s epoch.
  std::shared_ptr<Slice> fetch(uint64_t epoch, const std::vector<uint64_t>& positions,
                               const std::vector<uint64_t>& samples) {
    auto slice = std::make_shared<Slice>();
    slice->epoch = epoch;
    // The budget holds every sample in flight, so one that alone is larger can never be
    // read within it (and its size may be a lie of a damaged index): an error, not an abort.
    for (uint64_t n : samples) {
      const auto& ref = ds->sample(n);
      if (ref.length > o.memory_bytes) {
        slice->error = Error(
            Code::kNoSpace, "sample '" + ds->sample_key(n) + "' in " + ds->shards()[ref.shard].key +
                                " at offset " + std::to_string(ref.offset) + " is " +
                                std::to_string(ref.length) +
                                " bytes, more than the loader's memory budget of " +
                                std::to_string(o.memory_bytes) + " bytes (raise --memory)");
        return slice;
      }
    }
    std::vector<Placed> placed;
    uint64_t total = 0;
    auto ranges = plan_reads(samples, placed, total);
    // Sizes come from the listing and the indexes, which may lie: an allocation that cannot
    // be made is an error naming the sizes, not an abort. Aligned for O_DIRECT: chunk-aligned
    // requests land on aligned addresses, so a cache's NVMe tier, or sluiced's handed-off
    // chunks, are read straight into the slice rather than through a bounce buffer.
    auto aligned =
        total > (uint64_t{1} << 48)
            ? Result<std::shared_ptr<AlignedBuffer>>(std::unexpected(Error(Code::kNoSpace, "")))
            : buffers->acquire(total);
    if (!aligned) {
      slice->error = Error(Code::kNoSpace, "loader: cannot allocate " + std::to_string(total) +
                                               " bytes for " + std::to_string(samples.size()) +
                                               " samples (sizes from the listing or an index)");
      return slice;
    }
    // What the slice's samples hold: the buffer, and every sample's fields in one list.
    struct Held {
      std::shared_ptr<AlignedBuffer> buffer;
      std::vector<Field> fields;
    };
    auto held = std::make_shared<Held>();
    held->buffer = std::move(*aligned);
    std::byte* const buffer = held->buffer->data();
    slice->bytes = total;
    if (auto st = read_all(ranges, buffer); !st) {
      slice->error = st.error();
      return slice;
    }
    std::shared_ptr<const void> hold(held, held.get());
    // Parsed in the order of the samples' places in the buffer, each into its place in the
    // slice's order: the buffer, the index and its keys are then walked front to back, not
    // at random (a slice of small samples spans tens of MiB; at random, nearly every header
    // was a cache and TLB miss).
    slice->samples.resize(samples.size());
    // Room for every field: the objects format knows how many; a tar sample gets room for as
    // many as the first one has, but never more than the buffer has headers for (a field
    // each), so a shard that lies costs no more than its bytes. Where the list grows after
    // all, the samples are pointed into it again at the end.
    const bool tar = ds->format() == Format::kTar;
    std::vector<Field>& fields = held->fields;
    if (!tar) {
      uint64_t objects = 0;
      for (const Placed& p : placed) objects += ds->sample(p.sample).objects;
      fields.reserve(objects);
    }
    std::vector<size_t> first_field(samples.size());  // in `fields`, by the slice's order
    const Field* pointed_into = nullptr;
    bool moved = false;
    auto point = [&](Sample& s, size_t first) {
      if (tar && first == 0 && !fields.empty())
        fields.reserve(std::min<uint64_t>(samples.size() * fields.size(), total / kTarBlock));
      moved = moved || (pointed_into && fields.data() != pointed_into);
      pointed_into = fields.data();
      s.fields = std::span<const Field>(fields).subspan(first);
    };
    std::vector<bool> skipped;
    TarSample parsed;
    constexpr size_t kAhead = 8;  // samples: about a memory latency's worth of parsing
    for (size_t k = 0; k < placed.size(); ++k) {
      const size_t i = placed[k].i;
      if (k + kAhead < placed.size()) {
        // Small samples: the next header (8 cache lines), Sample slot and position are each
        // a miss otherwise.
        const Placed& ahead = placed[k + kAhead];
        if (tar)
          for (size_t line = 0; line < kTarBlock; line += 64)
            __builtin_prefetch(buffer + ahead.where + line);
        const auto* slot = reinterpret_cast<const char*>(&slice->samples[ahead.i]);
        __builtin_prefetch(slot, 1);
        __builtin_prefetch(slot + sizeof(Sample) - 1, 1);  // 72 bytes: two lines
        __builtin_prefetch(&positions[ahead.i]);
      }
      const auto& ref = ds->sample(placed[k].sample);
      Sample& s = slice->samples[i];
      s.key = ds->sample_key(placed[k].sample);
      s.epoch = epoch;
      s.position = positions[i];
      s.index = placed[k].sample;
      s.hold = hold;
      first_field[i] = fields.size();
      std::byte* base = buffer + placed[k].where;
      if (!tar) {
        uint64_t off = 0;
        std::string key, field;
        for (uint32_t f = 0; f < ref.objects; ++f) {
          const ShardInfo& obj = ds->shards()[ref.shard + f];
          std::string_view rel = std::string_view(obj.key).substr(ds->prefix().size());
          if (!split_sample_name(rel, key, field)) field = "data";
          fields.push_back(Field{field, {base + off, obj.size}});
          off += obj.size;
        }
        point(s, first_field[i]);
        continue;
      }
      const ShardInfo& shard = ds->shards()[ref.shard];
      auto st = parse_tar_sample({base, ref.length}, ref.offset, shard.key, parsed);
      if (st && parsed.key != s.key)
        st = fail(Code::kCorruption, "shard " + shard.key + " at offset " +
                                         std::to_string(ref.offset) + ": sample '" + parsed.key +
                                         "' where the index has '" + std::string(s.key) + "'");
      if (!st) {
        if (o.skip_corrupt) {
          counts.skipped.fetch_add(1, std::memory_order_relaxed);
          if (skipped.empty()) skipped.resize(samples.size());
          skipped[i] = true;
          continue;
        }
        slice->error = st.error();
        slice->samples.clear();
        return slice;
      }
      for (const auto& f : parsed.fields)
        fields.push_back(Field{f.name, {base + (f.offset - ref.offset), f.size}});
      point(s, first_field[i]);
    }
    if (moved)
      for (size_t i = 0; i < slice->samples.size(); ++i)
        slice->samples[i].fields =
            std::span<const Field>(fields).subspan(first_field[i], slice->samples[i].fields.size());
    if (!skipped.empty()) {
      size_t kept = 0;
      for (size_t i = 0; i < slice->samples.size(); ++i)
        if (!skipped[i]) slice->samples[kept++] = std::move(slice->samples[i]);
      slice->samples.resize(kept);
    }
    return slice;
  }

  // Tells the cache which ranges this consumer reads in window `w` of `plan`.
  void declare_window(EpochPlan& plan, size_t w, uint64_t from) {
    if (!cache || w >= plan.windows()) return;
    uint64_t lo = std::max(plan.window_start(w), from), hi = plan.window_start(w + 1);
    std::vector<uint64_t> samples;
    const uint64_t count = share(from);
    for (uint64_t i = first_at_or_after(from, lo); i < count; ++i) {
      uint64_t p = position(from, i);
      if (p >= hi) break;
      samples.push_back(plan.sample_at(p));
    }
    std::vector<Placed> placed;
    uint64_t total = 0;
    auto ranges = plan_reads(samples, placed, total);
    std::vector<cache::PlannedRead> order;
    order.reserve(ranges.size());
    for (const auto& r : ranges)
      order.push_back({ds->shards()[r.shard].key, r.offset, std::max<uint64_t>(r.length, 1)});
    (void)cache->declare(order);  // advice only: a failure costs prefetch, nothing else
  }

  void push(std::shared_ptr<Slice> slice) {
    MutexLock lock(mu);
    queued_bytes += slice->bytes;
    ready.push_back(std::move(slice));
    cv.notify_all();
  }

  // A slice planned and not yet read: its positions and their samples.
  struct Planned {
    uint64_t epoch = 0, bytes = 0;
    std::vector<uint64_t> positions, samples;
  };

  // A slice being read on a thread of its own, so the next one's reads overlap the tail
  // of this one's.
  struct Flight {
    std::thread thread;
    uint64_t bytes = 0;
    // Guarded by the loader's mu, which an annotation here cannot name (it would read as
    // the flight's own).
    std::shared_ptr<Slice> result;
    bool done = false;
  };

  // The fetcher's plan: where the next slice starts.
  struct Cursor {
    uint64_t epoch = 0, from = 0, k = 0;
    std::unique_ptr<EpochPlan> plan;
    size_t declared = SIZE_MAX;
    size_t cut = SIZE_MAX;  // the window last cut into parts, in this epoch's plan
  };

  // The next slice: whole windows (this consumer's positions in them) while they fit in
  // slice_bytes, so each chunk of a window is read once;
  // a window larger than that is cut into about equal parts, each read on its own.
  // nullopt once the last epoch is planned.
  std::optional<Planned> plan_slice(Cursor& c, uint64_t slice_bytes) {
    while (true) {
      if (c.epoch >= end_epoch) return std::nullopt;
      uint64_t count = share(c.from);
      if (c.k < count) break;
      ++c.epoch;
      c.from = 0;
      c.k = 0;
      c.plan.reset();
      c.cut = SIZE_MAX;
    }
    if (!c.plan) {
      c.plan = std::make_unique<EpochPlan>(*ds, o.seed, c.epoch, window != 0,
                                           std::max<uint64_t>(window, 1));
      c.declared = SIZE_MAX;
    }
    EpochPlan& plan = *c.plan;
    const uint64_t count = share(c.from);
    Planned next{.epoch = c.epoch};
    bool part = false;  // of a window cut into parts (the first slice, cut by design, aside)
    for (uint64_t j = c.k; j < count;) {
      const size_t w = plan.window_of(position(c.from, j));
      uint64_t end = plan.window_start(w + 1);
      part = part || w == c.cut;
      uint64_t n = 0, window_bytes = 0;  // this consumer's samples in the window, from j
      constexpr uint64_t kAhead = 16;    // the samples' sizes lie at random in the index
      for (uint64_t p; j + n < count && (p = position(c.from, j + n)) < end; ++n) {
        if (uint64_t a; j + n + kAhead < count && (a = position(c.from, j + n + kAhead)) < end)
          __builtin_prefetch(&ds->sample(plan.sample_at(a)));
        window_bytes += ds->sample(plan.sample_at(p)).length;
      }
      if (!next.positions.empty() && next.bytes + window_bytes > slice_bytes) break;
      if (window_bytes > slice_bytes) {
        if (slice_bytes >= o.memory_bytes / 4) {
          c.cut = w;
          part = true;
        }
        uint64_t parts = (window_bytes + slice_bytes - 1) / slice_bytes;
        n = std::max<uint64_t>(1, n / parts);
        window_bytes = 0;
        for (uint64_t i = 0; i < n; ++i)
          window_bytes += ds->sample(plan.sample_at(position(c.from, j + i))).length;
      }
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t p = position(c.from, j + i);
        next.positions.push_back(p);
        next.samples.push_back(plan.sample_at(p));
      }
      next.bytes += window_bytes;
      j += n;
      if (window_bytes > slice_bytes / 2) break;  // a part of a large window: alone
    }
    if (part) counts.window_parts.fetch_add(1, std::memory_order_relaxed);
    c.k += next.positions.size();
    size_t w = plan.window_of(next.positions.front());
    if (w != c.declared) {
      declare_window(plan, w + 1, c.from);
      c.declared = w;
    }
    return next;
  }

  // Up to two slices are read at once, each at most a quarter of the budget; with the one
  // the caller holds, at most three quarters of it are taken.
  static constexpr size_t kFlights = 2;

  void run_fetcher() {
    const uint64_t slice_bytes = std::max<uint64_t>(o.memory_bytes / 4, 1);
    // The first slice is about one block and is read alone: the first batch then waits for
    // its own chunks only, not for the read-ahead's. (4 DataLoader workers through sluiced
    // asked for 256 MiB of cold chunks at once, and the first batch came after most of it:
    // 1.0 s against 0.3 s in one process.)
    const uint64_t mean = std::max<uint64_t>(1, ds->bytes() / std::max<uint64_t>(1, ds->samples()));
    const uint64_t first_bytes = std::min(slice_bytes, block * mean);
    bool first_planned = false, first_landed = false;
    Cursor cursor{.epoch = first_epoch, .from = start};
    std::deque<std::unique_ptr<Flight>> flights;
    uint64_t flight_bytes = 0;  // guarded by mu (a local: no annotation applies)
    std::optional<Planned> next;
    bool planned_all = false, failed = false;
    auto join_all = [&] {
      for (auto& f : flights) f->thread.join();
      flights.clear();
    };
    while (true) {
      // Finished slices go to the caller in order; after a failed one, nothing more.
      {
        UniqueLock lock(mu);
        while (!flights.empty() && flights.front()->done && !failed) {
          std::unique_ptr<Flight> f = std::move(flights.front());
          flights.pop_front();
          lock.unlock();
          f->thread.join();
          lock.lock();
          flight_bytes -= f->bytes;
          first_landed = true;
          failed = f->result->error.has_value();
          queued_bytes += f->result->bytes;
          ready.push_back(std::move(f->result));
          cv.notify_all();
        }
      }
      if (failed) return join_all();
      if (!next && !planned_all) {
        next = plan_slice(cursor, first_planned ? slice_bytes : first_bytes);
        first_planned = true;
        planned_all = !next;
      }
      if (planned_all && flights.empty()) {
        auto end = std::make_shared<Slice>();
        end->end = true;
        push(std::move(end));
        return;
      }
      UniqueLock lock(mu);
      auto can_launch = [&]() SLUICE_REQUIRES(mu) {
        return next && flights.size() < kFlights && (first_landed || flights.empty()) &&
               (queued_bytes + flight_bytes + next->bytes <= o.memory_bytes / 2 ||
                (flights.empty() && ready.empty()));
      };
      if (stopping) {
        lock.unlock();
        return join_all();
      }
      if (can_launch()) {
        auto f = std::make_unique<Flight>();
        f->bytes = next->bytes;
        flight_bytes += f->bytes;
        Flight* raw = f.get();
        f->thread = std::thread([this, raw, p = std::move(*next)] {
          auto slice = fetch(p.epoch, p.positions, p.samples);
          MutexLock done_lock(mu);
          raw->result = std::move(slice);
          raw->done = true;
          cv.notify_all();
        });
        next.reset();
        flights.push_back(std::move(f));
        continue;
      }
      cv.wait(lock, [&]() SLUICE_REQUIRES(mu) {
        return stopping || (!flights.empty() && flights.front()->done) || can_launch();
      });
    }
  }

  void record(const Sample& s) {
    uint64_t bytes = s.bytes();
    counts.samples.fetch_add(1, std::memory_order_relaxed);
    counts.bytes.fetch_add(bytes, std::memory_order_relaxed);
    if (m_samples) m_samples->add();
    if (m_bytes) m_bytes->add(bytes);
    // The token after this sample: the job-wide count consumed, in lockstep: every consumer
    // (rank and worker) has taken as many whole blocks as this one. A consumer whose share
    // is one short of the others' says the same as they do at the same step: the positions
    // the others still read stay in the token.
    uint64_t from = s.epoch == first_epoch ? start : 0;
    uint64_t j = (s.position - from - o.rank) / o.world;             // in the rank's stream
    uint64_t q = (j / block - o.worker) / o.workers, t = j % block;  // this worker's block q
    uint64_t taken = q * block + t + 1;                              // this consumer's count
    uint64_t position = from + uint64_t{o.world} * o.workers * block * (taken / block);
    MutexLock lock(state_mu);
    if (position >= ds->samples()) {
      token_epoch = s.epoch + 1;
      token_position = 0;
    } else {
      token_epoch = s.epoch;
      token_position = position;
    }
  }

  Result<std::optional<Sample>> next() {
    if (bad_options) return std::unexpected(*bad_options);
    while (!current || current_i == current->samples.size()) {
      if (current && current->error) return std::unexpected(*current->error);
      if (current && current->end) return std::optional<Sample>{};
      auto waited = Clock::now();
      UniqueLock lock(mu);
      cv.wait(lock, [&]() SLUICE_REQUIRES(mu) { return !ready.empty(); });
      current = std::move(ready.front());
      ready.pop_front();
      queued_bytes -= current->bytes;
      current_i = 0;
      cv.notify_all();
      lock.unlock();
      if (first_delivered) {
        auto ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - waited).count());
        counts.stall_ns.fetch_add(ns, std::memory_order_relaxed);
        if (m_stall_us) m_stall_us->add(ns / 1000);
      }
    }
    // The slice's list of fields is in the order of the samples' places, not this one.
    if (current_i + 4 < current->samples.size())
      __builtin_prefetch(current->samples[current_i + 4].fields.data());
    Sample s = std::move(current->samples[current_i++]);
    if (!first_delivered) {
      first_delivered = true;
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - created);
      counts.first_ns.store(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
      if (m_first_ms) m_first_ms->set(ns.count() / 1'000'000);
    }
    record(s);
    return std::optional<Sample>(std::move(s));
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(dataset), std::move(options))) {
  Impl& m = *impl_;
  if (!m.ds) {
    m.bad_options = Error(Code::kInvalidArgument, "loader: no dataset");
    return;
  }
  if (auto st = m.validate(); !st) {
    m.bad_options = st.error();
    return;
  }
  m.cache = m.ds->store().capability<cache::ReadAhead>();
  // Gathered reads take a chunk of scratch memory each, an eighth of the budget in all;
  // chunks larger than that are read in parts, as they are asked.
  if (m.cache && !m.cache->keeps_chunks() && m.cache->chunk_size() > 0 &&
      m.cache->chunk_size() <= m.o.memory_bytes / 8)
    m.gather_slots.emplace(static_cast<ptrdiff_t>(
        std::min<uint64_t>(m.o.memory_bytes / 8 / m.cache->chunk_size(), 64)));
  m.cheap_requests = m.ds->store().cheap_requests();
  if (auto* r = m.o.registry) {
    m.m_samples = &r->counter("sluice_stream_samples_total", {}, "samples delivered by loaders");
    m.m_bytes = &r->counter("sluice_stream_bytes_total", {}, "sample bytes delivered by loaders");
    m.m_stall_us = &r->counter("sluice_stream_stall_microseconds_total", {},
                               "time callers waited on the loader for data");
    m.m_throttled = &r->counter("sluice_stream_throttled_total", {},
                                "store answers Unavailable (SlowDown) backed off");
    m.m_requests = &r->counter("sluice_stream_requests_total", {}, "reads sent to the store");
    m.m_first_ms = &r->gauge("sluice_stream_first_batch_milliseconds", {},
                             "time from opening a loader to its first sample");
  }
  m.io = std::make_unique<Executor>(std::clamp(m.o.inflight, 1u, 1024u));
  m.fetcher = std::thread([&m] { m.run_fetcher(); });
}

Loader::~Loader() {
  Impl& m = *impl_;
  {
    MutexLock lock(m.mu);
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.fetcher.joinable()) m.fetcher.join();
  m.io.reset();
}

Result<std::optional<Sample>> Loader::next() {
  return impl_->next();
}

Result<std::vector<Sample>> Loader::next_batch(size_t n) {
  std::vector<Sample> batch;
  batch.reserve(n);
  while (batch.size() < n) {
    SLUICE_ASSIGN_OR_RETURN(auto s, impl_->next());
    if (!s) break;
    batch.push_back(std::move(*s));
  }
  return batch;
}

std::string Loader::state() const {
  const Impl& m = *impl_;
  ResumePoint p{.samples = m.ds ? m.ds->samples() : 0,
                .fingerprint = m.ds ? m.ds->fingerprint() : 0,
                .seed = m.o.seed,
                .window = m.window,
                .identity = m.ds ? m.ds->identity() : 0};
  MutexLock lock(m.state_mu);
  p.epoch = m.token_epoch;
  p.position = m.token_position;
  return make_token(p);
}

LoaderStats Loader::stats() const {
  const auto& c = impl_->counts;
  LoaderStats s;
  s.samples = c.samples.load(std::memory_order_relaxed);
  s.bytes = c.bytes.load(std::memory_order_relaxed);
  s.requests = c.requests.load(std::memory_order_relaxed);
  s.read_bytes = c.read_bytes.load(std::memory_order_relaxed);
  s.throttled = c.throttled.load(std::memory_order_relaxed);
  s.skipped_samples = c.skipped.load(std::memory_order_relaxed);
  s.window_parts = c.window_parts.load(std::memory_order_relaxed);
  s.first_batch_seconds = static_cast<double>(c.first_ns.load(std::memory_order_relaxed)) / 1e9;
  s.stall_seconds = static_cast<double>(c.stall_ns.load(std::memory_order_relaxed)) / 1e9;
  s.elapsed_seconds = seconds_since(impl_->created);
  return s;
}

uint64_t Loader::memory_for_whole_windows(const Dataset& ds) {
  uint64_t largest = 0;
  for (const ShardInfo& s : ds.shards()) largest = std::max(largest, s.size);
  return 4 * largest;
}

uint64_t Loader::shuffle_window_for(const Dataset& ds, const LoaderOptions& o) {
  if (!o.shuffle) return 0;
  if (o.shuffle_window) return o.shuffle_window;
  if (ds.samples() == 0) return 1;
  // The automatic window holds what a slice (a quarter of the memory budget) does at the
  // mean sample size, so a window's samples are read once (see run_fetcher). Windows are
  // whole shards: leave room for the last one.
  uint64_t mean = std::max<uint64_t>(1, ds.bytes() / ds.samples());
  uint64_t per_shard = ds.format() == Format::kTar ? ds.samples() / ds.shards().size() : 1;
  uint64_t fits = o.memory_bytes / 4 / mean;
  return std::max<uint64_t>(1, fits > per_shard ? fits - per_shard : 1);
}

uint64_t Loader::order_at(const Dataset& ds, uint64_t seed, uint64_t epoch, bool shuffle,
                          uint64_t window, uint64_t position) {
  EpochPlan plan(ds, seed, epoch, shuffle, std::max<uint64_t>(window, 1));
  return plan.sample_at(position);
}

const Field* Sample::field(std::string_view name) const {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

uint64_t Sample::bytes() const {
  uint64_t n = 0;
  for (const auto& f : fields) n += f.data.size();
  return n;
}

// ---- tokens --------------------------------------------------------------------------------
// "v3.EPOCH.POSITION.SAMPLES.FINGERPRINT(16 hex).IDENTITY(16 hex).SEED.WINDOW.CHECK(16 hex)":
// CHECK is the XXH3-64 of the text before its dot, so a token cut short or mistyped is
// refused. Older tokens are still read: "v2." (no IDENTITY) and "v1." (no IDENTITY, no
// CHECK); see Loader's open for how each is checked.

std::string make_token(const ResumePoint& p) {
  char fp[17], id[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(p.fingerprint));
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(p.identity));
  std::string body = "v3." + std::to_string(p.epoch) + "." + std::to_string(p.position) + "." +
                     std::to_string(p.samples) + "." + fp + "." + id + "." +
                     std::to_string(p.seed) + "." + std::to_string(p.window);
  return body + "." + xxh3_hex(body);
}

Result<ResumePoint> parse_token(std::string_view token) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "resume token '" + std::string(token.substr(0, 120)) + "' " + std::string(why) +
                    " (expected v3.EPOCH.POSITION.SAMPLES.FINGERPRINT.IDENTITY.SEED.WINDOW.CHECK, "
                    "as `dataset read` printed it)");
  };
  unsigned version = 0;
  if (token.starts_with("v1."))
    version = 1;
  else if (token.starts_with("v2."))
    version = 2;
  else if (token.starts_with("v3."))
    version = 3;
  else
    return bad("is malformed");
  std::string_view rest = token.substr(3);
  if (version >= 2) {
    const size_t dot = token.rfind('.');
    if (dot < 3 || token.size() - dot - 1 != 16) return bad("is cut short or malformed");
    if (token.substr(dot + 1) != xxh3_hex(token.substr(0, dot)))
      return bad("fails its checksum: it was cut short or changed");
    rest = token.substr(3, dot - 3);
  }
  // The fields in order; v3 has IDENTITY after FINGERPRINT, both hex.
  const int fields = version == 3 ? 7 : 6;
  uint64_t v[7] = {};
  for (int i = 0; i < fields; ++i) {
    size_t dot = rest.find('.');
    std::string_view part = rest.substr(0, dot);
    if (part.empty() || (dot == std::string_view::npos) != (i == fields - 1))
      return bad("is malformed");
    const bool hex = i == 3 || (version == 3 && i == 4);
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v[i], hex ? 16 : 10);
    if (ec != std::errc{} || p != part.data() + part.size()) return bad("is malformed");
    rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
  }
  ResumePoint r{.epoch = v[0], .position = v[1], .samples = v[2], .fingerprint = v[3]};
  if (version == 3) {
    r.identity = v[4];
    r.seed = v[5];
    r.window = v[6];
  } else {
    r.seed = v[4];
    r.window = v[5];
  }
  r.version = version;
  if (r.position > r.samples) return bad("names a position past the end of its epoch");
  return r;
}

// ---- device copies -------------------------------------------------------------------------

Result<TargetBatch> copy_batch(std::span<const Sample> batch, mem::Target& target) {
  TargetBatch out;
  uint64_t total = 0;
  for (const auto& s : batch)
    for (const auto& f : s.fields) {
      out.offsets.push_back(total);
      total += f.data.size();
    }
  out.offsets.push_back(total);
  SLUICE_ASSIGN_OR_RETURN(out.memory, target.allocate(std::max<uint64_t>(total, 1)));
  constexpr size_t kStaging = size_t{4} << 20;
  SLUICE_ASSIGN_OR_RETURN(auto staging, target.staging(kStaging).acquire());
  auto* dst = static_cast<std::byte*>(out.memory.get());
  size_t used = 0;
  uint64_t dst_off = 0;
  auto flush = [&]() -> Status {
    if (used == 0) return ok();
    SLUICE_ASSIGN_OR_RETURN(uint64_t ticket,
                            target.copy_to_target(dst + dst_off, staging.data(), used));
    SLUICE_RETURN_IF_ERROR(target.wait(ticket));
    dst_off += used;
    used = 0;
    return ok();
  };
  for (const auto& s : batch)
    for (const auto& f : s.fields) {
      auto src = f.data;
      while (!src.empty()) {
        size_t n = std::min(src.size(), kStaging - used);
        std::memcpy(staging.data() + used, src.data(), n);
        used += n;
        src = src.subspan(n);
        if (used == kStaging) SLUICE_RETURN_IF_ERROR(flush());
      }
    }
  SLUICE_RETURN_IF_ERROR(flush());
  return out;
}

}  // namespace sluice::stream
