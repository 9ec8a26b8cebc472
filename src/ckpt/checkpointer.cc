// The checkpointer: staging ring, background writers, commit protocol, restore and gc.
//
// Threads and data flow of a save:
//   caller (save)      tensors -> staging ring, one segment at a time (the only stall)
//   stage writer       staging ring -> the first tier that takes the shard; chunk checksums
//   replicator         record + commit on that tier, then copies to every later tier
// Segments of the staging ring are numbered by one sequence across saves: the caller may
// fill segment q once segment q - slots is released, and the stage writer may write it
// once it is filled. A save that fits in the ring keeps its segments until the shard is
// published somewhere, so a failed first tier can be retried on the next from memory.
#include "sluice/ckpt/checkpointer.h"

#include "sluice/ckpt/live.h"

#include <sys/statvfs.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "core/parallel.h"
#include "sluice/core/hash.h"
#include "sluice/xfer/copy.h"

namespace sluice::ckpt {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string fresh_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return hex64(rng()) + hex64(rng());
}

// ---------------------------------------------------------------------------------------
// Save handles.

class Handle final : public SaveHandle {
 public:
  Handle(uint64_t step, uint64_t total, const std::vector<Tier>& tiers) {
    p_.step = step;
    p_.bytes_total = total;
    for (const auto& t : tiers) {
      p_.tiers.push_back({t.name, TierState::kPending, 0, std::nullopt});
      required_.push_back(t.required);
    }
  }

  SaveProgress progress() const override {
    std::lock_guard lk(mu_);
    return p_;
  }

  Status wait() override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return p_.finished; });
    for (size_t i = 0; i < p_.tiers.size(); ++i)
      if (required_[i] && p_.tiers[i].state != TierState::kCommitted)
        return std::unexpected(p_.tiers[i].error.value_or(
            Error(Code::kInternal, "tier " + p_.tiers[i].tier + " was not written")));
    return ok();
  }

  Status wait_tier(size_t i) override {
    std::unique_lock lk(mu_);
    if (i >= p_.tiers.size()) return fail(Code::kInvalidArgument, "no tier " + std::to_string(i));
    cv_.wait(lk, [&] { return settled(p_.tiers[i].state); });
    if (p_.tiers[i].state == TierState::kCommitted) return ok();
    return std::unexpected(p_.tiers[i].error.value_or(Error(Code::kCancelled, "tier skipped")));
  }

  void staged(uint64_t n) {
    std::lock_guard lk(mu_);
    p_.bytes_staged = n;
  }
  void set(size_t i, TierState s, std::optional<Error> e = std::nullopt) {
    std::lock_guard lk(mu_);
    p_.tiers[i].state = s;
    if (e) p_.tiers[i].error = std::move(e);
    if (s == TierState::kCommitted) p_.tiers[i].bytes_done = p_.bytes_total;
    p_.finished = std::all_of(p_.tiers.begin(), p_.tiers.end(),
                              [](const TierProgress& t) { return settled(t.state); });
    cv_.notify_all();
  }
  void written(size_t i, uint64_t n) {
    std::lock_guard lk(mu_);
    p_.tiers[i].bytes_done = n;
  }
  TierState state(size_t i) const {
    std::lock_guard lk(mu_);
    return p_.tiers[i].state;
  }

 private:
  static bool settled(TierState s) {
    return s == TierState::kCommitted || s == TierState::kFailed || s == TierState::kSkipped;
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  SaveProgress p_;
  std::vector<bool> required_;
};

// ---------------------------------------------------------------------------------------
// The staging ring.

class StagingRing {
 public:
  StagingRing(AlignedBuffer mem, uint64_t segment)
      : mem_(std::move(mem)), segment_(segment), slots_(mem_.size() / segment) {}

  uint64_t segment() const { return segment_; }
  uint64_t slots() const { return slots_; }
  std::byte* slot(uint64_t seq) const { return mem_.data() + (seq % slots_) * segment_; }

  // The caller waits until segment `seq` may be filled.
  void wait_free(uint64_t seq) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return seq < released_ + slots_; });
  }
  // Segments before `end` are filled (or will never be: their save gave up).
  void mark_filled_through(uint64_t end) {
    std::lock_guard lk(mu_);
    filled_ = std::max(filled_, end);
    cv_.notify_all();
  }
  // The stage writer waits until segment `seq` is filled.
  void wait_filled(uint64_t seq) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return filled_ > seq; });
  }
  void release_through(uint64_t end) {
    std::lock_guard lk(mu_);
    released_ = std::max(released_, end);
    cv_.notify_all();
  }
  // Hands out `n` sequence numbers for one save.
  uint64_t reserve(uint64_t n) {
    std::lock_guard lk(mu_);
    uint64_t first = next_;
    next_ += n;
    return first;
  }

 private:
  AlignedBuffer mem_;
  const uint64_t segment_, slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, filled_ = 0, released_ = 0;  // guarded by mu_
};

// Chunk checksums of a shard computed as its bytes stream past in order.
class ChunkHasher {
 public:
  ChunkHasher(std::vector<TensorEntry>& tensors, uint64_t chunk)
      : tensors_(tensors), chunk_(chunk) {
    skip_empty();
  }
  ChunkHasher(const ChunkHasher&) = delete;
  ChunkHasher& operator=(const ChunkHasher&) = delete;

  // Feeds shard bytes [at, at + data.size()); calls come in shard order.
  void feed(uint64_t at, std::span<const std::byte> data) {
    uint64_t end = at + data.size();
    while (t_ < tensors_.size()) {
      TensorEntry& t = tensors_[t_];
      uint64_t pos = t.offset + done_;  // next byte of the tensor to hash
      if (pos >= end) return;
      uint64_t chunk_end = std::min(t.bytes, (done_ / chunk_ + 1) * chunk_);
      uint64_t take = std::min(end, t.offset + chunk_end) - pos;
      state_.update(data.data() + (pos - at), take);
      done_ += take;
      if (done_ == chunk_end) {
        t.chunks.push_back(state_.digest());
        state_.reset();
        if (done_ == t.bytes) {
          ++t_;
          done_ = 0;
          skip_empty();
        }
      }
    }
  }

 private:
  void skip_empty() {
    while (t_ < tensors_.size() && tensors_[t_].bytes == 0) ++t_;
  }
  std::vector<TensorEntry>& tensors_;
  const uint64_t chunk_;
  Xxh3Stream state_;
  size_t t_ = 0;
  uint64_t done_ = 0;
};

// One queued save.
struct SaveJob {
  uint64_t step = 0;
  ShardRecord record;  // tensors laid out; chunk checksums filled by the stage writer
  uint64_t first_seq = 0, segments = 0;
  bool fits = false;                 // the whole shard is in the ring at once
  std::atomic<bool> aborted{false};  // the caller failed while staging
  std::optional<Error> abort_error;  // set before `aborted`, read after it
  // The first tier failed while the caller was still streaming into the ring: staging stops.
  std::atomic<bool> abandoned{false};
  std::optional<Error> abandon_error;  // set before `abandoned`, read after it
  std::string source_etag;             // the shard's etag on source_tier once committed
  std::shared_ptr<Handle> handle;
  int source_tier = -1;  // the tier the stage writer published the shard on
};

bool local_tier(const Tier& t) {
  return !t.local_dir.empty();
}

// Step directories left empty on a local tier (a save killed between creating the
// directory and publishing into it, or a step gc emptied), once older than the grace.
// Best effort: what cannot be removed is only an empty directory.
void remove_empty_step_dirs(const std::string& series_dir, std::string_view series,
                            const std::set<uint64_t>& active, std::chrono::seconds grace) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - grace;
  for (const auto& e : fs::directory_iterator(series_dir, ec)) {
    uint64_t step = 0;
    std::string leaf;
    const std::string key = std::string(series) + "/" + e.path().filename().string() + "/x";
    std::error_code ec2;
    if (!parse_step_key(series, key, step, leaf) || active.count(step) || !e.is_directory(ec2) ||
        e.is_symlink(ec2) || fs::last_write_time(e.path(), ec2) > cutoff || ec2)
      continue;
    fs::remove(e.path(), ec2);  // removes only an empty directory (ENOTEMPTY otherwise)
  }
}

Status check_free_space(const Tier& t, uint64_t need, std::string_view what) {
  struct statvfs sv;
  if (::statvfs(t.local_dir.c_str(), &sv) != 0)
    return fail_errno(errno, "statvfs of checkpoint tier " + t.local_dir);
  uint64_t avail = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  uint64_t want = need + (uint64_t{1} << 20);  // the records and the manifest
  if (avail < want)
    return fail(Code::kNoSpace, "checkpoint tier " + t.name + " has " + std::to_string(avail) +
                                    " bytes free; " + std::string(what) + " needs " +
                                    std::to_string(want));
  return ok();
}

// A thread that copies part of each staged segment: one thread's memcpy runs at about half
// of what the memory system gives two (8-9 vs 17-18 GiB/s on our machines).
class CopyHelper {
 public:
  CopyHelper() : thread_([this] { loop(); }) {}
  ~CopyHelper() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  void post(std::function<Status()> fn) {
    std::lock_guard lk(mu_);
    task_ = std::move(fn);
    done_ = false;
    cv_.notify_all();
  }
  Status wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    return result_;
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || task_; });
      if (!task_) return;
      auto fn = std::move(task_);
      task_ = nullptr;
      lk.unlock();
      Status r = fn();
      lk.lock();
      result_ = std::move(r);
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<Status()> task_;  // guarded by mu_
  Status result_ = ok();          // guarded by mu_
  bool done_ = true, stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The files one restore or verify reads: each local shard is opened once and shared by the
// reading threads (a FileHandle may be used from many threads at once).
class ShardFiles {
 public:
  Result<io::FileHandle*> get(const std::shared_ptr<io::Context>& ctx, const std::string& path) {
    std::lock_guard lk(mu_);
    auto it = open_.find(path);
    if (it != open_.end()) return it->second.get();
    // A shard replaced by a FIFO or a device must not block or feed the reader.
    std::error_code ec;
    if (std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::regular)
      return fail(ec ? Code::kNotFound : Code::kCorruption,
                  path + (ec ? ": " + ec.message() : " is not a regular file"));
    SLUICE_ASSIGN_OR_RETURN(auto fh, io::FileHandle::open(ctx, path, {}));
    auto& slot = open_[path];
    slot = std::make_unique<io::FileHandle>(std::move(fh));
    return slot.get();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<io::FileHandle>> open_;  // guarded by mu_
};

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(CheckpointerOptions o, std::unique_ptr<StagingRing> ring)
      : o_(std::move(o)), ring_(std::move(ring)) {
    for (unsigned i = 1; i < o_.stage_threads; ++i)
      helpers_.push_back(std::make_unique<CopyHelper>());
    stage_thread_ = std::thread([this] { stage_loop(); });
    repl_thread_ = std::thread([this] { replicate_loop(); });
    lease_thread_ = std::thread([this] { lease_loop(); });
  }

  ~CheckpointerImpl() override {
    flush();
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    stage_thread_.join();
    repl_thread_.join();
    lease_thread_.join();
  }

  const CheckpointerOptions& options() const override { return o_; }

  Status check_cancel() const {
    if (o_.cancel && o_.cancel->load(std::memory_order_relaxed))
      return fail(Code::kCancelled, "checkpoint work of series " + o_.series + " was cancelled");
    return ok();
  }

  Result<std::shared_ptr<SaveHandle>> save(uint64_t step,
                                           std::span<const TensorView> tensors) override;
  void flush() override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return active_ == 0; });
  }

  Result<std::vector<StepInfo>> list() override;
  Result<uint64_t> latest() override;
  Result<Manifest> manifest(uint64_t step) override;
  Result<RestoreReport> restore(uint64_t step, std::span<const TensorDest> dests) override;
  Result<VerifyReport> verify(uint64_t step, int tier) override;
  Result<GcReport> gc() override;
  Result<SyncReport> sync(std::optional<uint64_t> step) override;

 private:
  // Staging: fills the job's segments from the tensors (the caller's thread).
  Status stage(SaveJob& job, std::span<const TensorView> views);
  void stage_loop();
  void replicate_loop();
  // The next job of a queue; null once stopping with the queue empty (the loops end).
  std::shared_ptr<SaveJob> take(std::deque<std::shared_ptr<SaveJob>>& q);
  // Writes the job's shard from the ring to tier i; the chunk checksums on success.
  Result<std::vector<TensorEntry>> write_from_ring(SaveJob& job, size_t i);
  Status publish_record_and_commit(SaveJob& job, size_t i);
  // Before this rank publishes its shard of `step` on a tier: AlreadyExists if the step is
  // committed there. (Shards of other attempts are left alone: a concurrent save may own
  // them; gc removes them once stale.)
  Status check_not_committed(const Tier& tier, uint64_t step);
  // Waits until rank 0 committed the step on tier i, whole and naming this rank's shard of
  // save `save_id`.
  Status wait_for_commit(size_t i, uint64_t step, const std::string& save_id);
  Status gc_tier(size_t i, GcReport& report);
  void finish(SaveJob& job);
  // The job's marker on tier i (live.h): written now, then rewritten by the lease thread
  // until finish() removes it. Best effort: a tier that cannot take it fails on its own.
  void hold_step(const SaveJob& job, size_t i);
  void lease_loop();

  // Reads a shard's bytes [off, off + dst.size()) from tier i.
  Status read_shard(size_t i, const std::string& key, uint64_t off, std::span<std::byte> dst,
                    ShardFiles& files);
  // The manifest of a step that is whole on tier i (ckpt::read_whole_step); `sizes` is a
  // listing of that tier's objects under the step, taken here when null.
  Result<Manifest> manifest_on(size_t i, uint64_t step,
                               const std::map<std::string, uint64_t>* sizes = nullptr);
  // Reads one chunk from the first tier in `holds` where it is intact; returns that tier.
  // `why` collects the failures of earlier tiers.
  Result<size_t> read_chunk(uint64_t step, const ShardRecord& shard, const TensorEntry& tensor,
                            size_t chunk, const std::vector<int>& holds, std::span<std::byte> dst,
                            ShardFiles& files, std::string& why);

  CheckpointerOptions o_;
  std::unique_ptr<StagingRing> ring_;
  std::mutex save_mu_;                                // one caller stages at a time
  std::vector<std::unique_ptr<CopyHelper>> helpers_;  // used under save_mu_

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<SaveJob>> stage_q_, repl_q_;  // guarded by mu_
  std::set<uint64_t> active_steps_;                        // guarded by mu_
  size_t active_ = 0;                                      // guarded by mu_
  bool stopping_ = false;                                  // guarded by mu_
  std::set<std::pair<size_t, std::string>> live_;          // (tier, marker key); by mu_
  std::thread stage_thread_, repl_thread_, lease_thread_;
};

// ---------------------------------------------------------------------------------------
// Saving.

Result<std::shared_ptr<SaveHandle>> CheckpointerImpl::save(uint64_t step,
                                                           std::span<const TensorView> tensors) {
  auto job = std::make_shared<SaveJob>();
  job->step = step;
  ShardRecord& r = job->record;
  r.series = o_.series;
  r.step = step;
  r.rank = o_.rank;
  r.world = o_.world;
  r.chunk_size = o_.chunk_size;
  r.save_id = fresh_id();
  if (step > kMaxStep)
    return fail(Code::kInvalidArgument,
                "step " + std::to_string(step) + " is over " + std::to_string(kMaxStep));
  std::set<std::string_view> names;
  for (const auto& v : tensors) {
    if (!valid_utf8(v.name) || !valid_utf8(v.dtype))
      return fail(Code::kInvalidArgument,
                  "tensor name or dtype is not UTF-8: '" + v.name.substr(0, 200) + "'");
    if (v.name.empty() || v.name.size() > 4096 || !names.insert(v.name).second)
      return fail(Code::kInvalidArgument,
                  "tensor name empty, over 4096 bytes or repeated: '" + v.name + "'");
    if (v.bytes && !v.data && !v.source)
      return fail(Code::kInvalidArgument, "tensor '" + v.name + "' has no data");
    if (size_t es = dtype_size(v.dtype); es && v.bytes % es)
      return fail(Code::kInvalidArgument, "tensor '" + v.name + "' has " + std::to_string(v.bytes) +
                                              " bytes, not a whole number of " + v.dtype);
    if (v.mode > 07777)
      return fail(Code::kInvalidArgument, "tensor '" + v.name + "' has a bad mode");
    r.tensors.push_back({v.name, v.dtype, v.shape, 0, v.bytes, {}, v.mode});
  }
  r.bytes = layout(r.tensors);
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    const Tier& t = o_.tiers[i];
    if (local_tier(t))
      SLUICE_RETURN_IF_ERROR(
          check_free_space(t, r.bytes, "step " + std::to_string(step) + " of series " + o_.series));
    // The shard, its record and (rank 0) the manifest, against the tier's quota.
    if (Status q = t.store->can_write(shard_key(o_.series, step, o_.rank, r.save_id), r.bytes,
                                      o_.rank == 0 ? 3 : 2);
        !q)
      return std::unexpected(q.error().with_context("checkpoint tier " + t.name + ", step " +
                                                    std::to_string(step) + " of series " +
                                                    o_.series));
    auto st = t.store->stat(manifest_key(o_.series, step));
    if (st)
      return fail(Code::kAlreadyExists, "step " + std::to_string(step) + " of series " + o_.series +
                                            " is already committed on tier " + t.name);
    // An unreachable tier that is not required fails on its own later, and says so.
    if (st.error().code() != Code::kNotFound && t.required) return std::unexpected(st.error());
  }

  std::lock_guard staging(save_mu_);
  {
    // Under save_mu_, so no other save can add the step between this check and the insert.
    std::lock_guard lk(mu_);
    if (active_steps_.count(step))
      return fail(Code::kAlreadyExists, "step " + std::to_string(step) + " of series " + o_.series +
                                            " is being saved already");
  }
  const uint64_t seg = ring_->segment();
  job->segments = (r.bytes + seg - 1) / seg;
  job->fits = job->segments <= ring_->slots();
  job->first_seq = ring_->reserve(job->segments);
  job->handle = std::make_shared<Handle>(step, r.bytes, o_.tiers);
  {
    std::lock_guard lk(mu_);
    ++active_;
    active_steps_.insert(step);
    stage_q_.push_back(job);
    cv_.notify_all();
  }
  // Whatever ends staging early (an error, or an exception from a source) lets the stage
  // writer drain the job instead of waiting for segments that will never come.
  struct StagingGuard {
    SaveJob& job;
    StagingRing& ring;
    bool done = false;
    ~StagingGuard() {
      if (done) return;
      if (!job.abort_error) job.abort_error = Error(Code::kCancelled, "staging was interrupted");
      job.aborted.store(true, std::memory_order_release);
      ring.mark_filled_through(job.first_seq + job.segments);
    }
  } guard{*job, *ring_};
  if (auto st = stage(*job, tensors); !st) {
    job->abort_error = st.error();
    return std::unexpected(st.error());
  }
  guard.done = true;
  return std::shared_ptr<SaveHandle>(job->handle);
}

// Copies bytes [off, off + out.size()) of one tensor into staging.
Status copy_piece(const TensorView& v, uint64_t off, std::span<std::byte> out) {
  if (v.source) return v.source(off, out);
  const auto* src = static_cast<const std::byte*>(v.data) + off;
  if (v.target && v.target->kind() == mem::MemoryKind::kDevice) {
    SLUICE_ASSIGN_OR_RETURN(uint64_t ticket, v.target->copy_to_host(out.data(), src, out.size()));
    return v.target->wait(ticket);
  }
  std::memcpy(out.data(), src, out.size());
  return ok();
}

// Fills shard bytes [a, b) into `dst` (which holds byte a): tensor bytes and the zeros of
// the alignment padding between them.
Status fill_range(const ShardRecord& r, std::span<const TensorView> views, uint64_t a, uint64_t b,
                  std::byte* dst) {
  const auto& ts = r.tensors;
  // The first tensor ending after a: tensors are in offset order.
  size_t t = std::partition_point(ts.begin(), ts.end(),
                                  [&](const TensorEntry& e) { return e.offset + e.bytes <= a; }) -
             ts.begin();
  uint64_t at = a;  // bytes before `at` are filled
  for (size_t i = t; i < ts.size() && ts[i].offset < b; ++i) {
    uint64_t lo = std::max(a, ts[i].offset), hi = std::min(b, ts[i].offset + ts[i].bytes);
    if (lo > at) std::memset(dst + (at - a), 0, lo - at);
    if (hi > lo)
      SLUICE_RETURN_IF_ERROR(copy_piece(views[i], lo - ts[i].offset, {dst + (lo - a), hi - lo}));
    at = std::max(at, hi);
  }
  if (b > at) std::memset(dst + (at - a), 0, b - at);
  return ok();
}

Status CheckpointerImpl::stage(SaveJob& job, std::span<const TensorView> views) {
  const uint64_t seg = ring_->segment();
  const size_t parts = helpers_.size() + 1;
  for (uint64_t k = 0; k < job.segments; ++k) {
    const uint64_t q = job.first_seq + k;
    ring_->wait_free(q);
    SLUICE_RETURN_IF_ERROR(check_cancel());
    std::byte* dst = ring_->slot(q);
    const uint64_t a = k * seg, b = std::min(job.record.bytes, a + seg);
    // The segment is cut in `parts` page-aligned pieces copied at once; the caller's
    // thread takes the first.
    const uint64_t piece =
        (b - a + parts * kTensorAlignment - 1) / (parts * kTensorAlignment) * kTensorAlignment;
    size_t posted = 0;
    for (size_t h = 0; h < helpers_.size() && a + (h + 1) * piece < b; ++h, ++posted) {
      uint64_t lo = a + (h + 1) * piece, hi = std::min(b, lo + piece);
      helpers_[h]->post(
          [&, lo, hi] { return fill_range(job.record, views, lo, hi, dst + (lo - a)); });
    }
    Status st = fill_range(job.record, views, a, std::min(b, a + piece), dst);
    for (size_t h = 0; h < posted; ++h)
      if (Status hs = helpers_[h]->wait(); st && !hs) st = hs;
    if (!st) return st;
    ring_->mark_filled_through(q + 1);
    job.handle->staged(b);
    if (job.abandoned.load(std::memory_order_acquire))
      return std::unexpected(
          Error(Code::kCancelled, "save of step " + std::to_string(job.step) +
                                      " stopped: " + job.abandon_error->message()));
  }
  return ok();
}

std::shared_ptr<SaveJob> CheckpointerImpl::take(std::deque<std::shared_ptr<SaveJob>>& q) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stopping_ || !q.empty(); });
  if (q.empty()) return nullptr;
  auto job = q.front();
  q.pop_front();
  return job;
}

void CheckpointerImpl::stage_loop() {
  while (std::shared_ptr<SaveJob> job = take(stage_q_)) {
    // The first tier that takes the shard; with the whole shard in the ring, a failure
    // moves on to the next tier, else only the first can be written.
    const size_t last = job->fits ? o_.tiers.size() : 1;
    std::optional<Error> error;
    for (size_t i = 0; i < last && job->source_tier < 0; ++i) {
      job->handle->set(i, TierState::kWriting);
      auto chunks = write_from_ring(*job, i);
      if (chunks) {
        job->record.tensors = std::move(*chunks);
        job->source_tier = static_cast<int>(i);
      } else {
        error = chunks.error();
        job->handle->set(i, TierState::kFailed, chunks.error());
        if (!job->fits) {
          // Nothing else can take a streamed shard: stop the caller and free the ring.
          job->abandon_error = chunks.error();
          job->abandoned.store(true, std::memory_order_release);
          ring_->release_through(job->first_seq + job->segments);
        }
        if (job->aborted.load(std::memory_order_acquire)) break;
      }
    }
    if ((job->fits || job->source_tier < 0) && job->segments > 0) {
      // Wait until the caller has staged all of it (or given up), then free it.
      ring_->wait_filled(job->first_seq + job->segments - 1);
      ring_->release_through(job->first_seq + job->segments);
    }
    if (job->source_tier < 0) {
      Error e =
          job->aborted.load(std::memory_order_acquire)
              ? Error(Code::kCancelled, "save of step " + std::to_string(job->step) +
                                            " failed while staging: " + job->abort_error->message())
              : error.value_or(Error(Code::kInternal, "no tier written"));
      for (size_t i = 0; i < o_.tiers.size(); ++i)
        if (job->handle->state(i) == TierState::kPending)
          job->handle->set(i, TierState::kSkipped, e);
      finish(*job);
      continue;
    }
    std::lock_guard lk(mu_);
    repl_q_.push_back(job);
    cv_.notify_all();
  }
}

Result<std::vector<TensorEntry>> CheckpointerImpl::write_from_ring(SaveJob& job, size_t i) {
  const Tier& tier = o_.tiers[i];
  const uint64_t seg = ring_->segment(), total = job.record.bytes;
  const std::string key = shard_key(o_.series, job.step, o_.rank, job.record.save_id);
  std::vector<TensorEntry> tensors = job.record.tensors;
  for (auto& t : tensors) t.chunks.clear();
  ChunkHasher hasher(tensors, o_.chunk_size);

  SLUICE_RETURN_IF_ERROR(check_not_committed(tier, job.step));
  hold_step(job, i);
  store::WriteOptions wo;
  wo.size_hint = total;
  wo.overwrite = false;  // another save of the step publishing first wins; this one fails
  wo.mode = 0600;        // a shard may hold secrets (keys, private data): its owner's only
  SLUICE_ASSIGN_OR_RETURN(auto writer, tier.store->create(key, wo));
  std::optional<io::FileHandle> fh;
  if (local_tier(tier) && !writer->local_path().empty() && total > 0) {
    io::OpenOptions oo;
    oo.write = true;
    auto h = io::FileHandle::open(o_.io, writer->local_path(), oo);
    if (!h) return std::unexpected(h.error());
    fh.emplace(std::move(*h));
  }
  // Up to four segments in flight on the data path; released in order once written,
  // unless the whole shard stays in the ring until it is published.
  std::deque<std::pair<uint64_t, std::future<Result<size_t>>>> inflight;
  // Streaming, the segments in flight are not yet free for the caller: holding every slot
  // of the ring while waiting for the caller to fill the next one would deadlock.
  const size_t depth =
      job.fits ? 4 : static_cast<size_t>(std::min<uint64_t>(4, ring_->slots() - 1));
  auto retire = [&]() -> Status {
    auto [k, f] = std::move(inflight.front());
    inflight.pop_front();
    auto n = f.get();
    if (!n) return std::unexpected(n.error());
    job.handle->written(i, std::min(total, (k + 1) * seg));
    if (!job.fits) ring_->release_through(job.first_seq + k + 1);
    return ok();
  };
  Status status = ok();
  for (uint64_t k = 0; k < job.segments && status; ++k) {
    const uint64_t q = job.first_seq + k;
    ring_->wait_filled(q);
    if (status = check_cancel(); !status) break;
    if (job.aborted.load(std::memory_order_acquire)) {
      status = std::unexpected(Error(Code::kCancelled, "staging failed"));
      break;
    }
    const uint64_t a = k * seg, n = std::min(seg, total - a);
    std::span<const std::byte> bytes(ring_->slot(q), n);
    hasher.feed(a, bytes);
    if (fh) {
      inflight.emplace_back(k, fh->write_async(io::Buffer::host(bytes.data(), n), n, a));
      if (inflight.size() >= depth) status = retire();
    } else {
      status = writer->positional() ? writer->write_at(a, bytes) : writer->append(bytes);
      if (status) {
        job.handle->written(i, a + n);
        if (!job.fits) ring_->release_through(q + 1);
      }
    }
  }
  while (!inflight.empty()) {
    Status st = retire();
    if (status && !st) status = st;
  }
  if (status && fh) status = writer->extend_to(total);
  if (status) status = writer->commit();
  if (!status) {
    writer->abort();
    return std::unexpected(
        Error(status.error().code(),
              "writing shard " + key + " to tier " + tier.name + ": " + status.error().message()));
  }
  return tensors;
}

void CheckpointerImpl::replicate_loop() {
  while (std::shared_ptr<SaveJob> job = take(repl_q_)) {
    const size_t src = static_cast<size_t>(job->source_tier);
    auto commit_on = [&](size_t i) {
      if (auto st = publish_record_and_commit(*job, i); !st) {
        // A save that failed takes back the shard it published: nothing is left for gc's
        // grace (a full tier stays full otherwise), and the loser of two saves of one step
        // leaves no orphan. Only where no manifest can name it: another save committed the
        // step (AlreadyExists, or a manifest without this shard), the tier refused the
        // record (full, over quota), or rank 0 failed before committing. A rank that gave up
        // waiting, or could not read the tier for a moment, keeps it: rank 0 may commit.
        const Code code = st.error().code();
        const bool unnamed = code == Code::kAlreadyExists || code == Code::kNoSpace ||
                             code == Code::kQuotaExceeded ||
                             (code == Code::kConflict && o_.rank != 0) ||
                             (o_.rank == 0 && code != Code::kUnavailable &&
                              code != Code::kIoError && code != Code::kTimedOut);
        if (unnamed)
          (void)o_.tiers[i].store->remove(
              shard_key(o_.series, job->step, o_.rank, job->record.save_id));
        job->handle->set(i, TierState::kFailed, st.error());
        return false;
      }
      job->handle->set(i, TierState::kCommitted);
      if (o_.gc_after_save && o_.rank == 0) {
        GcReport ignored;
        (void)gc_tier(i, ignored);  // retention is best effort; `gc` reports its errors
      }
      return true;
    };
    if (!commit_on(src)) {
      // Copies are made from a committed copy only.
      Error e(Code::kCancelled, "not copied: the commit on tier " + o_.tiers[src].name + " failed");
      for (size_t i = src + 1; i < o_.tiers.size(); ++i)
        job->handle->set(i, TierState::kSkipped, e);
      finish(*job);
      continue;
    }
    const std::string key = shard_key(o_.series, job->step, o_.rank, job->record.save_id);
    for (size_t i = src + 1; i < o_.tiers.size(); ++i) {
      job->handle->set(i, TierState::kWriting);
      xfer::CopyOptions co;
      co.overwrite = false;
      co.cancel = o_.cancel;
      co.on_progress = [&](const xfer::CopyProgress& p) { job->handle->written(i, p.bytes_done); };
      Status cleared = check_not_committed(o_.tiers[i], job->step);
      if (cleared) hold_step(*job, i);
      Result<store::ObjectInfo> copied =
          cleared ? xfer::copy(*o_.tiers[src].store, key, *o_.tiers[i].store, key, co)
                  : Result<store::ObjectInfo>(std::unexpected(cleared.error()));
      if (copied && copied->etag != job->source_etag) {
        (void)o_.tiers[i].store->remove(key);  // bytes of another version: never recorded
        copied = fail(Code::kConflict,
                      key + " on tier " + o_.tiers[src].name + " changed after it was committed");
      }
      if (!copied) {
        job->handle->set(
            i, TierState::kFailed,
            Error(copied.error().code(), "copying shard " + key + " to tier " + o_.tiers[i].name +
                                             ": " + copied.error().message()));
        continue;
      }
      commit_on(i);
    }
    finish(*job);
  }
}

void CheckpointerImpl::finish(SaveJob& job) {
  const std::string key = live_key(o_.series, job.step, o_.rank, job.record.save_id);
  std::vector<size_t> held;
  {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < o_.tiers.size(); ++i)
      if (live_.erase({i, key})) held.push_back(i);
  }
  for (size_t i : held) (void)o_.tiers[i].store->remove(key);  // gc takes a stale one
  std::lock_guard lk(mu_);
  active_steps_.erase(job.step);
  --active_;
  cv_.notify_all();
}

void CheckpointerImpl::hold_step(const SaveJob& job, size_t i) {
  const std::string key = live_key(o_.series, job.step, o_.rank, job.record.save_id);
  const std::string text = live_text();
  (void)o_.tiers[i].store->put(key, std::as_bytes(std::span(text)));
  std::lock_guard lk(mu_);
  live_.insert({i, key});
}

void CheckpointerImpl::lease_loop() {
  const std::string text = live_text();
  std::unique_lock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, kLiveRefresh, [&] { return stopping_; });
    if (stopping_) break;
    const auto markers = live_;
    lk.unlock();
    for (const auto& marker : markers) {
      {
        // finish() may have removed it meanwhile: never write a marker back.
        std::lock_guard again(mu_);
        if (!live_.contains(marker)) continue;
      }
      (void)o_.tiers[marker.first].store->put(marker.second, std::as_bytes(std::span(text)));
    }
    lk.lock();
  }
}

Status CheckpointerImpl::check_not_committed(const Tier& tier, uint64_t step) {
  auto st = tier.store->stat(manifest_key(o_.series, step));
  if (st)
    return fail(Code::kAlreadyExists, "step " + std::to_string(step) + " of series " + o_.series +
                                          " is already committed on tier " + tier.name);
  if (st.error().code() != Code::kNotFound) return std::unexpected(st.error());
  return ok();
}

Status CheckpointerImpl::publish_record_and_commit(SaveJob& job, size_t i) {
  const Tier& tier = o_.tiers[i];
  ShardRecord rec = job.record;
  SLUICE_ASSIGN_OR_RETURN(auto info,
                          tier.store->stat(shard_key(o_.series, job.step, o_.rank, rec.save_id)));
  if (info.size != rec.bytes)
    return fail(Code::kCorruption, "shard " + info.key + " on tier " + tier.name + " has " +
                                       std::to_string(info.size) + " bytes, not " +
                                       std::to_string(rec.bytes));
  rec.etag = info.etag;
  rec.created_ns = now_ns();
  rec.run_id = o_.run_id;
  if (static_cast<int>(i) == job.source_tier) job.source_etag = info.etag;
  const std::string text = encode_record(rec);
  SLUICE_RETURN_IF_ERROR(
      tier.store->put(record_key(o_.series, job.step, o_.rank), std::as_bytes(std::span(text))));
  if (o_.rank != 0) return wait_for_commit(i, job.step, rec.save_id);

  // Rank 0 commits once every rank's record is there and names the shard now published.
  Manifest m;
  m.series = o_.series;
  m.step = job.step;
  m.world = o_.world;
  m.created_ns = now_ns();
  m.shards.resize(o_.world);
  m.shards[0] = rec;
  std::vector<bool> have(o_.world, false);
  have[0] = true;
  const auto deadline = Clock::now() + o_.commit_timeout;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    for (unsigned r = 1; r < o_.world; ++r) {
      if (have[r]) continue;
      const std::string rk = record_key(o_.series, job.step, r);
      auto doc = read_document(*tier.store, rk);
      if (!doc) {
        if (doc.error().code() == Code::kNotFound) continue;
        return std::unexpected(doc.error());
      }
      auto got = decode_record(*doc, rk + " on tier " + tier.name);
      if (!got) return std::unexpected(got.error());
      if (got->series != o_.series || got->step != job.step || got->rank != r ||
          got->world != o_.world)
        return fail(Code::kCorruption,
                    rk + " on tier " + tier.name + " describes another rank, step or world");
      // A record of another run (an earlier attempt at this step that crashed) is not this
      // save's: wait for this run's rank to replace it.
      if (got->run_id != o_.run_id) continue;
      if (got->chunk_size != o_.chunk_size)
        return fail(Code::kInvalidArgument,
                    rk + " on tier " + tier.name + ": rank " + std::to_string(r) +
                        " uses chunks of " + std::to_string(got->chunk_size) +
                        " bytes, rank 0 of " + std::to_string(o_.chunk_size));
      // The record names the shard now published (not one replaced since).
      auto sh = tier.store->stat(shard_key(o_.series, job.step, r, got->save_id));
      if (!sh || sh->etag != got->etag || sh->size != got->bytes) continue;
      m.shards[r] = std::move(*got);
      have[r] = true;
    }
    if (std::all_of(have.begin(), have.end(), [](bool b) { return b; })) break;
    if (Clock::now() >= deadline) {
      std::string missing;
      for (unsigned r = 0; r < o_.world; ++r)
        if (!have[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return fail(Code::kTimedOut, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                       ": no shard record from rank(s) " + missing + " after " +
                                       std::to_string(o_.commit_timeout.count()) + " ms");
    }
    SLUICE_RETURN_IF_ERROR(check_cancel());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  // The manifest may only name what is there now: a shard or record removed while rank 0
  // waited (a gc in another process, an operator) must fail the commit, not be named.
  for (const ShardRecord& sh : m.shards) {
    const std::string sk = shard_key(o_.series, job.step, sh.rank, sh.save_id);
    auto now = tier.store->stat(sk);
    if (!now || now->size != sh.bytes || (!sh.etag.empty() && now->etag != sh.etag))
      return fail(Code::kConflict, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                       ": shard " + sk + " of rank " + std::to_string(sh.rank) +
                                       " was removed or replaced before the commit; nothing "
                                       "was committed");
  }
  const std::string text_m = encode_manifest(m);
  const std::string mkey = manifest_key(o_.series, job.step);
  store::WriteOptions wo;
  wo.overwrite = false;
  auto st = tier.store->put(mkey, std::as_bytes(std::span(text_m)), wo);
  if (!st && st.error().code() == Code::kAlreadyExists)
    return fail(Code::kAlreadyExists, "step " + std::to_string(job.step) + " of series " +
                                          o_.series + " was committed on tier " + tier.name +
                                          " by another save");
  if (!st) return st;
  // And is whole once written (a removal racing the write above): else it is taken back.
  // Only a step seen to be broken is taken back: a tier that cannot be read for a moment
  // says nothing against the commit just made (and other ranks may have reported it).
  if (auto whole = manifest_on(i, job.step);
      !whole &&
      (whole.error().code() == Code::kNotFound || whole.error().code() == Code::kCorruption)) {
    (void)tier.store->remove(mkey);
    return fail(Code::kConflict, "step " + std::to_string(job.step) + " on tier " + tier.name +
                                     " was not whole once committed, so the commit was taken "
                                     "back: " +
                                     whole.error().message());
  }
  return ok();
}

Status CheckpointerImpl::wait_for_commit(size_t i, uint64_t step, const std::string& save_id) {
  const auto deadline = Clock::now() + o_.commit_timeout;
  auto pause = std::chrono::milliseconds(20);
  const std::string key = manifest_key(o_.series, step);
  for (;;) {
    auto st = o_.tiers[i].store->stat(key);
    if (st) {
      // Committed: and whole, naming this rank's shard as published (else nothing restores).
      // A tier that cannot be read for a moment is asked again.
      auto got = manifest_on(i, step);
      if (!got && got.error().code() != Code::kNotFound &&
          got.error().code() != Code::kCorruption && Clock::now() < deadline) {
        std::this_thread::sleep_for(pause);
        continue;
      }
      if (!got) return std::unexpected(got.error());
      const Manifest& m = *got;
      if (m.shards.size() != o_.world || m.shards[o_.rank].save_id != save_id)
        return fail(Code::kConflict, "step " + std::to_string(step) + " on tier " +
                                         o_.tiers[i].name +
                                         " was committed by another save, without this rank's "
                                         "shard");
      return ok();
    }
    if (st.error().code() != Code::kNotFound) return std::unexpected(st.error());
    if (Clock::now() >= deadline)
      return fail(Code::kTimedOut, "step " + std::to_string(step) + " on tier " + o_.tiers[i].name +
                                       ": rank 0 did not commit within " +
                                       std::to_string(o_.commit_timeout.count()) + " ms");
    SLUICE_RETURN_IF_ERROR(check_cancel());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

// ---------------------------------------------------------------------------------------
// Reading.

Status CheckpointerImpl::read_shard(size_t i, const std::string& key, uint64_t off,
                                    std::span<std::byte> dst, ShardFiles& files) {
  const Tier& tier = o_.tiers[i];
  size_t n = 0;
  if (local_tier(tier)) {
    // Through the data path: O_DIRECT straight into the caller's memory where aligned.
    SLUICE_ASSIGN_OR_RETURN(io::FileHandle * fh, files.get(o_.io, tier.local_dir + "/" + key));
    SLUICE_ASSIGN_OR_RETURN(n, fh->read(io::Buffer::host(dst.data(), dst.size()), dst.size(), off));
  } else {
    SLUICE_ASSIGN_OR_RETURN(n, tier.store->read_full(key, off, dst));
  }
  if (n != dst.size())
    return fail(Code::kCorruption, key + " on tier " + tier.name + " ends at " +
                                       std::to_string(off + n) + ", before " +
                                       std::to_string(off + dst.size()));
  return ok();
}

Result<Manifest> CheckpointerImpl::manifest_on(size_t i, uint64_t step,
                                               const std::map<std::string, uint64_t>* sizes) {
  const Tier& tier = o_.tiers[i];
  std::map<std::string, uint64_t> listed;
  if (!sizes) {
    SLUICE_ASSIGN_OR_RETURN(auto objs, tier.store->list_all(step_prefix(o_.series, step)));
    for (const auto& obj : objs) listed[obj.key] = obj.size;
    sizes = &listed;
  }
  return read_whole_step(*tier.store, o_.series, step, *sizes, "tier " + tier.name);
}

Result<Manifest> CheckpointerImpl::manifest(uint64_t step) {
  std::optional<Error> first;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    auto m = manifest_on(i, step);
    if (m) return m;
    if (!first || first->code() == Code::kNotFound) first = m.error();
  }
  return std::unexpected(first.value_or(Error(Code::kNotFound, "no tiers")));
}

Result<std::vector<StepInfo>> CheckpointerImpl::list() {
  std::map<uint64_t, StepInfo> steps;
  std::optional<Error> unreachable;
  size_t listed = 0;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    // A tier that cannot be listed (S3 down) leaves the others' checkpoints usable.
    auto objs = o_.tiers[i].store->list_all(o_.series + "/step-");
    if (!objs) {
      unreachable = objs.error();
      continue;
    }
    ++listed;
    std::map<std::string, uint64_t> sizes;
    std::vector<uint64_t> with_manifest;
    for (const auto& obj : *objs) {
      sizes[obj.key] = obj.size;
      uint64_t step = 0;
      std::string leaf;
      if (parse_step_key(o_.series, obj.key, step, leaf) && leaf == "manifest.json")
        with_manifest.push_back(step);
    }
    // Only a whole copy counts: a damaged manifest or a lost shard is not a checkpoint here.
    for (uint64_t step : with_manifest) {
      auto m = manifest_on(i, step, &sizes);
      if (!m) continue;
      StepInfo& s = steps[step];
      if (s.tiers.empty()) {
        s.step = step;
        s.bytes = m->bytes();
        s.created_ns = m->created_ns;
      }
      s.tiers.push_back(o_.tiers[i].name);
    }
  }
  if (listed == 0 && unreachable) return std::unexpected(*unreachable);
  std::vector<StepInfo> out;
  for (auto& [step, s] : steps) out.push_back(std::move(s));
  return out;
}

Result<uint64_t> CheckpointerImpl::latest() {
  SLUICE_ASSIGN_OR_RETURN(auto steps, list());
  if (!steps.empty()) return steps.back().step;
  return fail(Code::kNotFound, "series " + o_.series + " has no committed checkpoint on " +
                                   std::to_string(o_.tiers.size()) + " tier(s)");
}

// One chunk of one tensor to read and check.
struct ChunkTask {
  const ShardRecord* shard;
  const TensorEntry* tensor;
  size_t chunk;
  std::byte* host_dst;     // null: read into a bounce buffer
  const TensorDest* dest;  // for device destinations
};

Result<RestoreReport> CheckpointerImpl::restore(uint64_t step, std::span<const TensorDest> dests) {
  const auto t0 = Clock::now();
  std::vector<int> holds(o_.tiers.size(), 0);  // tiers whose committed copy we may read
  std::optional<Manifest> m;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    auto got = manifest_on(i, step);
    if (!got) continue;
    if (!m) m = std::move(*got);
    holds[i] = 1;
  }
  if (!m) return std::unexpected(manifest(step).error());  // NotFound, or the corruption

  std::vector<ChunkTask> tasks;
  std::set<std::tuple<unsigned, std::string_view, uint64_t>> taken;
  for (const auto& d : dests) {
    const ShardRecord* shard = nullptr;
    const TensorEntry* tensor = nullptr;
    auto find_in = [&](const ShardRecord& s) {
      for (const auto& t : s.tensors)
        if (t.name == d.name) return &t;
      return static_cast<const TensorEntry*>(nullptr);
    };
    unsigned want = d.rank >= 0 ? static_cast<unsigned>(d.rank) : o_.rank;
    if (want < m->shards.size() && (tensor = find_in(m->shards[want]))) shard = &m->shards[want];
    if (!tensor && d.rank < 0) {
      for (const auto& s : m->shards)
        if (const TensorEntry* t = find_in(s)) {
          if (tensor)
            return fail(Code::kInvalidArgument, "tensor '" + d.name +
                                                    "' is in several shards of step " +
                                                    std::to_string(step) + ": name its rank");
          tensor = t;
          shard = &s;
        }
    }
    if (!tensor)
      return fail(Code::kNotFound, "step " + std::to_string(step) + " of series " + o_.series +
                                       " has no tensor '" + d.name + "'");
    const uint64_t cs = shard->chunk_size, end = d.offset + d.bytes;
    if (d.offset > tensor->bytes || d.bytes > tensor->bytes - d.offset || d.offset % cs ||
        (end != tensor->bytes && end % cs))
      return fail(Code::kInvalidArgument,
                  "tensor '" + d.name + "' has " + std::to_string(tensor->bytes) +
                      " bytes; the destination asks for " + std::to_string(d.bytes) + " at " +
                      std::to_string(d.offset) + " (parts must start and end on chunks of " +
                      std::to_string(cs) + " bytes, or at the tensor's end)");
    if (d.bytes && !d.data)
      return fail(Code::kInvalidArgument, "no destination memory for tensor '" + d.name + "'");
    if (!taken.insert({shard->rank, tensor->name, d.offset}).second)
      return fail(Code::kInvalidArgument, "tensor '" + d.name + "' is asked for twice");
    bool device = d.target && d.target->kind() == mem::MemoryKind::kDevice;
    for (uint64_t c = d.offset / cs; c * cs < end; ++c)
      tasks.push_back({shard, tensor, c,
                       device ? nullptr : static_cast<std::byte*>(d.data) + (c * cs - d.offset),
                       &d});
  }

  RestoreReport report;
  report.bytes_by_tier.assign(o_.tiers.size(), 0);
  std::mutex mu;
  ShardFiles files;
  // Bounce buffers for device destinations, one per reading thread at most.
  BufferPool bounce(m->shards.empty() ? kDirectAlignment : m->shards[0].chunk_size,
                    o_.restore_parallel);
  Status done = parallel_for(tasks.size(), o_.restore_parallel, [&](size_t k) -> Status {
    SLUICE_RETURN_IF_ERROR(check_cancel());
    const ChunkTask& t = tasks[k];
    const uint64_t at = t.chunk * t.shard->chunk_size;
    const uint64_t n = std::min(t.shard->chunk_size, t.tensor->bytes - at);
    PooledBuffer buf;
    std::byte* dst = t.host_dst;
    if (!dst) {
      SLUICE_ASSIGN_OR_RETURN(buf, bounce.acquire());
      dst = buf.data();
    }
    std::string why;
    auto served = read_chunk(step, *t.shard, *t.tensor, t.chunk, holds, {dst, n}, files, why);
    {
      std::lock_guard lk(mu);
      if (!why.empty()) report.problems.push_back(why);
      if (!served) return std::unexpected(served.error());
      report.bytes_by_tier[*served] += n;
      report.bytes += n;
      if (!why.empty()) ++report.chunks_failed_over;
    }
    if (!t.host_dst) {
      SLUICE_ASSIGN_OR_RETURN(
          uint64_t ticket,
          t.dest->target->copy_to_target(
              static_cast<std::byte*>(t.dest->data) + (at - t.dest->offset), dst, n));
      SLUICE_RETURN_IF_ERROR(t.dest->target->wait(ticket));
    }
    return ok();
  });
  if (!done) return std::unexpected(done.error());
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

Result<size_t> CheckpointerImpl::read_chunk(uint64_t step, const ShardRecord& shard,
                                            const TensorEntry& tensor, size_t chunk,
                                            const std::vector<int>& holds, std::span<std::byte> dst,
                                            ShardFiles& files, std::string& why) {
  const std::string key = shard_key(o_.series, step, shard.rank, shard.save_id);
  const uint64_t at = tensor.offset + chunk * shard.chunk_size;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    if (!holds[i]) continue;
    auto st = read_shard(i, key, at, dst, files);
    if (st && xxh3_64(dst.data(), dst.size()) != tensor.chunks[chunk])
      st = fail(Code::kCorruption, key + " on tier " + o_.tiers[i].name + ": chunk " +
                                       std::to_string(chunk) + " of tensor '" + tensor.name +
                                       "' does not match its checksum");
    if (st) return i;
    why += (why.empty() ? "" : "; ") + st.error().message();
  }
  return fail(Code::kCorruption, "chunk " + std::to_string(chunk) + " of tensor '" + tensor.name +
                                     "' (step " + std::to_string(step) + ", rank " +
                                     std::to_string(shard.rank) + ") is intact on no tier: " + why);
}

Result<VerifyReport> CheckpointerImpl::verify(uint64_t step, int tier) {
  if (tier >= static_cast<int>(o_.tiers.size()))
    return fail(Code::kInvalidArgument, "no tier " + std::to_string(tier));
  VerifyReport report;
  std::mutex mu;
  ShardFiles files;
  bool any = false;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    if (tier >= 0 && static_cast<size_t>(tier) != i) continue;
    auto m = manifest_on(i, step);
    if (!m) {
      if (m.error().code() == Code::kNotFound) {
        if (tier >= 0) return std::unexpected(m.error());  // no copy there: not a bad one
        continue;
      }
      report.problems.push_back(m.error().message());
      ++report.bad_chunks;
      any = true;
      continue;
    }
    any = true;
    std::vector<int> only(o_.tiers.size(), 0);
    only[i] = 1;
    struct Item {
      const ShardRecord* shard;
      const TensorEntry* tensor;
      size_t chunk;
    };
    std::vector<Item> items;
    for (const auto& s : m->shards) {
      const std::string sk = shard_key(o_.series, step, s.rank, s.save_id);
      auto info = o_.tiers[i].store->stat(sk);
      if (!info || info->size != s.bytes) {
        std::lock_guard lk(mu);
        report.problems.push_back(
            sk + " on tier " + o_.tiers[i].name + ": " +
            (info ? "has " + std::to_string(info->size) + " bytes, not " + std::to_string(s.bytes)
                  : info.error().message()));
      }
      for (const auto& t : s.tensors)
        for (size_t c = 0; c < t.chunks.size(); ++c) items.push_back({&s, &t, c});
    }
    BufferPool pool(m->shards.empty() ? kDirectAlignment : m->shards[0].chunk_size,
                    o_.restore_parallel);
    Status done = parallel_for(items.size(), o_.restore_parallel, [&](size_t k) -> Status {
      const Item& it = items[k];
      SLUICE_ASSIGN_OR_RETURN(auto buf, pool.acquire());
      const uint64_t n =
          std::min(it.shard->chunk_size, it.tensor->bytes - it.chunk * it.shard->chunk_size);
      std::string why;
      auto served =
          read_chunk(step, *it.shard, *it.tensor, it.chunk, only, {buf.data(), n}, files, why);
      std::lock_guard lk(mu);
      ++report.chunks;
      if (!served) {
        ++report.bad_chunks;
        report.problems.push_back(why);
      }
      return ok();
    });
    if (!done) return std::unexpected(done.error());
  }
  if (!any)
    return fail(Code::kNotFound, "step " + std::to_string(step) + " of series " + o_.series +
                                     " is committed on no tier");
  return report;
}

// ---------------------------------------------------------------------------------------
// Retention and clean-up.

Status CheckpointerImpl::gc_tier(size_t i, GcReport& report) {
  const Tier& tier = o_.tiers[i];
  SLUICE_ASSIGN_OR_RETURN(auto objs, tier.store->list_all(o_.series + "/step-"));
  struct StepObjects {
    bool has_manifest = false;
    bool committed = false;
    int64_t newest_ns = 0;
    std::vector<std::string> keys;
    std::vector<store::ObjectInfo> shards;
    std::vector<store::ObjectInfo> markers;  // of saves under way, or stale ones
    bool live = false;                       // a marker holds the step
    size_t records = 0;
  };
  std::map<uint64_t, StepObjects> steps;
  std::map<std::string, uint64_t> sizes;
  for (const auto& obj : objs) {
    uint64_t step = 0;
    std::string leaf;
    if (!parse_step_key(o_.series, obj.key, step, leaf)) continue;
    StepObjects& s = steps[step];
    if (leaf == "manifest.json") s.has_manifest = true;
    if (leaf.ends_with(".shard")) s.shards.push_back(obj);
    if (leaf.ends_with(".json") && leaf != "manifest.json") ++s.records;
    if (is_live_leaf(leaf)) s.markers.push_back(obj);
    s.newest_ns = std::max(s.newest_ns, obj.mtime_ns);
    s.keys.push_back(obj.key);
    sizes[obj.key] = obj.size;
  }
  // A step a save is still writing or committing (here or in another process) is left
  // alone whatever the grace: its marker holds it (live.h).
  const int64_t now = now_ns();
  for (auto& [step, s] : steps)
    for (const auto& mk : s.markers)
      if (live_marker_holds(*tier.store, mk, now)) s.live = true;
  // Only a whole copy is a checkpoint (read_whole_step): a step whose manifest is damaged or
  // whose shard is lost or truncated is not counted towards keep_last and never stands in
  // for the newest one; it is removed like an unfinished save once past the grace.
  for (auto& [step, s] : steps) s.committed = s.has_manifest && manifest_on(i, step, &sizes);
  std::set<uint64_t> active;
  {
    std::lock_guard lk(mu_);
    active = active_steps_;
  }
  std::vector<uint64_t> committed;
  for (const auto& [step, s] : steps)
    if (s.committed) committed.push_back(step);
  const Retention& r = tier.retention;
  std::set<uint64_t> keep;
  // The newest checkpoint that restores is never removed.
  if (!committed.empty()) keep.insert(committed.back());
  for (size_t k = 0; k < committed.size(); ++k) {
    bool in_last = r.keep_last == 0 || committed.size() - k <= r.keep_last;
    bool every = r.keep_every && committed[k] % r.keep_every == 0;
    if (in_last || every) keep.insert(committed[k]);
  }
  const int64_t cutoff =
      now_ns() - std::chrono::duration_cast<std::chrono::nanoseconds>(o_.incomplete_grace).count();
  for (auto& [step, s] : steps) {
    if (active.count(step) || s.live) continue;
    if (s.committed && keep.count(step)) {
      // Markers left by a killed save of a step that got committed all the same.
      for (const auto& mk : s.markers) {
        auto rm = tier.store->remove(mk.key);
        if (!rm && rm.error().code() != Code::kNotFound) return rm;
        ++report.objects_removed;
      }
    }
    if (s.committed && keep.count(step) && s.shards.size() > s.records) {
      // A kept checkpoint with more shards than ranks: the others are of attempts that lost
      // the race to commit, or crashed; once stale they go.
      auto m = manifest_on(i, step, &sizes);
      if (!m) continue;
      std::set<std::string> named;
      for (const auto& sh : m->shards)
        named.insert(shard_key(o_.series, step, sh.rank, sh.save_id));
      for (const auto& obj : s.shards) {
        if (named.count(obj.key) || obj.mtime_ns > cutoff) continue;
        auto rm = tier.store->remove(obj.key);
        if (!rm && rm.error().code() != Code::kNotFound) return rm;
        ++report.objects_removed;
      }
      continue;
    }
    if (s.committed ? keep.count(step) != 0 : s.newest_ns > cutoff) continue;
    if (s.has_manifest) {
      // The manifest goes first: a half-removed checkpoint is no longer listed.
      SLUICE_RETURN_IF_ERROR(tier.store->remove(manifest_key(o_.series, step)));
      std::erase(s.keys, manifest_key(o_.series, step));
    }
    if (s.committed) {
      report.removed_steps.push_back(step);
    } else {
      report.removed_incomplete.push_back(step);
    }
    SLUICE_RETURN_IF_ERROR(tier.store->remove_many(s.keys));
    report.objects_removed += s.keys.size() + (s.has_manifest ? 1 : 0);
  }
  if (local_tier(tier))
    remove_empty_step_dirs(tier.local_dir + "/" + o_.series, o_.series, active,
                           o_.incomplete_grace);
  return ok();
}

Result<GcReport> CheckpointerImpl::gc() {
  GcReport report;
  for (size_t i = 0; i < o_.tiers.size(); ++i) SLUICE_RETURN_IF_ERROR(gc_tier(i, report));
  std::sort(report.removed_steps.begin(), report.removed_steps.end());
  report.removed_steps.erase(std::unique(report.removed_steps.begin(), report.removed_steps.end()),
                             report.removed_steps.end());
  std::sort(report.removed_incomplete.begin(), report.removed_incomplete.end());
  report.removed_incomplete.erase(
      std::unique(report.removed_incomplete.begin(), report.removed_incomplete.end()),
      report.removed_incomplete.end());
  return report;
}

Result<SyncReport> CheckpointerImpl::sync(std::optional<uint64_t> only) {
  SyncReport report;
  SLUICE_ASSIGN_OR_RETURN(auto steps, list());
  for (const StepInfo& info : steps) {
    if (only && info.step != *only) continue;
    const uint64_t step = info.step;
    auto note = [&](const std::string& why) {
      report.problems.push_back("step " + std::to_string(step) + ": " + why);
    };
    // The source: the nearest tier whose copy is complete and intact.
    std::optional<size_t> src;
    std::optional<Manifest> m;
    std::vector<size_t> missing;
    for (size_t i = 0; i < o_.tiers.size(); ++i) {
      auto got = manifest_on(i, step);
      if (!got) {
        if (got.error().code() == Code::kNotFound)
          missing.push_back(i);
        else
          note("tier " + o_.tiers[i].name + ": " + got.error().message());
        continue;
      }
      if (src) continue;
      auto v = verify(step, static_cast<int>(i));
      if (v && v->bad_chunks == 0 && v->problems.empty()) {
        src = i;
        m = std::move(*got);
      } else {
        note("the copy on tier " + o_.tiers[i].name + " does not verify");
      }
    }
    if (missing.empty()) continue;
    if (!src) {
      note("no intact copy to copy from");
      continue;
    }
    for (size_t t : missing) {
      const Tier& dst = o_.tiers[t];
      Manifest out = *m;
      out.created_ns = now_ns();
      uint64_t bytes = 0;
      Status st = ok();
      for (auto& shard : out.shards) {
        const std::string key = shard_key(o_.series, step, shard.rank, shard.save_id);
        auto copied = xfer::copy(*o_.tiers[*src].store, key, *dst.store, key);
        if (!copied) {
          st = std::unexpected(copied.error());
          break;
        }
        auto stat = dst.store->stat(key);
        if (!stat) {
          st = std::unexpected(stat.error());
          break;
        }
        shard.etag = stat->etag;
        shard.created_ns = now_ns();
        bytes += shard.bytes;
        const std::string text = encode_record(shard);
        st =
            dst.store->put(record_key(o_.series, step, shard.rank), std::as_bytes(std::span(text)));
        if (!st) break;
      }
      if (st) {
        store::WriteOptions wo;
        wo.overwrite = false;
        const std::string text = encode_manifest(out);
        st = dst.store->put(manifest_key(o_.series, step), std::as_bytes(std::span(text)), wo);
      }
      if (!st) {
        note("copying to tier " + dst.name + ": " + st.error().message());
        continue;
      }
      report.copied.push_back({step, dst.name, bytes});
    }
  }
  return report;
}

}  // namespace

const char* to_string(TierState s) {
  switch (s) {
    case TierState::kPending:
      return "pending";
    case TierState::kWriting:
      return "writing";
    case TierState::kCommitted:
      return "committed";
    case TierState::kFailed:
      return "failed";
    case TierState::kSkipped:
      return "skipped";
  }
  return "unknown";
}

Result<Tier> open_tier(std::string_view uri, const store::StoreOptions& options, bool create) {
  Tier t;
  t.name = std::string(uri);
  std::string_view path = uri;
  bool local = uri.find("://") == std::string_view::npos;
  if (uri.starts_with("file://")) {
    path.remove_prefix(7);
    local = true;
  }
  if (local) {
    if (path.empty()) return fail(Code::kInvalidArgument, "empty checkpoint tier path");
    std::error_code ec;
    if (!create && !std::filesystem::is_directory(std::string(path), ec))
      return fail(Code::kNotFound, "checkpoint tier " + std::string(path) + " is not a directory");
    if (create) std::filesystem::create_directories(std::string(path), ec);
    if (ec)
      return fail(Code::kIoError, "cannot create checkpoint tier directory " + std::string(path) +
                                      ": " + ec.message());
    auto abs = std::filesystem::canonical(std::string(path), ec);
    if (ec)
      return fail(Code::kIoError, "checkpoint tier " + std::string(path) + ": " + ec.message());
    t.local_dir = abs.string();
    SLUICE_ASSIGN_OR_RETURN(auto s, store::open_store("file://" + t.local_dir, options));
    t.store = std::move(s);
  } else {
    // "s3://bucket/ckpt" is the folder ckpt/ of the bucket, not a key prefix "ckpt".
    std::string root(uri);
    size_t slash = root.find('/', root.find("://") + 3);
    if (slash != std::string::npos && slash + 1 < root.size() && root.back() != '/') root += '/';
    SLUICE_ASSIGN_OR_RETURN(auto s, store::open_store(root, options));
    t.store = std::move(s);
  }
  return t;
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::open(CheckpointerOptions o) {
  SLUICE_RETURN_IF_ERROR(validate_series(o.series));
  if (o.tiers.empty())
    return fail(Code::kInvalidArgument, "a checkpointer needs at least one tier");
  std::set<std::string> roots;
  for (const auto& t : o.tiers) {
    if (!t.store)
      return fail(Code::kInvalidArgument, "checkpoint tier " + t.name + " has no store");
    // One place named twice would commit once and then fail as "already committed".
    if (!roots.insert(t.local_dir.empty() ? t.store->uri() : t.local_dir).second)
      return fail(Code::kInvalidArgument, "checkpoint tier " + t.name + " is given twice");
  }
  if (o.world > 1 && o.run_id.empty())
    return fail(Code::kInvalidArgument,
                "a checkpointer of several ranks needs a run_id shared by every rank");
  if (o.world == 0 || o.rank >= o.world)
    return fail(Code::kInvalidArgument, "rank " + std::to_string(o.rank) +
                                            " is not in a world of " + std::to_string(o.world));
  if (o.chunk_size == 0 || o.chunk_size % kTensorAlignment || o.chunk_size > (uint64_t{1} << 30))
    return fail(Code::kInvalidArgument, "chunk size must be a multiple of 4 KiB up to 1 GiB");
  if (o.segment_bytes == 0 || o.segment_bytes % kTensorAlignment ||
      o.segment_bytes > (uint64_t{1} << 30))
    return fail(Code::kInvalidArgument, "segment size must be a multiple of 4 KiB up to 1 GiB");
  const uint64_t unit = 2 * o.segment_bytes;
  o.staging_bytes = std::max(unit, (o.staging_bytes + unit - 1) / unit * unit);
  if (!o.io) {
    SLUICE_ASSIGN_OR_RETURN(o.io, io::Context::open());
  }
  SLUICE_ASSIGN_OR_RETURN(AlignedBuffer mem, AlignedBuffer::allocate(o.staging_bytes));
  // Touched now, once: first touch runs at about 2 GiB/s here and must not land in a save.
  std::memset(mem.data(), 0, mem.size());
  auto ring = std::make_unique<StagingRing>(std::move(mem), o.segment_bytes);
  return std::unique_ptr<Checkpointer>(new CheckpointerImpl(std::move(o), std::move(ring)));
}

}  // namespace sluice::ckpt
