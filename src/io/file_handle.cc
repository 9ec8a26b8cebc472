// The cuFile-shaped data path: planning requests into aligned segments, and the transfer
// state machine that moves them through staging buffers, the engine and device copies.
#include "sluice/io/file_handle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>

#include "core/executor.h"
#include "shim/cufile.h"
#include "sluice/core/fd.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/buffer_pool.h"

namespace sluice::io {

// ---------------------------------------------------------------------------------------
// Per-file state shared by a handle and the transfers using it.

struct FileState {
  std::string path;
  UniqueFd fd;   // buffered descriptor: unaligned heads and tails, and the fallback
  UniqueFd dfd;  // O_DIRECT descriptor, or none
  bool writable = false;
  // Set when direct I/O that opened fine fails with EINVAL at run time (some file systems
  // accept O_DIRECT on open and refuse it per request); later requests go buffered.
  // Relaxed: a request that misses it goes direct once more and fails over again.
  std::atomic<bool> direct_broken{false};
  CuFileLibrary* gds = nullptr;
  void* gds_handle = nullptr;
  std::string engine;
  mutable Mutex mu;
  std::string why SLUICE_GUARDED_BY(mu);

  bool direct() const { return dfd.valid() && !direct_broken.load(std::memory_order_relaxed); }

  void note(const std::string& s) {
    MutexLock lock(mu);
    why += (why.empty() ? "" : " ") + s;
  }

  void break_direct(uint64_t offset) {
    if (direct_broken.exchange(true, std::memory_order_relaxed)) return;
    note("O_DIRECT I/O at offset " + std::to_string(offset) +
         " failed with EINVAL (file system refuses it), so buffered from then on.");
  }

  ~FileState() {
    if (gds_handle) gds->deregister(gds_handle);
  }
};

std::string PathReport::describe(const mem::Target* target) const {
  bool device = target && target->kind() == mem::MemoryKind::kDevice;
  if (device && gds && target->name().starts_with("cuda")) return "gds";
  std::string s = std::string(direct ? "direct" : "buffered") + "+" + engine;
  if (device) s += "+bounce(" + target->name() + ")";
  return s;
}

// ---------------------------------------------------------------------------------------
// Context internals: leased engines, host staging buffers, and the async executor.

// An engine borrowed from the context; given back (and reused) when destroyed.
class EngineLease {
 public:
  EngineLease(Context::Internals* owner, std::unique_ptr<Engine> e)
      : owner_(owner), engine_(std::move(e)) {}
  EngineLease(EngineLease&&) noexcept = default;
  ~EngineLease();
  Engine& operator*() const { return *engine_; }
  Engine* operator->() const { return engine_.get(); }

 private:
  Context::Internals* owner_;
  std::unique_ptr<Engine> engine_;
};

struct Context::Internals {
  ContextOptions options;
  BufferPool host_staging;
  Mutex mu;
  std::vector<std::unique_ptr<Engine>> idle SLUICE_GUARDED_BY(mu);
  Executor executor;

  explicit Internals(const ContextOptions& o)
      : options(o), host_staging(o.chunk_size, 64), executor(o.async_threads) {}

  Result<EngineLease> lease() {
    {
      MutexLock lock(mu);
      if (!idle.empty()) {
        auto e = std::move(idle.back());
        idle.pop_back();
        return EngineLease(this, std::move(e));
      }
    }
    SLUICE_ASSIGN_OR_RETURN(EngineChoice c, make_engine(options.engine));
    return EngineLease(this, std::move(c.engine));
  }

  void give_back(std::unique_ptr<Engine> e) {
    MutexLock lock(mu);
    if (idle.size() < 64) idle.push_back(std::move(e));
  }
};

EngineLease::~EngineLease() {
  // An engine with requests still in flight is destroyed (which drains it), not reused.
  if (engine_ && engine_->in_flight() == 0) owner_->give_back(std::move(engine_));
}

Result<std::shared_ptr<Context>> Context::open(const ContextOptions& options) {
  if (options.chunk_size == 0 || options.chunk_size % kDirectAlignment != 0)
    return fail(Code::kInvalidArgument, "chunk size " + std::to_string(options.chunk_size) +
                                            " is not a positive multiple of 4096");
  if (options.chunk_size > (1u << 30))
    return fail(Code::kInvalidArgument, "chunk size above 1 GiB");
  std::shared_ptr<Context> ctx(new Context());
  ctx->options_ = options;
  if (ctx->options_.staging_buffers == 0) ctx->options_.staging_buffers = 1;
  // Probe once so every handle can report the backend and the reason for it.
  SLUICE_ASSIGN_OR_RETURN(EngineChoice first, make_engine(options.engine));
  ctx->engine_name_ = std::string(first.engine->name());
  ctx->engine_why_ = first.why;
  ctx->internals_ = std::make_unique<Internals>(ctx->options_);
  ctx->internals_->give_back(std::move(first.engine));
  return ctx;
}

Context::~Context() = default;

// ---------------------------------------------------------------------------------------
// The transfer state machine.

namespace {

constexpr uint64_t kAlign = kDirectAlignment;
uint64_t align_down(uint64_t v) {
  return v / kAlign * kAlign;
}
uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

struct Entry {
  uint64_t cookie = 0;
  bool write = false;
  FileState* file = nullptr;
  mem::Target* target = nullptr;  // set only for device memory
  std::byte* base = nullptr;      // the caller's buffer at buf_offset
  size_t size = 0;
  uint64_t offset = 0;
  size_t pending = 0;              // segments not yet finished
  uint64_t short_at = UINT64_MAX;  // reads: first byte not read because the file ended
  std::optional<Error> error;
  bool live = false;
};

// Where one segment of a request is. The transitions, and who makes them:
//
//   kNeedBuffer --start_waiting: staging buffer leased--> kReady        (reads; host writes,
//                                                                         after a memcpy in)
//   kNeedBuffer --start_waiting: device-to-host copy queued--> kCopyIn  (writes from a device)
//   kCopyIn     --drain_copies: the copy finished--> kReady
//   kReady      --submit_ready: handed to the engine--> kInFlight
//   kInFlight   --handle: EINVAL on O_DIRECT (now buffered), EINTR/EAGAIN, a short write,
//                 or a short read that is not the end of the file--> kReady (resubmitted)
//   kInFlight   --handle: host-to-device copy queued (bounced read to a device)--> kCopyOut
//   kCopyOut    --drain_copies: the copy finished--> kDone
//   kInFlight   --handle: complete, or any other error--> kDone
// Segments that need no staging (aligned host memory) start at kReady. A segment of an
// entry that has already failed goes straight to kDone wherever it is picked up.
enum class Stage {
  kNeedBuffer,  // waits for a staging buffer (bounced segments only)
  kCopyIn,      // a write's bytes are being copied from the device into staging
  kReady,       // queued for the engine (ready_)
  kInFlight,    // submitted; its completion is awaited
  kCopyOut,     // a read's bytes are being copied from staging to the device
  kDone,        // finished or failed; its slot is free
};

struct Segment {
  uint32_t entry = 0;
  uint64_t rel = 0;  // offset within the entry
  uint32_t len = 0;
  uint32_t got = 0;  // bytes transferred so far
  bool direct = false;
  bool bounce = false;
  Stage stage = Stage::kNeedBuffer;
  uint64_t ticket = 0;
  PooledBuffer staging;
};

}  // namespace

class Transfer {
 public:
  Transfer(Context::Internals& ctx, Engine& engine) : ctx_(ctx), engine_(engine) {
    cqes_.resize(engine.capacity());
  }
  // Staging buffers go back to a shared pool when this is destroyed, so nothing may still
  // be writing into them: wait for every request in flight first.
  ~Transfer() { drain(); }

  // Waits for every request in flight and processes its completion.
  void drain() {
    while (engine_.in_flight() > 0) {
      auto n = engine_.wait(cqes_, 1, std::chrono::milliseconds(100));
      if (!n) return;  // the engine itself failed; its destructor drains what is left
      for (size_t i = 0; i < *n; ++i) (void)handle(cqes_[i]);
    }
  }

  size_t entries_live() const { return live_entries_; }

  Status add(const BatchIO& io);
  // Runs until `min_done` results are in `out` (beyond what it held on entry), the work
  // runs out, or `deadline` passes.
  Status pump(std::vector<BatchResult>& out, size_t min_done,
              std::chrono::steady_clock::time_point deadline);
  // One round of progress without waiting; finished results stay for the next pump.
  // Returns whether anything moved.
  Result<bool> kick();

 private:
  template <typename T>
  static uint32_t alloc_slot(std::vector<T>& v, std::vector<uint32_t>& free) {
    if (!free.empty()) {
      uint32_t i = free.back();
      free.pop_back();
      return i;
    }
    v.emplace_back();
    return static_cast<uint32_t>(v.size() - 1);
  }

  void add_segments(uint32_t e, uint64_t rel, uint64_t len, bool direct);
  void finish_segment(uint32_t s);
  void fail_segment(uint32_t s, Error err);
  bool start_waiting();
  bool submit_ready();
  bool drain_copies();
  Status handle(const Completion& c);
  Error io_error(const Segment& seg, const Entry& e, int err) const;
  void finish_entry(uint32_t e);

  Context::Internals& ctx_;
  Engine& engine_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> free_entries_;
  std::vector<Segment> segs_;
  std::vector<uint32_t> free_segs_;
  std::deque<uint32_t> need_buffer_, ready_, copy_in_, copy_out_;
  std::vector<Completion> cqes_;
  std::vector<BatchResult> finished_;
  std::vector<Request> batch_;
  size_t live_entries_ = 0;
  unsigned staging_in_use_ = 0;
};

Status Transfer::add(const BatchIO& io) {
  if (!io.file || !io.file->state_)
    return fail(Code::kInvalidArgument, "batch I/O without an open file handle");
  FileState* f = io.file->state_.get();
  bool write = io.op == OpCode::kWrite;
  if (io.op != OpCode::kRead && !write)
    return fail(Code::kInvalidArgument, "batch I/O op must be read or write on " + f->path);
  if (!io.buf.ptr && io.size > 0)
    return fail(Code::kInvalidArgument, "null buffer for I/O on " + f->path);
  if (io.buf.size < io.buf_offset || io.buf.size - io.buf_offset < io.size)
    return fail(Code::kInvalidArgument, "buffer of " + std::to_string(io.buf.size) +
                                            " bytes cannot hold " + std::to_string(io.size) +
                                            " bytes at buffer offset " +
                                            std::to_string(io.buf_offset) + " for " + f->path);
  if (write && !f->writable)
    return fail(Code::kPermissionDenied, "write to " + f->path + ": handle opened read-only");
  if (io.file_offset > static_cast<uint64_t>(INT64_MAX) - io.size)
    return fail(Code::kInvalidArgument, "offset out of range for " + f->path);

  bool device = io.buf.target && io.buf.target->kind() == mem::MemoryKind::kDevice;
  std::byte* base = static_cast<std::byte*>(io.buf.ptr) + io.buf_offset;

  if (io.size == 0) {
    finished_.push_back(BatchResult{io.cookie, size_t{0}});
    return ok();
  }
  if (device && f->gds_handle && io.buf.target->name().starts_with("cuda")) {
    // GPUDirect Storage: cuFile moves the bytes itself, synchronously.
    Result<size_t> r =
        write
            ? f->gds->write(f->gds_handle, io.buf.ptr, io.size, static_cast<off_t>(io.file_offset),
                            static_cast<off_t>(io.buf_offset), f->path)
            : f->gds->read(f->gds_handle, io.buf.ptr, io.size, static_cast<off_t>(io.file_offset),
                           static_cast<off_t>(io.buf_offset), f->path);
    finished_.push_back(BatchResult{io.cookie, std::move(r)});
    return ok();
  }

  uint32_t e = alloc_slot(entries_, free_entries_);
  entries_[e] = Entry{io.cookie,
                      write,
                      f,
                      device ? io.buf.target : nullptr,
                      base,
                      io.size,
                      io.file_offset,
                      0,
                      UINT64_MAX,
                      std::nullopt,
                      true};
  ++live_entries_;
  uint64_t start = io.file_offset, end = io.file_offset + io.size;
  if (f->direct()) {
    uint64_t a = align_up(start), b = align_down(end);
    if (a < b) {
      if (start < a) add_segments(e, 0, a - start, false);
      add_segments(e, a - start, b - a, true);
      if (b < end) add_segments(e, b - start, end - b, false);
      return ok();
    }
  }
  add_segments(e, 0, io.size, false);
  return ok();
}

void Transfer::add_segments(uint32_t e, uint64_t rel, uint64_t len, bool direct) {
  Entry& en = entries_[e];
  const uint64_t chunk = ctx_.options.chunk_size;
  for (uint64_t done = 0; done < len; done += chunk) {
    uint32_t s = alloc_slot(segs_, free_segs_);
    Segment& seg = segs_[s];
    seg = Segment{};
    seg.entry = e;
    seg.rel = rel + done;
    seg.len = static_cast<uint32_t>(std::min(chunk, len - done));
    seg.direct = direct;
    bool aligned = reinterpret_cast<uintptr_t>(en.base + seg.rel) % kAlign == 0;
    seg.bounce = en.target != nullptr || (direct && !aligned);
    seg.stage = seg.bounce ? Stage::kNeedBuffer : Stage::kReady;
    (seg.bounce ? need_buffer_ : ready_).push_back(s);
    ++en.pending;
  }
}

Error Transfer::io_error(const Segment& seg, const Entry& e, int err) const {
  uint64_t off = e.offset + seg.rel + seg.got;
  return error_from_errno(err, std::string(e.write ? "write " : "read ") +
                                   std::to_string(seg.len - seg.got) + " bytes at offset " +
                                   std::to_string(off) + " of " + e.file->path +
                                   (seg.direct ? " (O_DIRECT)" : " (buffered)"));
}

void Transfer::finish_segment(uint32_t s) {
  Segment& seg = segs_[s];
  if (seg.staging) {
    seg.staging = PooledBuffer();
    --staging_in_use_;
  }
  seg.stage = Stage::kDone;
  uint32_t e = seg.entry;
  free_segs_.push_back(s);
  if (--entries_[e].pending == 0) finish_entry(e);
}

void Transfer::fail_segment(uint32_t s, Error err) {
  Entry& e = entries_[segs_[s].entry];
  if (!e.error) e.error = std::move(err);
  finish_segment(s);
}

void Transfer::finish_entry(uint32_t e) {
  Entry& en = entries_[e];
  BatchResult r;
  r.cookie = en.cookie;
  if (en.error)
    r.result = std::unexpected(*en.error);
  else
    r.result = static_cast<size_t>(std::min<uint64_t>(en.size, en.short_at));
  finished_.push_back(std::move(r));
  en.live = false;
  en.error.reset();
  free_entries_.push_back(e);
  --live_entries_;
}

bool Transfer::start_waiting() {
  bool progressed = false;
  while (!need_buffer_.empty() && staging_in_use_ < ctx_.options.staging_buffers) {
    uint32_t s = need_buffer_.front();
    need_buffer_.pop_front();
    Segment& seg = segs_[s];
    Entry& e = entries_[seg.entry];
    progressed = true;
    if (e.error) {  // the entry already failed: kNeedBuffer -> kDone
      finish_segment(s);
      continue;
    }
    BufferPool& pool = e.target ? e.target->staging(ctx_.options.chunk_size) : ctx_.host_staging;
    auto buf = pool.acquire();
    if (!buf) {
      fail_segment(s, buf.error());
      continue;
    }
    seg.staging = std::move(*buf);
    ++staging_in_use_;
    if (!e.write) {  // a read fills the staging buffer: kNeedBuffer -> kReady
      seg.stage = Stage::kReady;
      ready_.push_back(s);
    } else if (e.target) {  // a write from a device copies into it first: -> kCopyIn
      auto t = e.target->copy_to_host(seg.staging.data(), e.base + seg.rel, seg.len);
      if (!t) {
        fail_segment(s, t.error());
        continue;
      }
      seg.ticket = *t;
      seg.stage = Stage::kCopyIn;
      copy_in_.push_back(s);
    } else {  // a write from unaligned host memory: copied in now, kNeedBuffer -> kReady
      std::memcpy(seg.staging.data(), e.base + seg.rel, seg.len);
      seg.stage = Stage::kReady;
      ready_.push_back(s);
    }
  }
  return progressed;
}

bool Transfer::submit_ready() {
  unsigned room = engine_.capacity() - engine_.in_flight();
  batch_.clear();
  while (!ready_.empty() && batch_.size() < room) {
    uint32_t s = ready_.front();
    ready_.pop_front();
    Segment& seg = segs_[s];
    Entry& e = entries_[seg.entry];
    if (e.error) {  // the entry already failed: kReady -> kDone
      finish_segment(s);
      continue;
    }
    if (seg.direct && !e.file->direct()) seg.direct = false;  // O_DIRECT broke meanwhile
    std::byte* buf = (seg.bounce ? seg.staging.data() : e.base + seg.rel) + seg.got;
    batch_.push_back(Request{e.write ? OpCode::kWrite : OpCode::kRead,
                             seg.direct ? e.file->dfd.get() : e.file->fd.get(), buf,
                             seg.len - seg.got, e.offset + seg.rel + seg.got, s});
    seg.stage = Stage::kInFlight;  // kReady -> kInFlight
  }
  if (batch_.empty()) return false;
  if (auto st = engine_.submit(batch_); !st) {
    // Part of the batch may have reached the kernel: let everything in flight finish
    // (its buffers are still being written), then fail what never started.
    std::vector<Request> tried = batch_;
    drain();
    for (auto& r : tried) {
      uint32_t s = static_cast<uint32_t>(r.user_data);
      if (segs_[s].stage == Stage::kInFlight) fail_segment(s, st.error());
    }
  }
  return true;
}

bool Transfer::drain_copies() {
  bool progressed = false;
  while (!copy_in_.empty()) {
    uint32_t s = copy_in_.front();
    Segment& seg = segs_[s];
    if (!entries_[seg.entry].target->done(seg.ticket)) break;  // copies finish in order
    copy_in_.pop_front();
    seg.stage = Stage::kReady;  // kCopyIn -> kReady
    ready_.push_back(s);
    progressed = true;
  }
  while (!copy_out_.empty()) {
    uint32_t s = copy_out_.front();
    Segment& seg = segs_[s];
    if (!entries_[seg.entry].target->done(seg.ticket)) break;
    copy_out_.pop_front();
    finish_segment(s);  // kCopyOut -> kDone
    progressed = true;
  }
  return progressed;
}

Status Transfer::handle(const Completion& c) {
  uint32_t s = static_cast<uint32_t>(c.user_data);
  if (s >= segs_.size() || segs_[s].stage != Stage::kInFlight)
    return fail(Code::kInternal, "engine returned an unknown request id");
  Segment& seg = segs_[s];
  Entry& e = entries_[seg.entry];
  if (c.result < 0) {
    int err = static_cast<int>(-c.result);
    if (err == EINVAL && seg.direct) {  // the file system refuses O_DIRECT: kInFlight -> kReady
      e.file->break_direct(e.offset + seg.rel + seg.got);
      seg.direct = false;
      seg.stage = Stage::kReady;
      ready_.push_front(s);
      return ok();
    }
    if (err == EINTR || err == EAGAIN) {  // try again: kInFlight -> kReady
      seg.stage = Stage::kReady;
      ready_.push_front(s);
      return ok();
    }
    fail_segment(s, io_error(seg, e, err));  // kInFlight -> kDone, the entry failed
    return ok();
  }
  uint32_t n = static_cast<uint32_t>(c.result);
  seg.got += n;
  if (e.write) {
    if (n == 0) {
      fail_segment(s, Error(Code::kIoError, "write at offset " +
                                                std::to_string(e.offset + seg.rel + seg.got) +
                                                " of " + e.file->path + " wrote 0 bytes"));
    } else if (seg.got < seg.len) {
      seg.stage = Stage::kReady;  // short write: send the rest
      ready_.push_front(s);
    } else {
      finish_segment(s);
    }
    return ok();
  }
  // A read ends early only at end of file: 0 bytes, or a direct read that stopped
  // mid-block. A short read that ended on a block boundary is resumed.
  bool eof = n == 0 || (seg.direct && n % kAlign != 0);
  if (!eof && seg.got < seg.len) {
    seg.stage = Stage::kReady;
    ready_.push_front(s);
    return ok();
  }
  if (seg.got < seg.len) e.short_at = std::min<uint64_t>(e.short_at, seg.rel + seg.got);
  if (!seg.bounce || seg.got == 0) {  // the bytes are where they belong: kInFlight -> kDone
    finish_segment(s);
  } else if (!e.target) {  // bounced into unaligned host memory: copied out now, -> kDone
    std::memcpy(e.base + seg.rel, seg.staging.data(), seg.got);
    finish_segment(s);
  } else {  // bounced to a device: kInFlight -> kCopyOut
    auto t = e.target->copy_to_target(e.base + seg.rel, seg.staging.data(), seg.got);
    if (!t) {
      fail_segment(s, t.error());
      return ok();
    }
    seg.ticket = *t;
    seg.stage = Stage::kCopyOut;
    copy_out_.push_back(s);
  }
  return ok();
}

Result<bool> Transfer::kick() {
  bool progressed = drain_copies();
  progressed |= start_waiting();
  progressed |= submit_ready();
  SLUICE_ASSIGN_OR_RETURN(size_t n, engine_.wait(cqes_, 0, std::chrono::nanoseconds(0)));
  for (size_t i = 0; i < n; ++i) SLUICE_RETURN_IF_ERROR(handle(cqes_[i]));
  return progressed || n > 0;
}

Status Transfer::pump(std::vector<BatchResult>& out, size_t min_done,
                      std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  size_t delivered = 0;
  auto deliver = [&] {
    for (auto& r : finished_) out.push_back(std::move(r));
    delivered += finished_.size();
    finished_.clear();
  };
  while (true) {
    SLUICE_ASSIGN_OR_RETURN(bool progressed, kick());
    deliver();
    if (delivered >= min_done) break;
    if (progressed) continue;
    if (live_entries_ == 0) break;
    auto now = steady_clock::now();
    if (now >= deadline) break;
    auto left = duration_cast<nanoseconds>(deadline - now);
    bool copies = !copy_in_.empty() || !copy_out_.empty();
    if (engine_.in_flight() > 0) {
      // With device copies pending, wake up soon to recycle their staging buffers.
      // Waits are capped so that no clock arithmetic overflows on an unbounded deadline.
      auto wait_for = std::min<nanoseconds>(left, copies ? microseconds(50) : milliseconds(100));
      SLUICE_ASSIGN_OR_RETURN(size_t n, engine_.wait(cqes_, 1, wait_for));
      for (size_t i = 0; i < n; ++i) SLUICE_RETURN_IF_ERROR(handle(cqes_[i]));
      deliver();
    } else if (copies) {
      auto& q = copy_in_.empty() ? copy_out_ : copy_in_;
      Segment& seg = segs_[q.front()];
      SLUICE_RETURN_IF_ERROR(entries_[seg.entry].target->wait(seg.ticket));
    } else {
      return fail(Code::kInternal, "transfer stalled with work left and nothing in flight");
    }
  }
  return ok();
}

// ---------------------------------------------------------------------------------------
// FileHandle

FileHandle::FileHandle(std::shared_ptr<Context> ctx, std::unique_ptr<FileState> state)
    : ctx_(std::move(ctx)), state_(std::move(state)) {}
FileHandle::FileHandle(FileHandle&&) noexcept = default;
FileHandle& FileHandle::operator=(FileHandle&&) noexcept = default;
FileHandle::~FileHandle() = default;

Result<FileHandle> FileHandle::open(std::shared_ptr<Context> ctx, const std::string& path,
                                    const OpenOptions& options) {
  if (!ctx) return fail(Code::kInvalidArgument, "open " + path + ": no I/O context");
  auto st = std::make_unique<FileState>();
  st->path = path;
  st->writable = options.write;
  st->engine = ctx->engine_name();
  int flags = (options.write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  if (options.create) flags |= O_CREAT;
  if (options.truncate) flags |= O_TRUNC;
  // O_NONBLOCK for the open only: a FIFO where a file was expected must be an error, not
  // an open that waits forever for its other end (opening one to write fails ENXIO).
  st->fd.reset(::open(path.c_str(), flags | O_NONBLOCK, options.mode));
  if (!st->fd.valid())
    return fail_errno(errno, std::string("open ") + path + (options.write ? " for writing" : ""));
  struct stat sb;
  if (::fstat(st->fd.get(), &sb) != 0) return fail_errno(errno, "stat " + path);
  if (S_ISDIR(sb.st_mode)) return fail(Code::kInvalidArgument, "open " + path + ": is a directory");
  if (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))
    return fail(Code::kInvalidArgument, "open " + path + ": is a FIFO or socket, not a file");
  if (::fcntl(st->fd.get(), F_SETFL, ::fcntl(st->fd.get(), F_GETFL) & ~O_NONBLOCK) != 0)
    return fail_errno(errno, "open " + path);

  if (options.direct == DirectMode::kOff) {
    st->note("Buffered I/O: O_DIRECT turned off by option.");
  } else {
    int dflags = (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT;
    st->dfd.reset(::open(path.c_str(), dflags));
    if (!st->dfd.valid()) {
      int err = errno;
      if (options.direct == DirectMode::kOn)
        return fail(Code::kUnsupported, "open " + path + " with O_DIRECT: " + std::strerror(err) +
                                            " (direct I/O required)");
      st->note(std::string("Buffered I/O: open with O_DIRECT failed (") + std::strerror(err) +
               (err == EINVAL ? "; the file system does not support direct I/O)." : ")."));
    } else {
      // Both descriptors must be the same file: a rename between the two opens would
      // otherwise mix two versions in one read.
      struct stat a, b;
      if (::fstat(st->fd.get(), &a) != 0 || ::fstat(st->dfd.get(), &b) != 0 ||
          a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        st->dfd.reset();
        st->note("Buffered I/O: the file was replaced while it was being opened.");
      } else {
        st->note("O_DIRECT for 4 KiB-aligned ranges, page cache for unaligned heads and tails.");
      }
    }
  }
  st->note("Engine " + ctx->engine_name() + ": " + ctx->engine_why() + ".");

  if (options.compat != CompatMode::kOn) {
    auto lib = CuFileLibrary::get(ctx->options().cufile_library);
    Result<void*> h =
        lib ? (*lib)->register_fd(st->dfd.valid() ? st->dfd.get() : st->fd.get(), path)
            : Result<void*>(std::unexpected(lib.error()));
    if (h) {
      st->gds = *lib;
      st->gds_handle = *h;
      st->note("GPUDirect Storage: cuFile handle registered.");
    } else if (options.compat == CompatMode::kOff) {
      return fail(Code::kUnsupported, "open " + path +
                                          ": GPUDirect Storage required (compat mode "
                                          "off) but unavailable: " +
                                          h.error().message());
    } else {
      st->note("No GPUDirect Storage (" + h.error().message() +
               "): device memory goes through bounce buffers.");
    }
  } else {
    st->note(
        "Compat mode on: device memory goes through bounce buffers (host memory too where "
        "O_DIRECT needs an alignment it lacks).");
  }
  return FileHandle(std::move(ctx), std::move(st));
}

namespace {
Result<size_t> run_one(Context& ctx, const BatchIO& io) {
  auto& in = ctx.internals();
  SLUICE_ASSIGN_OR_RETURN(EngineLease lease, in.lease());
  Transfer t(in, *lease);
  SLUICE_RETURN_IF_ERROR(t.add(io));
  std::vector<BatchResult> out;
  SLUICE_RETURN_IF_ERROR(t.pump(out, 1, std::chrono::steady_clock::time_point::max()));
  if (out.empty()) return fail(Code::kInternal, "transfer finished without a result");
  return std::move(out.front().result);
}
}  // namespace

Result<size_t> FileHandle::read(const Buffer& dst, size_t size, uint64_t file_offset,
                                size_t buf_offset) {
  return run_one(*ctx_, BatchIO{OpCode::kRead, this, dst, size, file_offset, buf_offset, 0});
}

Result<size_t> FileHandle::write(const Buffer& src, size_t size, uint64_t file_offset,
                                 size_t buf_offset) {
  return run_one(*ctx_, BatchIO{OpCode::kWrite, this, src, size, file_offset, buf_offset, 0});
}

static std::future<Result<size_t>> post_async(const std::shared_ptr<Context>& ctx, BatchIO io) {
  auto promise = std::make_shared<std::promise<Result<size_t>>>();
  auto fut = promise->get_future();
  // A raw pointer: the handle that posted this holds the context and must outlive the
  // operation. Holding a shared_ptr here could make this executor thread drop the last
  // reference and destroy (and join) its own executor.
  Context* c = ctx.get();
  c->internals().executor.post([c, io, promise] { promise->set_value(run_one(*c, io)); });
  return fut;
}

std::future<Result<size_t>> FileHandle::read_async(const Buffer& dst, size_t size,
                                                   uint64_t file_offset, size_t buf_offset) {
  return post_async(ctx_, BatchIO{OpCode::kRead, this, dst, size, file_offset, buf_offset, 0});
}

std::future<Result<size_t>> FileHandle::write_async(const Buffer& src, size_t size,
                                                    uint64_t file_offset, size_t buf_offset) {
  return post_async(ctx_, BatchIO{OpCode::kWrite, this, src, size, file_offset, buf_offset, 0});
}

Status FileHandle::sync() {
  for (const UniqueFd* fd : {&state_->fd, &state_->dfd}) {
    if (fd->valid() && ::fdatasync(fd->get()) != 0)
      return fail_errno(errno, "sync " + state_->path);
  }
  return ok();
}

Result<uint64_t> FileHandle::size() const {
  struct stat sb;
  if (::fstat(state_->fd.get(), &sb) != 0) return fail_errno(errno, "stat " + state_->path);
  return static_cast<uint64_t>(sb.st_size);
}

PathReport FileHandle::path_report() const {
  PathReport r;
  r.direct = state_->direct();
  r.gds = state_->gds_handle != nullptr;
  r.engine = state_->engine;
  MutexLock lock(state_->mu);
  r.why = state_->why;
  return r;
}

const std::string& FileHandle::path() const {
  return state_->path;
}

// ---------------------------------------------------------------------------------------
// Batch

struct Batch::Impl {
  std::shared_ptr<Context> ctx;
  EngineLease lease;
  Transfer transfer;
  unsigned max_entries;
  size_t submitted = 0;  // entries handed in and not yet reaped

  Impl(std::shared_ptr<Context> c, EngineLease l, unsigned max)
      : ctx(std::move(c)),
        lease(std::move(l)),
        transfer(ctx->internals(), *lease),
        max_entries(max) {}
};

Batch::Batch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;

Batch::~Batch() {
  if (!impl_) return;
  // Let in-flight I/O finish before the buffers and the engine go away.
  std::vector<BatchResult> sink;
  while (impl_->transfer.entries_live() > 0) {
    if (!impl_->transfer.pump(sink, SIZE_MAX,
                              std::chrono::steady_clock::now() + std::chrono::seconds(1)))
      break;
    sink.clear();
  }
}

Result<Batch> Batch::create(std::shared_ptr<Context> ctx, unsigned max_entries) {
  if (!ctx) return fail(Code::kInvalidArgument, "batch without an I/O context");
  if (max_entries == 0) return fail(Code::kInvalidArgument, "batch of 0 entries");
  SLUICE_ASSIGN_OR_RETURN(EngineLease lease, ctx->internals().lease());
  return Batch(std::make_unique<Impl>(std::move(ctx), std::move(lease), max_entries));
}

Status Batch::submit(std::span<const BatchIO> ios) {
  if (impl_->submitted + ios.size() > impl_->max_entries)
    return fail(Code::kInvalidArgument, "batch full: " + std::to_string(impl_->submitted) +
                                            " in flight, " + std::to_string(ios.size()) +
                                            " more, limit " + std::to_string(impl_->max_entries));
  for (const BatchIO& io : ios) {
    SLUICE_RETURN_IF_ERROR(impl_->transfer.add(io));
    ++impl_->submitted;
  }
  // Start the I/O now, without waiting for any of it.
  SLUICE_RETURN_IF_ERROR(impl_->transfer.kick());
  return ok();
}

Result<size_t> Batch::wait(std::vector<BatchResult>& out, size_t min_complete,
                           std::chrono::nanoseconds timeout) {
  size_t before = out.size();
  auto deadline = timeout.count() >= INT64_MAX / 2 ? std::chrono::steady_clock::time_point::max()
                                                   : std::chrono::steady_clock::now() + timeout;
  SLUICE_RETURN_IF_ERROR(impl_->transfer.pump(out, min_complete, deadline));
  size_t n = out.size() - before;
  impl_->submitted -= n;
  return n;
}

size_t Batch::in_flight() const {
  return impl_->submitted;
}

}  // namespace sluice::io
