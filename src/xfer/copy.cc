// Copying between stores. One object is copied by one job thread, its "owner": it reads the
// first part itself, then keeps a window of parts in flight on the copy's part pool and
// appends them to the destination Writer in order as they arrive. The part budget bounds
// the reads in flight (and their buffers) across every owner at once.
#include "sluice/xfer/copy.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/executor.h"

namespace sluice::xfer {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A part buffer: uninitialised bytes, reused across parts (first touch of fresh memory
// costs more than the copy itself on these machines).
struct PartBuffer {
  std::unique_ptr<std::byte[]> data;
  uint64_t capacity = 0;
};

// The copy's one concurrency budget: at most `slots` part reads in flight and at most
// `max_bytes` of part buffers held, across every object. The idle buffers are kept here.
class PartBudget {
 public:
  PartBudget(unsigned slots, uint64_t max_bytes)
      : slots_(std::max(1u, slots)), max_bytes_(max_bytes) {}

  // Takes a slot and a buffer of at least `len` bytes. With `wait` false, returns nothing
  // when the budget is spent; with it true, waits for room. A lone request always fits,
  // whatever its size, so a copy can always make progress.
  std::optional<PartBuffer> acquire(uint64_t len, bool wait) {
    std::unique_lock lock(mu_);
    auto fits = [&] {
      return in_flight_ == 0 || (in_flight_ < slots_ && bytes_ + len <= max_bytes_);
    };
    if (!wait && !fits()) return std::nullopt;
    cv_.wait(lock, fits);
    ++in_flight_;
    bytes_ += len;
    // Reuse the smallest idle buffer that is large enough; otherwise allocate, dropping
    // one idle buffer so idle memory does not pile up across part sizes.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->capacity >= len && (best == idle_.end() || it->capacity < best->capacity)) best = it;
    if (best != idle_.end()) {
      PartBuffer b = std::move(*best);
      idle_.erase(best);
      return b;
    }
    if (!idle_.empty()) idle_.pop_back();
    lock.unlock();
    return PartBuffer{std::unique_ptr<std::byte[]>(new std::byte[len]), len};
  }

  void release(PartBuffer buffer, uint64_t len) {
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      bytes_ -= len;
      if (idle_.size() < slots_) idle_.push_back(std::move(buffer));
    }
    cv_.notify_all();
  }

 private:
  const unsigned slots_;
  const uint64_t max_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned in_flight_ = 0;        // guarded by mu_
  uint64_t bytes_ = 0;            // guarded by mu_
  std::vector<PartBuffer> idle_;  // guarded by mu_
};

// Shared by every object of one copy.
class Copier {
 public:
  Copier(store::Store& src, store::Store& dst, const CopyOptions& options)
      : src_(src),
        dst_(dst),
        options_(options),
        budget_(options.concurrency, options.max_buffer_bytes),
        pool_(std::max(1u, options.concurrency)) {}

  bool cancelled() const { return options_.cancel && options_.cancel->load(); }

  // Copies one object; the owner thread's whole job.
  Result<store::ObjectInfo> copy_one(const CopyItem& item);

  std::atomic<uint64_t> bytes_done{0};

 private:
  struct Part {
    uint64_t offset = 0, len = 0;
    PartBuffer buffer;
    std::future<Result<size_t>> read;
  };

  Status copy_parts(const CopyItem& item, const store::ObjectInfo& info, store::Writer& writer);
  std::unique_ptr<Part> start_read(const std::string& key, const store::ObjectInfo& info,
                                   uint64_t offset, uint64_t part, bool wait);
  Status finish_part(Part& part, const CopyItem& item, const store::ObjectInfo& info,
                     store::Writer& writer);

  store::Store& src_;
  store::Store& dst_;
  const CopyOptions& options_;
  PartBudget budget_;
  Executor pool_;  // runs the part reads; as many threads as the budget has slots
};

std::unique_ptr<Copier::Part> Copier::start_read(const std::string& key,
                                                 const store::ObjectInfo& info, uint64_t offset,
                                                 uint64_t part, bool wait) {
  uint64_t len = std::min(part, info.size - offset);
  auto buffer = budget_.acquire(len, wait);
  if (!buffer) return nullptr;
  auto p = std::make_unique<Part>();
  p->offset = offset;
  p->len = len;
  p->buffer = std::move(*buffer);
  auto promise = std::make_shared<std::promise<Result<size_t>>>();
  p->read = promise->get_future();
  std::span<std::byte> dst(p->buffer.data.get(), len);
  // Every part is pinned to the version first seen; `split = false`: this copy already
  // keeps parts in parallel, the store must not fan one part out again.
  store::ReadOptions ro{.if_match = info.etag, .object_size = info.size, .split = false};
  pool_.post([src = &src_, key, offset, dst, ro, promise] {
    promise->set_value(src->read_full(key, offset, dst, ro));
  });
  return p;
}

Status Copier::finish_part(Part& part, const CopyItem& item, const store::ObjectInfo& info,
                           store::Writer& writer) {
  auto n = part.read.get();
  Status st = ok();
  if (!n) {
    st = std::unexpected(n.error());
  } else if (*n != part.len) {
    st = fail(Code::kConflict, "source '" + item.src_key + "' ended at " +
                                   std::to_string(part.offset + *n) + " bytes, but its size was " +
                                   std::to_string(info.size) +
                                   " when the copy started (it shrank or was replaced)");
  } else {
    st = writer.append(std::span<const std::byte>(part.buffer.data.get(), part.len));
    if (st) bytes_done.fetch_add(part.len, std::memory_order_relaxed);
  }
  budget_.release(std::move(part.buffer), part.len);
  return st;
}

Status Copier::copy_parts(const CopyItem& item, const store::ObjectInfo& info,
                          store::Writer& writer) {
  const uint64_t part = options_.part_size ? options_.part_size : part_size_for(info.size);
  std::deque<std::unique_ptr<Part>> window;  // parts in flight, in offset order
  uint64_t next = 0;                         // offset of the next part to start
  Status st = ok();
  // The first part alone; then as many as the budget allows, waiting for room only when
  // this object has nothing in flight.
  bool first = true;
  while (st && (next < info.size || !window.empty())) {
    if (cancelled()) {
      st = fail(Code::kCancelled, "copy of '" + item.src_key + "' cancelled");
      break;
    }
    while (next < info.size && (window.empty() || !first)) {
      auto p = start_read(item.src_key, info, next, part, window.empty());
      if (!p) break;
      next += p->len;
      window.push_back(std::move(p));
    }
    first = false;
    st = finish_part(*window.front(), item, info, writer);
    window.pop_front();
  }
  // Parts still in flight write into buffers this frame owns: wait for them.
  for (auto& p : window) {
    p->read.wait();
    budget_.release(std::move(p->buffer), p->len);
  }
  return st;
}

Result<store::ObjectInfo> Copier::copy_one(const CopyItem& item) {
  if (cancelled()) return fail(Code::kCancelled, "copy of '" + item.src_key + "' cancelled");
  store::ObjectInfo info;
  if (item.info) {
    info = *item.info;
  } else {
    SLUICE_ASSIGN_OR_RETURN(info, src_.stat(item.src_key));
  }
  SLUICE_ASSIGN_OR_RETURN(
      auto writer, dst_.create(item.dst_key, store::WriteOptions{.overwrite = options_.overwrite,
                                                                 .durable = options_.durable,
                                                                 .size_hint = info.size}));
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
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    options_.on_progress(sample_());
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, options_.progress_interval, [&] { return stopping_; })) {
      lock.unlock();
      options_.on_progress(sample_());
      lock.lock();
    }
  }
  const CopyOptions& options_;
  std::function<CopyProgress()> sample_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
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
                        .bytes_total = 0,
                        .objects_total = 1};
  });
  return copier.copy_one(item);
}

CopyReport copy_all(store::Store& src, store::Store& dst, std::span<const CopyItem> items,
                    const CopyOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  Copier copier(src, dst, options);
  CopyReport report;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0}, failed{0};
  uint64_t total_bytes = 0;
  for (auto& item : items) total_bytes += item.info ? item.info->size : 0;
  ProgressTicker ticker(options, [&] {
    return CopyProgress{.bytes_done = copier.bytes_done.load(std::memory_order_relaxed),
                        .bytes_total = total_bytes,
                        .objects_done = done.load(std::memory_order_relaxed),
                        .objects_failed = failed.load(std::memory_order_relaxed),
                        .objects_total = items.size()};
  });
  auto job = [&] {
    for (size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) {
      if (copier.cancelled()) return;
      auto r = copier.copy_one(items[i]);
      std::lock_guard lock(mu);
      if (r) {
        ++report.objects;
        report.bytes += r->size;
        done.fetch_add(1, std::memory_order_relaxed);
      } else if (r.error().code() != Code::kCancelled) {
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
  report.cancelled = copier.cancelled();
  report.seconds = seconds_since(t0);
  return report;
}

Result<std::vector<CopyItem>> plan_prefix(store::Store& src, std::string_view src_prefix,
                                          std::string_view dst_prefix) {
  SLUICE_ASSIGN_OR_RETURN(auto objects, src.list_all(src_prefix));
  std::vector<CopyItem> items;
  items.reserve(objects.size());
  for (auto& obj : objects) {
    // A listing is untrusted input: a key outside the prefix is a broken or hostile server.
    if (!obj.key.starts_with(src_prefix))
      return fail(Code::kInvalidArgument, "listing of '" + std::string(src_prefix) + "' in " +
                                              src.uri() + " returned key '" + obj.key +
                                              "', which is outside that prefix");
    if (obj.key.ends_with('/')) continue;  // a "folder" marker object
    std::string dst_key = std::string(dst_prefix) + obj.key.substr(src_prefix.size());
    if (auto st = store::validate_key(dst_key); !st)
      return fail(Code::kInvalidArgument,
                  "listed key '" + obj.key + "' in " + src.uri() +
                      " makes no valid destination: " + st.error().message());
    items.push_back(CopyItem{obj.key, std::move(dst_key), std::move(obj)});
  }
  return items;
}

uint64_t part_size_for(uint64_t object_size) {
  uint64_t eighth = (object_size / 8 + kMiB - 1) / kMiB * kMiB;
  return std::clamp<uint64_t>(eighth, 8 * kMiB, 32 * kMiB);
}

}  // namespace sluice::xfer
