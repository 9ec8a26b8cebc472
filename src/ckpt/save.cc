// Saving: staging tensors into the ring, the stage writer, and the markers of saves under way.
#include "ckpt/checkpointer_impl.h"

#include <sys/statvfs.h>
#include <algorithm>
#include <cstring>
#include <random>

#include "sluice/ckpt/live.h"
#include "sluice/core/hash.h"

namespace sluice::ckpt {

namespace {

std::string fresh_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return hex64(rng()) + hex64(rng());
}

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

}  // namespace

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
    // A stat of a missing key cannot tell a missing bucket from a missing object; a listing
    // can (S3's NoSuchBucket), so a tier that cannot take the step fails here, before any
    // tier has a byte of it.
    // (A tier whose credentials may write but not list is let through: the listing is a
    // probe, not something a save needs.)
    if (t.required)
      if (auto page = t.store->list({.prefix = o_.series + "/", .max_keys = 1});
          !page && page.error().code() != Code::kPermissionDenied)
        return std::unexpected(
            page.error().with_context("checkpoint tier " + t.name + " cannot be reached"));
  }

  MutexLock staging(save_mu_);
  {
    // Under save_mu_, so no other save can add the step between this check and the insert.
    MutexLock lk(mu_);
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
    MutexLock lk(mu_);
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

namespace {

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

}  // namespace

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

std::shared_ptr<SaveJob> CheckpointerImpl::take(Queue which) {
  UniqueLock lk(mu_);
  std::deque<std::shared_ptr<SaveJob>>& q = which == Queue::kStage ? stage_q_ : repl_q_;
  cv_.wait(lk, [&]() SLUICE_REQUIRES(mu_) { return stopping_ || !q.empty(); });
  if (q.empty()) return nullptr;
  auto job = q.front();
  q.pop_front();
  return job;
}

void CheckpointerImpl::stage_loop() {
  while (std::shared_ptr<SaveJob> job = take(Queue::kStage)) {
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
    MutexLock lk(mu_);
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

void CheckpointerImpl::finish(SaveJob& job) {
  const std::string key = live_key(o_.series, job.step, o_.rank, job.record.save_id);
  std::vector<size_t> held;
  {
    MutexLock lk(mu_);
    for (size_t i = 0; i < o_.tiers.size(); ++i)
      if (live_.erase({i, key})) held.push_back(i);
  }
  for (size_t i : held) (void)o_.tiers[i].store->remove(key);  // gc takes a stale one
  MutexLock lk(mu_);
  active_steps_.erase(job.step);
  --active_;
  cv_.notify_all();
}

void CheckpointerImpl::hold_step(const SaveJob& job, size_t i) {
  const std::string key = live_key(o_.series, job.step, o_.rank, job.record.save_id);
  const std::string text = live_text();
  (void)o_.tiers[i].store->put(key, std::as_bytes(std::span(text)));
  MutexLock lk(mu_);
  live_.insert({i, key});
}

void CheckpointerImpl::lease_loop() {
  const std::string text = live_text();
  UniqueLock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, kLiveRefresh, [&]() SLUICE_REQUIRES(mu_) { return stopping_; });
    if (stopping_) break;
    const auto markers = live_;
    lk.unlock();
    for (const auto& marker : markers) {
      {
        // finish() may have removed it meanwhile: never write a marker back.
        MutexLock again(mu_);
        if (!live_.contains(marker)) continue;
      }
      (void)o_.tiers[marker.first].store->put(marker.second, std::as_bytes(std::span(text)));
    }
    lk.lock();
  }
}

}  // namespace sluice::ckpt
