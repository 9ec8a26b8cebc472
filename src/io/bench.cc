// `sluice bench`: like gdsio, every path through the public data-path API (FileHandle and
// Batch), `qd` requests of `bs` bytes kept in flight per thread.
#include "sluice/io/bench.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cmath>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "sluice/core/fd.h"
#include "sluice/io/file_handle.h"
#include "sluice/telemetry/registry.h"

namespace sluice::io {

Result<BenchMode> parse_bench_mode(std::string_view s) {
  if (s == "buffered") return BenchMode::kBuffered;
  if (s == "direct") return BenchMode::kDirect;
  if (s == "uring") return BenchMode::kUring;
  if (s == "bounce") return BenchMode::kBounce;
  if (s == "gpu") return BenchMode::kGpu;
  if (s == "gds") return BenchMode::kGds;
  return fail(Code::kInvalidArgument, "unknown mode '" + std::string(s) +
                                          "' (use buffered, direct, uring, bounce, gpu or gds)");
}

Result<BenchRw> parse_bench_rw(std::string_view s) {
  if (s == "read") return BenchRw::kRead;
  if (s == "write") return BenchRw::kWrite;
  if (s == "randread") return BenchRw::kRandRead;
  if (s == "randwrite") return BenchRw::kRandWrite;
  return fail(Code::kInvalidArgument,
              "unknown --rw '" + std::string(s) + "' (use read, write, randread or randwrite)");
}

std::string_view bench_mode_name(BenchMode m) {
  switch (m) {
    case BenchMode::kBuffered:
      return "buffered";
    case BenchMode::kDirect:
      return "direct";
    case BenchMode::kUring:
      return "uring";
    case BenchMode::kBounce:
      return "bounce";
    case BenchMode::kGpu:
      return "gpu";
    case BenchMode::kGds:
      return "gds";
  }
  return "?";
}

std::string_view bench_rw_name(BenchRw rw) {
  switch (rw) {
    case BenchRw::kRead:
      return "read";
    case BenchRw::kWrite:
      return "write";
    case BenchRw::kRandRead:
      return "randread";
    case BenchRw::kRandWrite:
      return "randwrite";
  }
  return "?";
}

namespace {

// The verification pattern: every 8-byte word holds a hash of its file offset, so any
// misplaced, stale or torn block is caught wherever it lands.
uint64_t pattern_word(uint64_t word_index) {
  uint64_t x = word_index * 0x9E3779B97F4A7C15ULL + 0x5A17CE0000000001ULL;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 29);
}

void fill_pattern(std::byte* p, size_t n, uint64_t file_offset) {
  size_t i = 0;
  for (; i < n && (file_offset + i) % 8 != 0; ++i)
    p[i] = static_cast<std::byte>(pattern_word((file_offset + i) / 8) >>
                                  (((file_offset + i) % 8) * 8));
  for (; i + 8 <= n; i += 8) {
    uint64_t w = pattern_word((file_offset + i) / 8);
    std::memcpy(p + i, &w, 8);
  }
  for (; i < n; ++i)
    p[i] = static_cast<std::byte>(pattern_word((file_offset + i) / 8) >>
                                  (((file_offset + i) % 8) * 8));
}

// Returns the offset of the first wrong byte, or -1.
int64_t check_pattern(const std::byte* p, size_t n, uint64_t file_offset) {
  std::byte expect[4096];
  for (size_t done = 0; done < n; done += sizeof expect) {
    size_t len = std::min(sizeof expect, n - done);
    fill_pattern(expect, len, file_offset + done);
    if (std::memcmp(expect, p + done, len) != 0) {
      for (size_t i = 0; i < len; ++i)
        if (expect[i] != p[done + i]) return static_cast<int64_t>(file_offset + done + i);
    }
  }
  return -1;
}

double cpu_seconds(const struct rusage& r, bool user) {
  const struct timeval& t = user ? r.ru_utime : r.ru_stime;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
}

bool is_write(BenchRw rw) {
  return rw == BenchRw::kWrite || rw == BenchRw::kRandWrite;
}
bool is_random(BenchRw rw) {
  return rw == BenchRw::kRandRead || rw == BenchRw::kRandWrite;
}

// Creates or extends the file to `size` bytes of the verification pattern.
Status lay_out(const std::shared_ptr<io::Context>& ctx, const std::string& path, uint64_t size,
               const BenchOptions& o) {
  struct stat sb;
  uint64_t have = ::stat(path.c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  if (have >= size) return ok();
  io::OpenOptions oo;
  oo.write = true;
  oo.create = true;
  SLUICE_ASSIGN_OR_RETURN(auto fh, io::FileHandle::open(ctx, path, oo));
  const size_t chunk = 16 << 20;
  SLUICE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::allocate(chunk));
  uint64_t start = have / kDirectAlignment * kDirectAlignment;  // rewrite a partial last block
  for (uint64_t off = start; off < size; off += chunk) {
    if (o.cancel && o.cancel->load())
      return fail(Code::kCancelled, "laying out " + path + " interrupted");
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, size - off));
    fill_pattern(buf.data(), n, off);
    SLUICE_ASSIGN_OR_RETURN(size_t w, fh.write(io::Buffer::host(buf.data(), n), n, off));
    (void)w;
    if (o.on_lay_out) o.on_lay_out(off + n, size);
  }
  return fh.sync();
}

// What --file names, checked before anything is opened: a benchmark may lay out (write) a
// regular file that is missing or too short, and nothing else. A read never writes a block
// device; a FIFO, socket or character device would hang or mislead; /proc and /sys are
// not storage.
struct BenchTarget {
  bool exists = false;
  bool block_device = false;
  uint64_t size = 0;  // the file's or the device's size in bytes
};

Result<BenchTarget> inspect_target(const std::string& path, bool write) {
  BenchTarget t;
  std::string dir = path.rfind('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  // The file system the path resolves to (statfs follows links: a link to /proc/self/mem is
  // /proc), else, for a file yet to be laid out, its folder's.
  struct statfs fs;
  int got = ::statfs(path.c_str(), &fs);
  if (got != 0 && errno == ENOENT) got = ::statfs(dir.empty() ? "/" : dir.c_str(), &fs);
  if (got == 0 && (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC))
    return fail(Code::kInvalidArgument,
                "--file " + path + " is under /proc or /sys, which hold no storage to measure");
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno != ENOENT) return fail_errno(errno, "stat --file " + path);
    return t;
  }
  t.exists = true;
  if (S_ISDIR(sb.st_mode))
    return fail(Code::kInvalidArgument, "--file " + path + " is a directory");
  if (S_ISREG(sb.st_mode)) {
    t.size = static_cast<uint64_t>(sb.st_size);
    return t;
  }
  if (!S_ISBLK(sb.st_mode))
    return fail(Code::kInvalidArgument, "--file " + path + " is a " +
                                            (S_ISFIFO(sb.st_mode)   ? "FIFO"
                                             : S_ISSOCK(sb.st_mode) ? "socket"
                                             : S_ISCHR(sb.st_mode)  ? "character device"
                                                                    : "special file") +
                                            ", not a regular file or block device");
  if (write)
    return fail(Code::kInvalidArgument, "--file " + path +
                                            " is a block device: a write benchmark would destroy "
                                            "its contents, so sluice bench only reads devices");
  t.block_device = true;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return fail_errno(errno, "open block device " + path);
  if (::ioctl(fd.get(), BLKGETSIZE64, &t.size) != 0)
    return fail_errno(errno, "size of block device " + path);
  return t;
}

struct ThreadStats {
  uint64_t bytes = 0, ops = 0;
  telemetry::HistogramSnapshot lat;
  std::optional<Error> error;
  bool verified = true;
};

}  // namespace

std::string BenchResult::json() const {
  nlohmann::json j = {{"mode", mode},
                      {"rw", rw},
                      {"path", path},
                      {"path_why", path_why},
                      {"bs", bs},
                      {"qd", qd},
                      {"threads", threads},
                      {"size", size},
                      {"bytes", bytes},
                      {"ops", ops},
                      {"seconds", seconds},
                      {"throughput_gib_s", throughput_gib_s},
                      {"iops", iops},
                      {"lat_us",
                       {{"avg", lat_avg_us},
                        {"p50", lat_p50_us},
                        {"p99", lat_p99_us},
                        {"p999", lat_p999_us},
                        {"max", lat_max_us}}},
                      {"cpu_pct", cpu_pct},
                      {"cpu_user_pct", cpu_user_pct},
                      {"cpu_sys_pct", cpu_sys_pct},
                      {"verified", verified}};
  return j.dump();
}

namespace {

Status validate(const BenchOptions& o) {
  if (o.file.empty()) return fail(Code::kInvalidArgument, "--file is required");
  if (o.bs == 0) return fail(Code::kInvalidArgument, "--bs must be greater than 0");
  if (o.bs > (1u << 30)) return fail(Code::kInvalidArgument, "--bs above 1 GiB");
  if (o.qd == 0 || o.qd > 1024) return fail(Code::kInvalidArgument, "--qd must be 1..1024");
  if (o.threads == 0 || o.threads > 256)
    return fail(Code::kInvalidArgument, "--threads must be 1..256");
  if (!std::isfinite(o.runtime) || o.runtime < 0 || o.runtime > 1e7)
    return fail(Code::kInvalidArgument, "--runtime must be a number of seconds from 0 to 10000000");
  if (o.size && *o.size == 0) return fail(Code::kInvalidArgument, "--size must be greater than 0");
  return ok();
}

// The target and the bytes of it to work over: given, or the existing file's.
struct BenchPlan {
  BenchTarget file;
  uint64_t size = 0;
};

Result<BenchPlan> plan_target(const BenchOptions& o) {
  BenchPlan plan;
  SLUICE_ASSIGN_OR_RETURN(plan.file, inspect_target(o.file, is_write(o.rw)));
  plan.size = o.size.value_or(0);
  if (!o.size) {
    if (!plan.file.exists)
      return fail(Code::kNotFound,
                  "--file " + o.file + " does not exist; give --size to create it");
    plan.size = plan.file.size;
    if (plan.size == 0)
      return fail(Code::kInvalidArgument, "--file " + o.file + " is empty; give --size");
  }
  if (plan.file.block_device) {
    if (plan.size > plan.file.size)
      return fail(Code::kInvalidArgument, "--size " + std::to_string(plan.size) +
                                              " is larger than " + o.file + " (" +
                                              std::to_string(plan.file.size) + " bytes)");
    if (o.verify)
      return fail(Code::kInvalidArgument,
                  "--verify needs sluice's pattern in the file; block device " + o.file +
                      " is never written, so it cannot hold it");
  }
  if (plan.size < o.bs)
    return fail(Code::kInvalidArgument, "--size " + std::to_string(plan.size) +
                                            " is smaller than --bs " + std::to_string(o.bs));
  return plan;
}

// The engine and open flags each mode stands for.
std::pair<io::ContextOptions, io::OpenOptions> configure(const BenchOptions& o,
                                                         const BenchPlan& plan) {
  io::ContextOptions co;
  co.engine.queue_depth = o.qd;
  co.chunk_size = std::max<size_t>(
      1 << 20, (o.bs + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment);
  co.staging_buffers = std::max(8u, o.qd);
  co.cufile_library = o.cufile_library;
  io::OpenOptions oo;
  oo.write = is_write(o.rw) || !plan.file.exists;
  oo.create = !plan.file.block_device;
  switch (o.mode) {
    case BenchMode::kBuffered:
      oo.direct = io::DirectMode::kOff;
      break;
    case BenchMode::kDirect:
      co.engine.kind = io::EngineKind::kThreadPool;
      co.engine.threads = o.qd;
      oo.direct = io::DirectMode::kOn;
      break;
    case BenchMode::kUring:
      co.engine.kind = io::EngineKind::kUring;
      oo.direct = io::DirectMode::kOn;
      break;
    case BenchMode::kBounce:
    case BenchMode::kGpu:
    case BenchMode::kGds:
      break;
  }
  // Only gds asks for cuFile; every other mode takes the POSIX path on purpose.
  oo.compat = o.mode == BenchMode::kGds ? io::CompatMode::kOff : io::CompatMode::kOn;
  return {co, oo};
}

// The memory the bytes land in: none (host buffers), the emulated device, or CUDA.
Result<std::unique_ptr<mem::Target>> open_memory(const BenchOptions& o) {
  if (o.mode == BenchMode::kBounce)
    return mem::make_emulated_device(static_cast<size_t>(o.bs) * o.qd * o.threads + (1 << 20));
  if (o.mode != BenchMode::kGpu && o.mode != BenchMode::kGds) return std::unique_ptr<mem::Target>();
  mem::CudaOptions cu;
  cu.library = o.cuda_library;
  auto t = mem::open_cuda_target(cu);
  if (!t)
    return std::unexpected(
        t.error().with_context(std::string("--mode ") + std::string(bench_mode_name(o.mode))));
  return std::move(*t);
}

// Lays out what the run reads (regular files only; never a device).
Status prepare_file(const BenchOptions& o, const BenchPlan& plan,
                    const std::shared_ptr<io::Context>& ctx) {
  const bool exists = plan.file.exists;
  // Check the directory is writable before laying anything out.
  auto parent = o.file.substr(0, o.file.rfind('/') == std::string::npos ? 0 : o.file.rfind('/'));
  if ((!exists || is_write(o.rw)) && ::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0)
    return fail_errno(errno, "directory '" + (parent.empty() ? std::string(".") : parent) +
                                 "' of --file " + o.file + " is not writable");
  // Reads need the file there; --verify of writes lays the pattern over the whole range
  // first, so every block, written in this run or not, must read back as the pattern.
  if (o.verify && is_write(o.rw) && ::truncate(o.file.c_str(), 0) != 0 && errno != ENOENT)
    return fail_errno(errno, "truncate " + o.file + " before a verified write");
  if (!plan.file.block_device && (!is_write(o.rw) || !exists || o.verify))
    SLUICE_RETURN_IF_ERROR(lay_out(ctx, o.file, plan.size, o));
  return ok();
}

// What every worker thread of one run shares.
struct RunState {
  const BenchOptions& o;
  std::shared_ptr<io::Context> ctx;
  io::FileHandle& fh;
  mem::Target* target;  // null: host buffers
  uint64_t blocks;
  // Relaxed where polled: it only ends issuing early; results are joined with the threads.
  std::atomic<bool> stop{false};
  // Workers set up (buffers touched, batch leased), report ready, then wait for `go`, so
  // the clock and CPU accounting cover only the I/O.
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
};

// One submitting thread: `qd` slots, each a buffer and a request in flight.
class Worker {
 public:
  Worker(RunState& run, unsigned index, ThreadStats& stats)
      : run_(run), o_(run.o), t_(index), st_(stats) {}

  void run() {
    if (auto s = set_up(); !s) return fail_with(s.error());
    run_.ready.fetch_add(1);
    run_.ready.notify_all();
    run_.go.wait(false);
    if (auto s = loop(); !s) return fail_with(s.error());
    st_.lat = lat_.snapshot();
  }

 private:
  void fail_with(Error e) {
    st_.error = std::move(e);
    run_.stop.store(true);
    run_.ready.fetch_add(1);  // never leave the starter waiting (extra counts are harmless)
    run_.ready.notify_all();
  }

  Status set_up() {
    host_.resize(run_.target ? 0 : o_.qd);
    for (auto& h : host_) {
      SLUICE_ASSIGN_OR_RETURN(h, AlignedBuffer::allocate(o_.bs));
      std::memset(h.data(), 0, o_.bs);  // touch once, so first-touch cost is not measured
    }
    if (run_.target) {
      SLUICE_ASSIGN_OR_RETURN(dev_, run_.target->allocate(o_.bs * o_.qd));
    }
    if (o_.verify) {
      SLUICE_ASSIGN_OR_RETURN(check_, AlignedBuffer::allocate(o_.bs));
    }
    // Created after the buffers, so it is destroyed (and drained) before them.
    SLUICE_ASSIGN_OR_RETURN(batch_, io::Batch::create(run_.ctx, o_.qd));
    first_ = run_.blocks * t_ / o_.threads;
    uint64_t last = run_.blocks * (t_ + 1) / o_.threads;
    span_ = std::max<uint64_t>(last - first_, 1);
    quota_ = o_.runtime > 0 ? UINT64_MAX : (random() ? run_.blocks / o_.threads : span_);
    rng_.seed(0x5111CEULL + t_);
    issued_at_.resize(o_.qd);
    offset_of_.resize(o_.qd);
    for (unsigned i = 0; i < o_.qd; ++i) free_slots_.push_back(o_.qd - 1 - i);
    return ok();
  }

  bool write() const { return is_write(o_.rw); }
  bool random() const { return is_random(o_.rw); }
  io::Buffer slot_buffer(unsigned slot) {
    return run_.target ? io::Buffer{dev_.get(), dev_.size(), run_.target}
                       : io::Buffer::host(host_[slot].data(), o_.bs);
  }
  size_t slot_offset(unsigned slot) const { return run_.target ? size_t{slot} * o_.bs : 0; }
  std::byte* slot_device(unsigned slot) {
    return static_cast<std::byte*>(dev_.get()) + slot_offset(slot);
  }

  // A verified write carries the pattern of its offset (copied to the device first).
  Status fill(unsigned slot, uint64_t off) {
    if (!write() || !o_.verify) return ok();
    if (!run_.target) {
      fill_pattern(host_[slot].data(), o_.bs, off);
      return ok();
    }
    fill_pattern(check_.data(), o_.bs, off);
    SLUICE_ASSIGN_OR_RETURN(uint64_t tk,
                            run_.target->copy_to_target(slot_device(slot), check_.data(), o_.bs));
    return run_.target->wait(tk);
  }

  // Checks one completed request: its length and, for verified reads, every byte.
  Status complete(unsigned slot, size_t n) {
    if (n != o_.bs)
      return fail(Code::kIoError, "short " + std::string(write() ? "write" : "read") + " of " +
                                      std::to_string(n) + " bytes at offset " +
                                      std::to_string(offset_of_[slot]) + " of " + o_.file);
    if (!o_.verify || write()) return ok();
    const std::byte* got = host_.empty() ? nullptr : host_[slot].data();
    if (run_.target) {
      SLUICE_ASSIGN_OR_RETURN(uint64_t tk,
                              run_.target->copy_to_host(check_.data(), slot_device(slot), o_.bs));
      SLUICE_RETURN_IF_ERROR(run_.target->wait(tk));
      got = check_.data();
    }
    int64_t bad = check_pattern(got, o_.bs, offset_of_[slot]);
    if (bad >= 0)
      return fail(Code::kCorruption,
                  "verify failed: wrong byte at offset " + std::to_string(bad) + " of " + o_.file +
                      " (was the file written by something other than sluice bench?)");
    return ok();
  }

  // Keeps every free slot busy until the quota is issued (or the run stops), and reaps.
  Status loop() {
    std::vector<io::BatchIO> ios;
    std::vector<io::BatchResult> results;
    while (true) {
      ios.clear();
      while (!free_slots_.empty() && issued_ < quota_ &&
             !run_.stop.load(std::memory_order_relaxed)) {
        unsigned slot = free_slots_.back();
        free_slots_.pop_back();
        uint64_t blk = random() ? rng_() % run_.blocks : first_ + (next_++ % span_);
        uint64_t off = blk * o_.bs;
        SLUICE_RETURN_IF_ERROR(fill(slot, off));
        offset_of_[slot] = off;
        issued_at_[slot] = telemetry::now_ns();
        ios.push_back(io::BatchIO{write() ? io::OpCode::kWrite : io::OpCode::kRead, &run_.fh,
                                  slot_buffer(slot), o_.bs, off, slot_offset(slot), slot});
        ++issued_;
      }
      if (!ios.empty()) SLUICE_RETURN_IF_ERROR(batch_->submit(ios));
      if (batch_->in_flight() == 0) return ok();
      results.clear();
      SLUICE_RETURN_IF_ERROR(batch_->wait(results, 1, std::chrono::seconds(30)));
      uint64_t now = telemetry::now_ns();
      for (auto& r : results) {
        unsigned slot = static_cast<unsigned>(r.cookie);
        if (!r.result) return std::unexpected(r.result.error());
        lat_.record(now - issued_at_[slot]);
        st_.bytes += *r.result;
        ++st_.ops;
        SLUICE_RETURN_IF_ERROR(complete(slot, *r.result));
        free_slots_.push_back(slot);
      }
    }
  }

  RunState& run_;
  const BenchOptions& o_;
  const unsigned t_;
  ThreadStats& st_;
  std::vector<AlignedBuffer> host_;  // one buffer per slot (host memory runs)
  mem::Allocation dev_;              // qd slots of device memory (device runs)
  AlignedBuffer check_;              // verification scratch
  std::optional<io::Batch> batch_;
  uint64_t first_ = 0, span_ = 1, next_ = 0, quota_ = 0, issued_ = 0;
  std::mt19937_64 rng_;
  std::vector<uint64_t> issued_at_, offset_of_;
  std::vector<unsigned> free_slots_;
  telemetry::Histogram lat_;
};

BenchResult summarize(const BenchOptions& o, const BenchPlan& plan, const io::FileHandle& fh,
                      const mem::Target* target, const std::vector<ThreadStats>& stats,
                      double seconds, double user_s, double sys_s) {
  BenchResult res;
  res.mode = bench_mode_name(o.mode);
  res.rw = bench_rw_name(o.rw);
  auto report = fh.path_report();
  res.path = report.describe(target);
  res.path_why = report.why;
  res.bs = o.bs;
  res.size = plan.size;
  res.qd = o.qd;
  res.threads = o.threads;
  telemetry::HistogramSnapshot lat;
  for (auto& st : stats) {
    res.bytes += st.bytes;
    res.ops += st.ops;
    lat.merge(st.lat);
  }
  res.seconds = seconds;
  res.throughput_gib_s = static_cast<double>(res.bytes) / res.seconds / (1 << 30);
  res.iops = static_cast<double>(res.ops) / res.seconds;
  res.lat_avg_us = lat.mean() / 1e3;
  res.lat_p50_us = lat.quantile(0.50) / 1e3;
  res.lat_p99_us = lat.quantile(0.99) / 1e3;
  res.lat_p999_us = lat.quantile(0.999) / 1e3;
  res.lat_max_us = static_cast<double>(lat.max) / 1e3;
  res.cpu_user_pct = user_s / res.seconds * 100;
  res.cpu_sys_pct = sys_s / res.seconds * 100;
  res.cpu_pct = res.cpu_user_pct + res.cpu_sys_pct;
  res.verified = o.verify;
  return res;
}

// After a verified write: the whole range read back, every written block the pattern.
Status verify_written(const BenchOptions& o, const std::shared_ptr<io::Context>& ctx,
                      uint64_t bytes) {
  const size_t chunk = 16 << 20;
  SLUICE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::allocate(chunk));
  SLUICE_ASSIGN_OR_RETURN(auto rh, io::FileHandle::open(ctx, o.file, {}));
  for (uint64_t off = 0; off < bytes; off += chunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
    SLUICE_ASSIGN_OR_RETURN(size_t got, rh.read(io::Buffer::host(buf.data(), n), n, off));
    if (got != n)
      return fail(Code::kCorruption, "verify: " + o.file + " ends at " + std::to_string(off + got));
    int64_t bad = check_pattern(buf.data(), n, off);
    if (bad >= 0)
      return fail(Code::kCorruption,
                  "verify failed: wrong byte at offset " + std::to_string(bad) + " of " + o.file);
  }
  return ok();
}

}  // namespace

Result<BenchResult> run_bench(const BenchOptions& o) {
  SLUICE_RETURN_IF_ERROR(validate(o));
  SLUICE_ASSIGN_OR_RETURN(BenchPlan plan, plan_target(o));
  auto [co, oo] = configure(o, plan);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<mem::Target> target, open_memory(o));
  SLUICE_ASSIGN_OR_RETURN(auto ctx, io::Context::open(co));
  SLUICE_RETURN_IF_ERROR(prepare_file(o, plan, ctx));
  SLUICE_ASSIGN_OR_RETURN(io::FileHandle fh, io::FileHandle::open(ctx, o.file, oo));

  RunState run{o, ctx, fh, target.get(), plan.size / o.bs};
  std::vector<ThreadStats> stats(o.threads);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < o.threads; ++t)
    threads.emplace_back([&run, &stats, t] { Worker(run, t, stats[t]).run(); });
  for (unsigned r; (r = run.ready.load()) < o.threads;) run.ready.wait(r);
  struct rusage r0, r1;
  ::getrusage(RUSAGE_SELF, &r0);
  auto t0 = std::chrono::steady_clock::now();
  run.go.store(true);
  run.go.notify_all();
  if (o.runtime > 0) {
    auto until = t0 + std::chrono::duration<double>(o.runtime);
    while (!run.stop.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    run.stop.store(true);
  }
  for (auto& th : threads) th.join();
  auto t1 = std::chrono::steady_clock::now();
  ::getrusage(RUSAGE_SELF, &r1);
  for (auto& st : stats)
    if (st.error) return std::unexpected(*st.error);

  // A written file is verified by reading it back through the same path.
  if (is_write(o.rw)) SLUICE_RETURN_IF_ERROR(fh.sync());
  BenchResult res =
      summarize(o, plan, fh, target.get(), stats, std::chrono::duration<double>(t1 - t0).count(),
                cpu_seconds(r1, true) - cpu_seconds(r0, true),
                cpu_seconds(r1, false) - cpu_seconds(r0, false));
  if (o.verify && is_write(o.rw)) SLUICE_RETURN_IF_ERROR(verify_written(o, ctx, run.blocks * o.bs));
  return res;
}

}  // namespace sluice::io
