// Copying between stores. One object is copied by one job thread, its "owner": it reads the
// first part itself, then keeps up to `streams` parts in flight on the copy's part pool, as
// the budget allows. A destination that takes positional writes (file://) gets each part
// written at its offset by the pool thread that read it, as soon as it arrives; any other
// destination gets the parts appended in order by the owner. The part budget bounds the
// reads in flight and the bytes of their buffers across every owner at once.
#include "sluice/xfer/copy.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <thread>

#include "core/executor.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/buffer_pool.h"

namespace sluice::xfer {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// What of a multi-part object is read alone, before the other parts start.
constexpr uint64_t kHeadBytes = kMiB;
// A positional destination is written as a part's bytes land, this much at a time at least.
constexpr uint64_t kLandBytes = kMiB;

// A part buffer: uninitialised bytes, reused across parts (first touch of fresh memory
// costs more than the copy itself on these machines). 4 KiB-aligned, so a source that
// writes what it reads to a file with O_DIRECT (the cache's NVMe tier) needs no copy.
struct PartBuffer {
  AlignedBuffer data;
  uint64_t capacity = 0;
};

// The copy's one concurrency budget: at most `slots` part reads in flight, and at most
// `max_bytes` of part buffers, in flight and idle together (a lone part may exceed it, so
// a copy always makes progress). Idle buffers are kept here for reuse.
class PartBudget {
 public:
  PartBudget(unsigned slots, uint64_t max_bytes)
      : slots_(std::max(1u, slots)), max_bytes_(max_bytes) {}

  // Takes a slot and a buffer of at least `len` bytes. With `wait` false, returns nothing
  // when the budget is spent; with it true, waits for room.
  Result<std::optional<PartBuffer>> acquire(uint64_t len, bool wait) {
    UniqueLock lock(mu_);
    auto fits = [&]() SLUICE_REQUIRES(mu_) {
      return in_flight_ == 0 || (in_flight_ < slots_ && held_ + len <= max_bytes_);
    };
    if (!wait && !fits()) return std::optional<PartBuffer>();
    cv_.wait(lock, fits);
    // The smallest idle buffer that is large enough; else a new one, after giving up idle
    // buffers until the new one fits beside what is held.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->capacity >= len && (best == idle_.end() || it->capacity < best->capacity)) best = it;
    PartBuffer b;
    if (best != idle_.end()) {
      b = std::move(*best);
      idle_.erase(best);
      idle_bytes_ -= b.capacity;
    } else {
      while (!idle_.empty() && held_ + idle_bytes_ + len > max_bytes_) {
        idle_bytes_ -= idle_.back().capacity;
        idle_.pop_back();
      }
      auto data = AlignedBuffer::allocate(std::max<uint64_t>(len, 1));
      if (!data)
        return fail(Code::kNoSpace, "cannot allocate a " + std::to_string(len) +
                                        "-byte part buffer (lower --part-size)");
      b.data = std::move(*data);
      b.capacity = len;
    }
    ++in_flight_;
    held_ += b.capacity;
    return std::optional<PartBuffer>(std::move(b));
  }

  void release(PartBuffer buffer) {
    {
      MutexLock lock(mu_);
      --in_flight_;
      held_ -= buffer.capacity;
      if (idle_.size() < slots_ && held_ + idle_bytes_ + buffer.capacity <= max_bytes_) {
        idle_bytes_ += buffer.capacity;
        idle_.push_back(std::move(buffer));
      }
    }
    cv_.notify_all();
  }

 private:
  const unsigned slots_;
  const uint64_t max_bytes_;
  Mutex mu_;
  CondVar cv_;
  unsigned in_flight_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t held_ SLUICE_GUARDED_BY(mu_) = 0;        // capacity of the buffers in flight
  uint64_t idle_bytes_ SLUICE_GUARDED_BY(mu_) = 0;  // capacity of idle_
  std::vector<PartBuffer> idle_ SLUICE_GUARDED_BY(mu_);
};

// One part of one object, from its read to its write.
struct Part {
  uint64_t offset = 0, len = 0;
  PartBuffer buffer;
  Status result = ok();  // the read's (and, for positional writes, the write's) outcome
  bool written = false;  // positional: already at its place in the destination
};

// The parts of one object that have finished on the pool, for its owner to collect.
class Arrivals {
 public:
  void push(std::unique_ptr<Part> p) {
    {
      MutexLock lock(mu_);
      done_.push_back(std::move(p));
    }
    cv_.notify_one();
  }
  std::unique_ptr<Part> pop() {
    UniqueLock lock(mu_);
    cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return !done_.empty(); });
    auto p = std::move(done_.front());
    done_.pop_front();
    return p;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<std::unique_ptr<Part>> done_ SLUICE_GUARDED_BY(mu_);
};

// Shared by every object of one copy.
class Copier {
 public:
  Copier(store::Store& src, store::Store& dst, const CopyOptions& options)
      : src_(src),
        dst_(dst),
        options_(options),
        budget_(options.concurrency, options.max_buffer_bytes),
        // A local file takes small writes cheaply; a remote positional writer (node://)
        // would send a request for each.
        land_as_read_(dst.uri().starts_with("file://")),
        pool_(std::max(1u, options.concurrency)) {}

  bool cancelled() const { return options_.cancel && options_.cancel->load(); }

  // Copies one object; the owner thread's whole job.
  Result<store::ObjectInfo> copy_one(const CopyItem& item);

  // Relaxed: progress figures, only reported; the copies' results come back by other means.
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<uint64_t> bytes_total{0};  // sizes of the objects known so far

 private:
  Status copy_parts(const CopyItem& item, const store::ObjectInfo& info, store::Writer& writer);
  // Reads one part (and writes it, when the writer is positional) into `p`.
  void transfer(Part& p, const std::string& key, const store::ObjectInfo& info,
                store::Writer& writer) const;

  store::Store& src_;
  store::Store& dst_;
  const CopyOptions& options_;
  PartBudget budget_;
  const bool land_as_read_;  // write a part's bytes as they land (file:// destinations)
  Executor pool_;            // runs the part reads; as many threads as the budget has slots
};

void Copier::transfer(Part& p, const std::string& key, const store::ObjectInfo& info,
                      store::Writer& writer) const {
  std::span<std::byte> dst(p.buffer.data.data(), p.len);
  // Pinned to the version first seen; `split = false`: this copy already keeps parts in
  // parallel, the store must not fan one part out again.
  store::ReadOptions ro{.if_match = info.etag, .object_size = info.size, .split = false};
  // A positional destination gets the bytes as they land, a MiB or more at a time, so the
  // part's write overlaps its read instead of following it. A retry lands bytes again from
  // a lower offset (the same bytes: the read is pinned to one version); they are written
  // again as they come. The read's result still decides: a failed part fails the object,
  // whose writer is then aborted.
  uint64_t written = 0;  // bytes of the part at their place in the destination
  Status landed_st = ok();
  if (writer.positional() && land_as_read_)
    ro.hooks.on_landed = [&](uint64_t end) {
      const uint64_t have = std::min(end, p.offset + p.len) - std::min(end, p.offset);
      if (have < written) written = have;
      if (!landed_st || have - written < kLandBytes) return;
      landed_st = writer.write_at(p.offset + written, dst.subspan(written, have - written));
      written = have;
    };
  auto n = src_.read_full(key, p.offset, dst, ro);
  if (!n) {
    p.result = std::unexpected(n.error());
  } else if (*n != p.len) {
    p.result =
        fail(Code::kConflict, "source '" + key + "' ended at " + std::to_string(p.offset + *n) +
                                  " bytes, but its size was " + std::to_string(info.size) +
                                  " when the copy started (it shrank or was replaced)");
  } else if (writer.positional()) {
    p.result = landed_st;
    if (p.result && written < p.len)
      p.result = writer.write_at(p.offset + written, dst.subspan(written));
    p.written = p.result.has_value();
  }
}

Status Copier::copy_parts(const CopyItem& item, const store::ObjectInfo& info,
                          store::Writer& writer) {
  const unsigned streams = std::max(1u, options_.streams ? options_.streams : options_.concurrency);
  // Without a stream count of its own, an object is cut in about eight parts, as before
  // streams were counted.
  uint64_t part = options_.part_size
                      ? options_.part_size
                      : part_size_for(info.size, options_.streams ? options_.streams : 8);
  if (!options_.part_size && options_.part_align > 1 && part % options_.part_align != 0)
    part = (part / options_.part_align + 1) * options_.part_align;
  Arrivals arrivals;
  std::map<uint64_t, std::unique_ptr<Part>> waiting;  // arrived, not yet appended (in order)
  uint64_t next = 0;                                  // offset of the next part to start
  uint64_t appended = 0;  // offset up to which the destination has the bytes
  unsigned in_flight = 0;
  Status st = ok();

  // Takes a part's bytes into the destination: already there (positional), or appended
  // in order once every part before it is in.
  auto land = [&](std::unique_ptr<Part> p) {
    if (st && !p->result) st = std::move(p->result);
    if (!st || p->written) {
      if (st) bytes_done.fetch_add(p->len, std::memory_order_relaxed);
      budget_.release(std::move(p->buffer));
      return;
    }
    waiting.emplace(p->offset, std::move(p));
    for (auto it = waiting.begin(); st && it != waiting.end() && it->first == appended;
         it = waiting.erase(it)) {
      Part& q = *it->second;
      if (!q.written) st = writer.append(std::span<const std::byte>(q.buffer.data.data(), q.len));
      if (st) {
        appended += q.len;
        bytes_done.fetch_add(q.len, std::memory_order_relaxed);
      }
      budget_.release(std::move(q.buffer));
    }
  };
  // The next part with its buffer, or null when the budget is spent (or failed).
  // Parts end on multiples of `part` (a cache's chunk bounds stay whole); the first may be
  // cut shorter with `limit`.
  auto take = [&](bool wait, uint64_t limit = UINT64_MAX) -> std::unique_ptr<Part> {
    uint64_t len = std::min({(next / part + 1) * part - next, info.size - next, limit});
    auto buffer = budget_.acquire(len, wait);
    if (!buffer) st = std::unexpected(buffer.error());
    if (!buffer || !*buffer) return nullptr;
    auto p = std::make_unique<Part>();
    p->offset = next;
    p->len = len;
    p->buffer = std::move(**buffer);
    next += len;
    return p;
  };
  auto start = [&](bool wait) -> bool {
    auto p = take(wait);
    if (!p) return false;
    ++in_flight;
    pool_.post([this, &arrivals, &item, &info, &writer, part = p.release()] {
      std::unique_ptr<Part> owned(part);
      transfer(*owned, item.src_key, info, writer);
      arrivals.push(std::move(owned));
    });
    return true;
  };

  // The first part alone, on this thread: a refused or missing object costs one request,
  // the rest are read only once this version has been seen, and a small object needs no
  // hand-off to the pool at all. Of a larger object only its head goes alone (kHeadBytes):
  // a whole first part read by one stream while the others wait cost an eighth of a large
  // download at one stream's speed.
  if (next < info.size) {
    uint64_t head = UINT64_MAX;
    if (info.size > part) {
      const uint64_t align = std::max<uint64_t>(options_.part_align, 1);
      head = (kHeadBytes + align - 1) / align * align;  // whole chunks: none read twice
    }
    if (auto p = take(true, head)) {
      transfer(*p, item.src_key, info, writer);
      land(std::move(p));
    }
  }
  while (in_flight > 0 || (st && next < info.size)) {
    if (st && cancelled()) st = fail(Code::kCancelled, "copy of '" + item.src_key + "' cancelled");
    // As many parts as its streams and the budget allow; wait for room only with nothing in
    // flight.
    while (st && next < info.size && in_flight < streams && start(in_flight == 0)) {
    }
    if (in_flight == 0) break;
    --in_flight;
    land(arrivals.pop());
  }
  for (auto& [offset, p] : waiting) budget_.release(std::move(p->buffer));
  return st;
}

Result<store::ObjectInfo> Copier::copy_one(const CopyItem& item) {
  if (cancelled()) return fail(Code::kCancelled, "copy of '" + item.src_key + "' cancelled");
  store::ObjectInfo info;
  // An empty object from a listing is looked at once more: without it the copy would send
  // no request at all, and publish an empty object that may have been deleted or replaced.
  if (item.info && item.info->size > 0) {
    info = *item.info;
  } else {
    SLUICE_ASSIGN_OR_RETURN(info, src_.stat(item.src_key));
    if (!item.info) bytes_total.fetch_add(info.size, std::memory_order_relaxed);
  }
  SLUICE_ASSIGN_OR_RETURN(
      auto writer,
      dst_.create(item.dst_key,
                  store::WriteOptions{.overwrite = options_.overwrite,
                                      .durable = options_.durable,
                                      .size_hint = info.size,
                                      .mtime_ns = options_.keep_mtime && info.mtime_ns > 0
                                                      ? std::optional<int64_t>(info.mtime_ns)
                                                      : std::nullopt}));
  Status st = copy_parts(item, info, *writer);
  // The last chance to stop: once commit starts, the object is published whole.
  if (st && cancelled()) st = fail(Code::kCancelled, "copy of '" + item.src_key + "' cancelled");
  if (st) st = writer->commit();
  if (!st) {
    writer->abort();  // nothing published: no temporary file, no open multipart upload
    return std::unexpected(st.error());
  }
  return info;
}

// Calls on_progress every interval until stopped, then once more.
class ProgressTicker {
 public:
  ProgressTicker(const CopyOptions& options, std::function<CopyProgress()> sample)
      : options_(options), sample_(std::move(sample)) {
    if (options_.on_progress) thread_ = std::thread([this] { run(); });
  }
  ~ProgressTicker() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    options_.on_progress(sample_());
  }

 private:
  void run() {
    UniqueLock lock(mu_);
    while (!cv_.wait_for(lock, options_.progress_interval,
                         [&]() SLUICE_REQUIRES(mu_) { return stopping_; })) {
      lock.unlock();
      options_.on_progress(sample_());
      lock.lock();
    }
  }
  const CopyOptions& options_;
  std::function<CopyProgress()> sample_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<store::ObjectInfo> copy(store::Store& src, std::string_view src_key, store::Store& dst,
                               std::string_view dst_key, const CopyOptions& options) {
  Copier copier(src, dst, options);
  CopyItem item{std::string(src_key), std::string(dst_key), std::nullopt};
  ProgressTicker ticker(options, [&] {
    return CopyProgress{.bytes_done = copier.bytes_done.load(std::memory_order_relaxed),
                        .bytes_total = copier.bytes_total.load(std::memory_order_relaxed),
                        .objects_total = 1};
  });
  return copier.copy_one(item);
}

CopyReport copy_all(store::Store& src, store::Store& dst, std::span<const CopyItem> items,
                    const CopyOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  Copier copier(src, dst, options);
  CopyReport report;
  Mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0}, failed{0};  // relaxed: progress figures, only reported
  uint64_t listed = 0;  // sizes from the plan; the rest are added as objects are stat'd
  for (auto& item : items) listed += item.info ? item.info->size : 0;
  copier.bytes_total.fetch_add(listed, std::memory_order_relaxed);
  ProgressTicker ticker(options, [&] {
    return CopyProgress{.bytes_done = copier.bytes_done.load(std::memory_order_relaxed),
                        .bytes_total = copier.bytes_total.load(std::memory_order_relaxed),
                        .objects_done = done.load(std::memory_order_relaxed),
                        .objects_failed = failed.load(std::memory_order_relaxed),
                        .objects_total = items.size()};
  });
  auto job = [&] {
    for (size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) {
      if (copier.cancelled()) return;
      auto r = copier.copy_one(items[i]);
      MutexLock lock(mu);
      if (r) {
        ++report.objects;
        report.bytes += r->size;
        done.fetch_add(1, std::memory_order_relaxed);
      } else if (r.error().code() != Code::kCancelled || !copier.cancelled()) {
        report.failures.push_back(CopyFailure{items[i].src_key, r.error()});
        failed.fetch_add(1, std::memory_order_relaxed);
      }
    }
  };
  unsigned jobs =
      static_cast<unsigned>(std::clamp<size_t>(items.size(), 1, std::max(1u, options.jobs)));
  std::vector<std::thread> threads;
  for (unsigned j = 1; j < jobs; ++j) threads.emplace_back(job);
  job();
  for (auto& t : threads) t.join();
  ticker.stop();
  // Cancelled only if the cancel cost something: a signal after the last commit did not.
  report.cancelled = copier.cancelled() && report.objects + report.failures.size() < items.size();
  report.seconds = seconds_since(t0);
  return report;
}

Result<CopyPlan> plan_prefix(store::Store& src, std::string_view src_prefix,
                             std::string_view dst_prefix) {
  CopyPlan plan;
  SLUICE_ASSIGN_OR_RETURN(auto objects, src.list_all(src_prefix, &plan.skipped));
  plan.items.reserve(objects.size());
  for (auto& obj : objects) {
    // A listing is untrusted input: a key outside the prefix is a broken or hostile server.
    if (!obj.key.starts_with(src_prefix))
      return fail(Code::kInvalidArgument, "listing of '" + std::string(src_prefix) + "' in " +
                                              src.uri() + " returned key '" + obj.key +
                                              "', which is outside that prefix");
    if (obj.key.ends_with('/')) continue;  // a "folder" marker object
    std::string dst_key = std::string(dst_prefix) + obj.key.substr(src_prefix.size());
    if (auto st = store::validate_key(dst_key); !st) {
      plan.rejected.push_back(
          CopyFailure{obj.key, Error(Code::kInvalidArgument,
                                     "listed key '" + obj.key + "' in " + src.uri() +
                                         " makes no valid destination: " + st.error().message())});
      continue;
    }
    plan.items.push_back(CopyItem{obj.key, std::move(dst_key), std::move(obj)});
  }
  return plan;
}

uint64_t part_size_for(uint64_t object_size, unsigned streams) {
  uint64_t share = (object_size / std::max(1u, streams) + kMiB - 1) / kMiB * kMiB;
  return std::clamp<uint64_t>(share, 8 * kMiB, 32 * kMiB);
}

}  // namespace sluice::xfer
