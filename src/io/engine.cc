// Backend choice, and the two backends: io_uring (liburing) and a thread pool.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "sluice/core/thread_annotations.h"
#include "sluice/io/engine.h"
#include "sluice/telemetry/registry.h"

#if SLUICE_HAVE_LIBURING
#include <liburing.h>
#endif

namespace sluice::io {

std::string_view engine_kind_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto:
      return "auto";
    case EngineKind::kUring:
      return "io_uring";
    case EngineKind::kThreadPool:
      return "thread-pool";
  }
  return "unknown";
}

namespace {

// Counts completed operations and bytes into the registry, if there is one.
struct EngineMetrics {
  telemetry::Counter* ops = nullptr;
  telemetry::Counter* bytes = nullptr;
  telemetry::Counter* errors = nullptr;

  EngineMetrics(telemetry::Registry* r, std::string_view engine) {
    if (!r) return;
    telemetry::Labels l{{"engine", std::string(engine)}};
    ops = &r->counter("sluice_io_ops_total", l, "I/O requests completed by the engine");
    bytes = &r->counter("sluice_io_bytes_total", l, "Bytes moved by the engine");
    errors = &r->counter("sluice_io_errors_total", l, "I/O requests that failed");
  }
  void record(std::span<const Completion> done) const {
    if (!ops) return;
    uint64_t b = 0, e = 0;
    for (auto& c : done) {
      if (c.result >= 0)
        b += static_cast<uint64_t>(c.result);
      else
        ++e;
    }
    ops->add(done.size());
    bytes->add(b);
    if (e) errors->add(e);
  }
};

int64_t run_request(const Request& r) {
  ssize_t n;
  do {
    switch (r.op) {
      case OpCode::kRead:
        n = ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
        break;
      case OpCode::kWrite:
        n = ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
        break;
      case OpCode::kFsync:
        n = ::fdatasync(r.fd);
        break;
      default:
        n = -1;
        errno = EINVAL;
    }
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n);
}

class ThreadPoolEngine final : public Engine {
 public:
  ThreadPoolEngine(unsigned depth, unsigned threads, telemetry::Registry* registry)
      : depth_(depth), metrics_(registry, "thread-pool") {
    threads = std::clamp(threads, 1u, depth);
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadPoolEngine() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Status submit(std::span<const Request> requests) override {
    if (requests.empty()) return ok();
    {
      MutexLock lock(mu_);
      if (in_flight_ + requests.size() > depth_)
        return fail(Code::kInvalidArgument, "engine queue full: " + std::to_string(in_flight_) +
                                                " in flight, depth " + std::to_string(depth_));
      in_flight_ += static_cast<unsigned>(requests.size());
      pending_.insert(pending_.end(), requests.begin(), requests.end());
    }
    if (requests.size() == 1)
      work_cv_.notify_one();
    else
      work_cv_.notify_all();
    return ok();
  }

  Result<size_t> wait(std::span<Completion> out, size_t min_complete,
                      std::chrono::nanoseconds timeout) override {
    UniqueLock lock(mu_);
    min_complete = std::min({min_complete, out.size(), static_cast<size_t>(in_flight_)});
    done_cv_.wait_for(lock, timeout,
                      [&]() SLUICE_REQUIRES(mu_) { return done_.size() >= min_complete; });
    size_t n = std::min(out.size(), done_.size());
    std::copy_n(done_.begin(), n, out.begin());
    done_.erase(done_.begin(), done_.begin() + static_cast<ptrdiff_t>(n));
    in_flight_ -= static_cast<unsigned>(n);
    lock.unlock();
    metrics_.record(out.first(n));
    return n;
  }

  unsigned capacity() const override { return depth_; }
  unsigned in_flight() const override {
    MutexLock lock(mu_);
    return in_flight_;
  }
  EngineKind kind() const override { return EngineKind::kThreadPool; }
  std::string_view name() const override { return "thread-pool"; }

 private:
  void work() {
    UniqueLock lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, and nothing left to run
      Request r = pending_.front();
      pending_.pop_front();
      lock.unlock();
      Completion c{r.user_data, run_request(r)};
      lock.lock();
      done_.push_back(c);
      done_cv_.notify_one();
    }
  }

  const unsigned depth_;
  EngineMetrics metrics_;
  mutable Mutex mu_;
  CondVar work_cv_, done_cv_;
  std::deque<Request> pending_ SLUICE_GUARDED_BY(mu_);
  std::vector<Completion> done_ SLUICE_GUARDED_BY(mu_);
  unsigned in_flight_ SLUICE_GUARDED_BY(mu_) = 0;  // submitted and not yet reaped
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

#if SLUICE_HAVE_LIBURING
class UringEngine final : public Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(unsigned depth, telemetry::Registry* registry) {
    auto e = std::unique_ptr<UringEngine>(new UringEngine(depth, registry));
    // Cooperative task running cuts interrupts (kernel 5.19+); older kernels reject the
    // flag, so retry without it. Not SINGLE_ISSUER: engines are leased across threads.
    unsigned flags = 0;
#if SLUICE_HAVE_COOP_TASKRUN
    flags |= IORING_SETUP_COOP_TASKRUN;
#endif
    int rc = io_uring_queue_init(depth, &e->ring_, flags);
    if (rc == -EINVAL && flags) rc = io_uring_queue_init(depth, &e->ring_, 0);
    if (rc < 0) return fail_errno(-rc, "io_uring_queue_init(" + std::to_string(depth) + ")");
    e->ready_ = true;
    return std::unique_ptr<Engine>(std::move(e));
  }

  ~UringEngine() override {
    if (!ready_) return;
    // Drain: the kernel may still write into caller buffers until each request completes.
    while (in_flight_ > 0) {
      struct io_uring_cqe* cqe;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    io_uring_queue_exit(&ring_);
  }

  Status submit(std::span<const Request> requests) override {
    if (in_flight_ + requests.size() > depth_)
      return fail(Code::kInvalidArgument, "engine queue full: " + std::to_string(in_flight_) +
                                              " in flight, depth " + std::to_string(depth_));
    for (const Request& r : requests) {
      struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) return fail(Code::kInternal, "io_uring submission queue unexpectedly full");
      switch (r.op) {
        case OpCode::kRead:
          io_uring_prep_read(sqe, r.fd, r.buf, r.len, r.offset);
          break;
        case OpCode::kWrite:
          io_uring_prep_write(sqe, r.fd, r.buf, r.len, r.offset);
          break;
        case OpCode::kFsync:
          io_uring_prep_fsync(sqe, r.fd, IORING_FSYNC_DATASYNC);
          break;
      }
      io_uring_sqe_set_data64(sqe, r.user_data);
    }
    unsigned want = static_cast<unsigned>(requests.size());
    while (want > 0) {
      int rc = io_uring_submit(&ring_);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      if (rc < 0) return fail_errno(-rc, "io_uring_submit");
      want -= std::min(want, static_cast<unsigned>(rc));
      in_flight_ += static_cast<unsigned>(rc);
    }
    return ok();
  }

  Result<size_t> wait(std::span<Completion> out, size_t min_complete,
                      std::chrono::nanoseconds timeout) override {
    min_complete = std::min({min_complete, out.size(), static_cast<size_t>(in_flight_)});
    if (min_complete > 0 && io_uring_cq_ready(&ring_) < min_complete) {
      struct __kernel_timespec ts;
      ts.tv_sec = timeout.count() / 1000000000;
      ts.tv_nsec = timeout.count() % 1000000000;
      struct io_uring_cqe* cqe;
      int rc;
      do {
        rc = io_uring_wait_cqes(&ring_, &cqe, static_cast<unsigned>(min_complete), &ts, nullptr);
      } while (rc == -EINTR);
      if (rc < 0 && rc != -ETIME) return fail_errno(-rc, "io_uring_wait_cqes");
    }
    struct io_uring_cqe* cqes[64];
    size_t n = 0;
    while (n < out.size()) {
      unsigned want = static_cast<unsigned>(std::min<size_t>(64, out.size() - n));
      unsigned got = io_uring_peek_batch_cqe(&ring_, cqes, want);
      if (got == 0) break;
      for (unsigned i = 0; i < got; ++i)
        out[n + i] = Completion{io_uring_cqe_get_data64(cqes[i]), cqes[i]->res};
      io_uring_cq_advance(&ring_, got);
      n += got;
    }
    in_flight_ -= static_cast<unsigned>(n);
    metrics_.record(out.first(n));
    return n;
  }

  unsigned capacity() const override {
    return depth_;
  }
  unsigned in_flight() const override {
    return in_flight_;
  }
  EngineKind kind() const override {
    return EngineKind::kUring;
  }
  std::string_view name() const override {
    return "io_uring";
  }

 private:
  UringEngine(unsigned depth, telemetry::Registry* registry)
      : depth_(depth), metrics_(registry, "io_uring") {}

  struct io_uring ring_ = {};
  bool ready_ = false;
  const unsigned depth_;
  unsigned in_flight_ = 0;
  EngineMetrics metrics_;
};
#endif

}  // namespace

bool uring_available(std::string* why_not) {
#if SLUICE_HAVE_LIBURING
  // Probed once per process: io_uring can be missing (old kernel), disabled by sysctl
  // (kernel.io_uring_disabled) or blocked by a seccomp filter (containers).
  static const std::pair<bool, std::string> probe = [] {
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) return std::pair{false, "io_uring_queue_init: " + std::string(std::strerror(-rc))};
    struct io_uring_probe* p = io_uring_get_probe_ring(&ring);
    bool has = p && io_uring_opcode_supported(p, IORING_OP_READ) &&
               io_uring_opcode_supported(p, IORING_OP_WRITE);
    if (p) io_uring_free_probe(p);
    io_uring_queue_exit(&ring);
    if (!has) return std::pair{false, std::string("kernel io_uring lacks IORING_OP_READ/WRITE")};
    return std::pair{true, std::string()};
  }();
  if (why_not) *why_not = probe.second;
  return probe.first;
#else
  if (why_not) *why_not = "built without liburing";
  return false;
#endif
}

Result<EngineChoice> make_engine(const EngineOptions& options) {
  unsigned depth = std::clamp(options.queue_depth, 1u, 4096u);
  std::string why_not;
  if (options.kind != EngineKind::kThreadPool) {
    if (uring_available(&why_not)) {
#if SLUICE_HAVE_LIBURING
      auto e = UringEngine::create(depth, options.registry);
      if (e) return EngineChoice{std::move(*e), "io_uring available"};
      why_not = e.error().message();
#endif
    }
    if (options.kind == EngineKind::kUring)
      return fail(Code::kUnsupported, "io_uring engine unavailable: " + why_not);
  }
  std::string why = options.kind == EngineKind::kThreadPool
                        ? "thread pool requested"
                        : "io_uring unavailable (" + why_not + "), using thread pool";
  return EngineChoice{std::make_unique<ThreadPoolEngine>(depth, options.threads, options.registry),
                      why};
}

}  // namespace sluice::io
