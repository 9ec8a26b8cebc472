// `sluice bench`: like gdsio, every path through the public data-path API (FileHandle and
// Batch), `qd` requests of `bs` bytes kept in flight per thread.
#include "bench.h"

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

#include "sizes.h"
#include "sluice/core/fd.h"
#include "sluice/io/file_handle.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cli {

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
               bool progress) {
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
  int last_pct = -1;
  for (uint64_t off = start; off < size; off += chunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, size - off));
    fill_pattern(buf.data(), n, off);
    SLUICE_ASSIGN_OR_RETURN(size_t w, fh.write(io::Buffer::host(buf.data(), n), n, off));
    (void)w;
    int pct = static_cast<int>((off + n - start) * 100 / (size - start));
    if (progress && pct / 10 != last_pct / 10) {
      std::fprintf(stderr, "\rlaying out %s: %d%% of %s", path.c_str(), pct,
                   format_size(static_cast<double>(size)).c_str());
      last_pct = pct;
    }
  }
  if (progress) std::fprintf(stderr, "\n");
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
  struct statfs fs;
  if (::statfs(dir.empty() ? "/" : dir.c_str(), &fs) == 0 &&
      (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC))
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

std::string BenchResult::text() const {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "sluice bench: %s %s, bs %s, qd %u, threads %u, %s\n"
                "  path        %s\n"
                "  why         %s\n"
                "  throughput  %.3f GiB/s   (%s in %.2f s)\n"
                "  IOPS        %.0f\n"
                "  latency us  avg %.1f   p50 %.1f   p99 %.1f   p99.9 %.1f   max %.1f\n"
                "  CPU         %.1f%% (user %.1f%%, sys %.1f%%)%s\n",
                mode.c_str(), rw.c_str(), format_size(static_cast<double>(bs)).c_str(), qd, threads,
                format_size(static_cast<double>(size)).c_str(), path.c_str(), path_why.c_str(),
                throughput_gib_s, format_size(static_cast<double>(bytes)).c_str(), seconds, iops,
                lat_avg_us, lat_p50_us, lat_p99_us, lat_p999_us, lat_max_us, cpu_pct, cpu_user_pct,
                cpu_sys_pct, verified ? "\n  verify      every byte checked: OK" : "");
  return buf;
}

Result<BenchResult> run_bench(const BenchOptions& o) {
  if (o.file.empty()) return fail(Code::kInvalidArgument, "--file is required");
  if (o.bs == 0) return fail(Code::kInvalidArgument, "--bs must be greater than 0");
  if (o.bs > (1u << 30)) return fail(Code::kInvalidArgument, "--bs above 1 GiB");
  if (o.qd == 0 || o.qd > 1024) return fail(Code::kInvalidArgument, "--qd must be 1..1024");
  if (o.threads == 0 || o.threads > 256)
    return fail(Code::kInvalidArgument, "--threads must be 1..256");
  if (!std::isfinite(o.runtime) || o.runtime < 0 || o.runtime > 1e7)
    return fail(Code::kInvalidArgument, "--runtime must be a number of seconds from 0 to 10000000");

  // The size to work over: given, or the existing file's.
  if (o.size && *o.size == 0) return fail(Code::kInvalidArgument, "--size must be greater than 0");
  uint64_t size = o.size.value_or(0);
  SLUICE_ASSIGN_OR_RETURN(BenchTarget target_file, inspect_target(o.file, is_write(o.rw)));
  const bool exists = target_file.exists;
  if (!o.size) {
    if (!exists)
      return fail(Code::kNotFound,
                  "--file " + o.file + " does not exist; give --size to create it");
    size = target_file.size;
    if (size == 0)
      return fail(Code::kInvalidArgument, "--file " + o.file + " is empty; give --size");
  }
  if (target_file.block_device) {
    if (size > target_file.size)
      return fail(Code::kInvalidArgument, "--size " + std::to_string(size) + " is larger than " +
                                              o.file + " (" + std::to_string(target_file.size) +
                                              " bytes)");
    if (o.verify)
      return fail(Code::kInvalidArgument,
                  "--verify needs sluice's pattern in the file; block device " + o.file +
                      " is never written, so it cannot hold it");
  }
  if (size < o.bs)
    return fail(Code::kInvalidArgument,
                "--size " + std::to_string(size) + " is smaller than --bs " + std::to_string(o.bs));

  io::ContextOptions co;
  co.engine.queue_depth = o.qd;
  co.chunk_size = std::max<size_t>(
      1 << 20, (o.bs + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment);
  co.staging_buffers = std::max(8u, o.qd);
  co.cufile_library = o.cufile_library;
  io::OpenOptions oo;
  oo.write = is_write(o.rw) || !exists;
  oo.create = !target_file.block_device;
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

  // The memory the bytes land in.
  std::unique_ptr<mem::Target> target;
  if (o.mode == BenchMode::kBounce) {
    target = mem::make_emulated_device(static_cast<size_t>(o.bs) * o.qd * o.threads + (1 << 20));
  } else if (o.mode == BenchMode::kGpu || o.mode == BenchMode::kGds) {
    mem::CudaOptions cu;
    cu.library = o.cuda_library;
    auto t = mem::open_cuda_target(cu);
    if (!t)
      return std::unexpected(
          t.error().with_context(std::string("--mode ") + std::string(bench_mode_name(o.mode))));
    target = std::move(*t);
  }

  SLUICE_ASSIGN_OR_RETURN(auto ctx, io::Context::open(co));
  {
    // Check the directory is writable before laying anything out.
    auto parent = o.file.substr(0, o.file.rfind('/') == std::string::npos ? 0 : o.file.rfind('/'));
    if ((!exists || is_write(o.rw)) && ::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0)
      return fail_errno(errno, "directory '" + (parent.empty() ? std::string(".") : parent) +
                                   "' of --file " + o.file + " is not writable");
  }
  // Reads need the file there; --verify of writes lays the pattern over the whole range
  // first, so every block, written in this run or not, must read back as the pattern.
  if (o.verify && is_write(o.rw) && ::truncate(o.file.c_str(), 0) != 0 && errno != ENOENT)
    return fail_errno(errno, "truncate " + o.file + " before a verified write");
  if (!target_file.block_device && (!is_write(o.rw) || !exists || o.verify))
    SLUICE_RETURN_IF_ERROR(lay_out(ctx, o.file, size, o.progress));
  SLUICE_ASSIGN_OR_RETURN(io::FileHandle fh, io::FileHandle::open(ctx, o.file, oo));

  const uint64_t blocks = size / o.bs;
  const bool write = is_write(o.rw), random = is_random(o.rw);
  const bool verify_inline = o.verify && !write;
  std::vector<ThreadStats> stats(o.threads);
  std::atomic<bool> stop{false};
  // Workers set up (buffers touched, batch leased), report ready, then wait for `go`, so
  // the clock and CPU accounting cover only the I/O.
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};

  auto worker = [&](unsigned t) {
    ThreadStats& st = stats[t];
    auto fail_with = [&](Error e) {
      st.error = std::move(e);
      stop.store(true);
      ready.fetch_add(1);  // never leave the starter waiting (extra counts are harmless)
      ready.notify_all();
    };
    // One buffer slot per request in flight.
    std::vector<AlignedBuffer> host(target ? 0 : o.qd);
    mem::Allocation dev;
    for (auto& h : host) {
      auto b = AlignedBuffer::allocate(o.bs);
      if (!b) return fail_with(b.error());
      h = std::move(*b);
      std::memset(h.data(), 0, o.bs);  // touch once, so first-touch cost is not measured
    }
    if (target) {
      auto a = target->allocate(o.bs * o.qd);
      if (!a) return fail_with(a.error());
      dev = std::move(*a);
    }
    AlignedBuffer check;
    if (o.verify) {
      auto b = AlignedBuffer::allocate(o.bs);
      if (!b) return fail_with(b.error());
      check = std::move(*b);
    }
    // Created after the buffers, so it is destroyed (and drained) before them.
    auto batch = io::Batch::create(ctx, o.qd);
    if (!batch) return fail_with(batch.error());
    auto slot_buffer = [&](unsigned slot) {
      return target ? io::Buffer{dev.get(), dev.size(), target.get()}
                    : io::Buffer::host(host[slot].data(), o.bs);
    };
    auto slot_offset = [&](unsigned slot) -> size_t { return target ? size_t{slot} * o.bs : 0; };

    uint64_t first = blocks * t / o.threads, last = blocks * (t + 1) / o.threads;
    uint64_t span = std::max<uint64_t>(last - first, 1);
    uint64_t next = 0;
    const uint64_t quota = o.runtime > 0 ? UINT64_MAX : (random ? blocks / o.threads : span);
    std::mt19937_64 rng(0x5111CEULL + t);
    std::vector<uint64_t> issued_at(o.qd), offset_of(o.qd);
    std::vector<unsigned> free_slots;
    for (unsigned i = 0; i < o.qd; ++i) free_slots.push_back(o.qd - 1 - i);
    telemetry::Histogram lat;
    uint64_t issued = 0;

    auto prepare = [&](unsigned slot, uint64_t off) -> Status {
      if (!write) return ok();
      if (o.verify && !target) fill_pattern(host[slot].data(), o.bs, off);
      if (o.verify && target) {
        fill_pattern(check.data(), o.bs, off);
        SLUICE_ASSIGN_OR_RETURN(
            uint64_t tk,
            target->copy_to_target(static_cast<std::byte*>(dev.get()) + slot_offset(slot),
                                   check.data(), o.bs));
        SLUICE_RETURN_IF_ERROR(target->wait(tk));
      }
      return ok();
    };

    ready.fetch_add(1);
    ready.notify_all();
    go.wait(false);
    std::vector<io::BatchIO> ios;
    std::vector<io::BatchResult> results;
    while (true) {
      ios.clear();
      while (!free_slots.empty() && issued < quota && !stop.load(std::memory_order_relaxed)) {
        unsigned slot = free_slots.back();
        free_slots.pop_back();
        uint64_t blk = random ? rng() % blocks : first + (next++ % span);
        uint64_t off = blk * o.bs;
        if (auto s = prepare(slot, off); !s) return fail_with(s.error());
        offset_of[slot] = off;
        issued_at[slot] = telemetry::now_ns();
        ios.push_back(io::BatchIO{write ? io::OpCode::kWrite : io::OpCode::kRead, &fh,
                                  slot_buffer(slot), o.bs, off, slot_offset(slot), slot});
        ++issued;
      }
      if (!ios.empty())
        if (auto s = batch->submit(ios); !s) return fail_with(s.error());
      if (batch->in_flight() == 0) break;
      results.clear();
      auto n = batch->wait(results, 1, std::chrono::seconds(30));
      if (!n) return fail_with(n.error());
      uint64_t now = telemetry::now_ns();
      for (auto& r : results) {
        unsigned slot = static_cast<unsigned>(r.cookie);
        if (!r.result) return fail_with(r.result.error());
        lat.record(now - issued_at[slot]);
        st.bytes += *r.result;
        ++st.ops;
        if (*r.result != o.bs)
          return fail_with(
              Error(Code::kIoError, "short " + std::string(write ? "write" : "read") + " of " +
                                        std::to_string(*r.result) + " bytes at offset " +
                                        std::to_string(offset_of[slot]) + " of " + o.file));
        if (verify_inline) {
          const std::byte* got = host.empty() ? nullptr : host[slot].data();
          if (target) {
            auto tk = target->copy_to_host(
                check.data(), static_cast<std::byte*>(dev.get()) + slot_offset(slot), o.bs);
            if (!tk) return fail_with(tk.error());
            if (auto w = target->wait(*tk); !w) return fail_with(w.error());
            got = check.data();
          }
          int64_t bad = check_pattern(got, o.bs, offset_of[slot]);
          if (bad >= 0)
            return fail_with(Error(
                Code::kCorruption,
                "verify failed: wrong byte at offset " + std::to_string(bad) + " of " + o.file +
                    " (was the file written by something other than sluice bench?)"));
        }
        free_slots.push_back(slot);
      }
    }
    st.lat = lat.snapshot();
  };

  std::vector<std::thread> threads;
  for (unsigned t = 0; t < o.threads; ++t) threads.emplace_back(worker, t);
  for (unsigned r; (r = ready.load()) < o.threads;) ready.wait(r);
  struct rusage r0, r1;
  ::getrusage(RUSAGE_SELF, &r0);
  auto t0 = std::chrono::steady_clock::now();
  go.store(true);
  go.notify_all();
  if (o.runtime > 0) {
    auto until = t0 + std::chrono::duration<double>(o.runtime);
    while (!stop.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop.store(true);
  }
  for (auto& th : threads) th.join();
  auto t1 = std::chrono::steady_clock::now();
  ::getrusage(RUSAGE_SELF, &r1);
  for (auto& st : stats)
    if (st.error) return std::unexpected(*st.error);

  // A written file is verified by reading it back through the same path.
  if (write) SLUICE_RETURN_IF_ERROR(fh.sync());

  BenchResult res;
  res.mode = bench_mode_name(o.mode);
  res.rw = bench_rw_name(o.rw);
  auto report = fh.path_report();
  res.path = report.describe(target.get());
  res.path_why = report.why;
  res.bs = o.bs;
  res.size = size;
  res.qd = o.qd;
  res.threads = o.threads;
  telemetry::HistogramSnapshot lat;
  for (auto& st : stats) {
    res.bytes += st.bytes;
    res.ops += st.ops;
    lat.merge(st.lat);
  }
  res.seconds = std::chrono::duration<double>(t1 - t0).count();
  res.throughput_gib_s = static_cast<double>(res.bytes) / res.seconds / (1 << 30);
  res.iops = static_cast<double>(res.ops) / res.seconds;
  res.lat_avg_us = lat.mean() / 1e3;
  res.lat_p50_us = lat.quantile(0.50) / 1e3;
  res.lat_p99_us = lat.quantile(0.99) / 1e3;
  res.lat_p999_us = lat.quantile(0.999) / 1e3;
  res.lat_max_us = static_cast<double>(lat.max) / 1e3;
  double user = cpu_seconds(r1, true) - cpu_seconds(r0, true);
  double sys = cpu_seconds(r1, false) - cpu_seconds(r0, false);
  res.cpu_user_pct = user / res.seconds * 100;
  res.cpu_sys_pct = sys / res.seconds * 100;
  res.cpu_pct = res.cpu_user_pct + res.cpu_sys_pct;

  if (o.verify && write) {
    // Read the whole range back and check every byte: written blocks carry the pattern.
    const size_t chunk = 16 << 20;
    SLUICE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::allocate(chunk));
    SLUICE_ASSIGN_OR_RETURN(auto rh, io::FileHandle::open(ctx, o.file, {}));
    for (uint64_t off = 0; off < blocks * o.bs; off += chunk) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, blocks * o.bs - off));
      SLUICE_ASSIGN_OR_RETURN(size_t got, rh.read(io::Buffer::host(buf.data(), n), n, off));
      if (got != n)
        return fail(Code::kCorruption,
                    "verify: " + o.file + " ends at " + std::to_string(off + got));
      int64_t bad = check_pattern(buf.data(), n, off);
      if (bad >= 0)
        return fail(Code::kCorruption,
                    "verify failed: wrong byte at offset " + std::to_string(bad) + " of " + o.file);
    }
  }
  res.verified = o.verify;
  return res;
}

}  // namespace sluice::cli
