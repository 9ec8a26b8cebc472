// The ceiling sweep of `sluice doctor --path`: the bench engine over a grid of points.
#include "sluice/doctor/sweep.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"
#include "sluice/doctor/observe.h"
#include "sluice/io/bench.h"
#include "sluice/io/file_handle.h"
#include "sluice/mem/buffer_pool.h"
#include "sluice/mem/target.h"

#include <nlohmann/json.hpp>

namespace sluice::doctor {

namespace {

using io::BenchMode;

// The grid: every block size at every depth through io_uring, then the thread pool and the
// page cache (from a cold start) at one point each.
struct GridPoint {
  BenchMode mode;
  uint64_t bs;
  unsigned qd;
};

std::vector<GridPoint> sweep_grid(uint64_t size, bool with_buffered) {
  std::vector<GridPoint> g;
  for (uint64_t bs : {uint64_t{4} << 10, uint64_t{64} << 10, uint64_t{1} << 20})
    for (unsigned qd : {1u, 4u, 16u, 64u})
      if (bs <= size) g.push_back({BenchMode::kUring, bs, qd});
  const uint64_t big = size >= (1 << 20) ? 1 << 20 : size >= (64 << 10) ? 64 << 10 : 4 << 10;
  g.push_back({BenchMode::kDirect, big, 16});
  if (with_buffered) g.push_back({BenchMode::kBuffered, big, 1});
  return g;
}

// A point needs this long to say anything (a first request, a ramp to the depth).
constexpr double kMinPointSeconds = 0.25;

// How much a point tells, for a budget too short for all of them: the best large-request
// rate first, then one request at a time (the latency bound), then the page cache.
int point_rank(const GridPoint& g) {
  const bool big = g.bs >= (1 << 20);
  if (g.mode == BenchMode::kBuffered) return 2;
  if (g.mode == BenchMode::kDirect) return 13;
  if (big && g.qd == 16) return 0;
  if (big && g.qd == 1) return 1;
  if (g.bs < (64 << 10) && g.qd == 1) return 3;
  if (big && g.qd == 64) return 4;
  return 5 + static_cast<int>(g.qd) / 16 + (g.bs < (64 << 10) ? 4 : 0);
}

std::vector<GridPoint> sweep_grid(uint64_t size, bool with_buffered, double budget) {
  std::vector<GridPoint> g = sweep_grid(size, with_buffered);
  const size_t fits = std::max<size_t>(1, static_cast<size_t>(budget / kMinPointSeconds));
  if (g.size() <= fits) return g;
  std::vector<GridPoint> ranked = g;
  std::stable_sort(ranked.begin(), ranked.end(), [](const GridPoint& x, const GridPoint& y) {
    return point_rank(x) < point_rank(y);
  });
  ranked.resize(fits);
  std::erase_if(g, [&](const GridPoint& p) {
    return std::none_of(ranked.begin(), ranked.end(), [&](const GridPoint& r) {
      return r.mode == p.mode && r.bs == p.bs && r.qd == p.qd;
    });
  });
  return g;
}

// Drops the target's clean pages from the page cache (no data is written), so a buffered
// point starts cold as a first epoch does.
void drop_cached_pages(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.valid()) (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

// Bytes this process has caused to be fetched from storage (/proc/self/io read_bytes).
uint64_t bytes_fetched_by_me() {
  std::ifstream in("/proc/self/io");
  std::stringstream ss;
  ss << in.rdbuf();
  auto io = parse_proc_io(ss.str());
  return io ? io->read_bytes : 0;
}

std::string device_of(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) return "";
  auto bd = block_device(S_ISBLK(sb.st_mode) ? sb.st_rdev : sb.st_dev);
  return bd ? bd->name : "";
}

}  // namespace

Result<Ceiling> sweep(const std::string& file, const SweepOptions& options) {
  const double budget = options.budget;
  const bool with_buffered = options.with_buffered;
  struct stat sb;
  if (::stat(file.c_str(), &sb) != 0) return fail_errno(errno, "stat " + file);
  uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (S_ISBLK(sb.st_mode)) {
    UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return fail_errno(errno, "open " + file);
    if (::ioctl(fd.get(), BLKGETSIZE64, &size) != 0) return fail_errno(errno, "size of " + file);
  }
  if (size < 4096)
    return fail(Code::kInvalidArgument,
                file + " holds " + std::to_string(size) + " bytes: too few to measure");
  Ceiling c;
  c.target = file;
  c.device = device_of(file);
  // A budget too short for every point measures the most telling ones.
  auto grid = sweep_grid(size, with_buffered, budget);
  const double each = std::max(kMinPointSeconds, budget / static_cast<double>(grid.size()));
  size_t i = 0;
  for (const auto& g : grid) {
    if (options.cancel && options.cancel->load())
      return fail(Code::kCancelled, "sweep of " + file + " interrupted");
    ++i;
    if (!c.direct && g.mode != BenchMode::kBuffered) continue;
    if (options.on_point) options.on_point(i, grid.size(), io::bench_mode_name(g.mode), g.bs, g.qd);
    io::BenchOptions o;
    o.file = file;
    o.mode = g.mode;
    o.rw = io::BenchRw::kRead;
    o.bs = g.bs;
    o.qd = g.qd;
    o.runtime = each;
    if (g.mode == BenchMode::kBuffered) drop_cached_pages(file);
    const uint64_t fetched_before = bytes_fetched_by_me();
    auto r = io::run_bench(o);
    if (!r) {
      if (r.error().code() == Code::kUnsupported && g.mode != BenchMode::kBuffered) {
        c.direct = false;  // no O_DIRECT here: only the page cache is measured
        c.direct_why = r.error().message();
        continue;
      }
      return std::unexpected(r.error().with_context("sweep of " + file));
    }
    std::string engine(io::bench_mode_name(g.mode));
    // A buffered point is a cold one only if the page cache really fetched what it served;
    // pages it could not drop (a mounted file system holds some of a device's) make it a
    // memory-copy figure, kept apart so it is never taken for the storage's.
    if (g.mode == BenchMode::kBuffered &&
        static_cast<double>(bytes_fetched_by_me() - fetched_before) <
            0.5 * static_cast<double>(r->bytes))
      engine = "buffered-cached";
    c.points.push_back(
        {engine, g.bs, g.qd, r->throughput_gib_s * (1 << 30), r->lat_avg_us, r->cpu_pct / 100});
  }
  if (!c.direct && with_buffered == false && c.points.empty()) {
    // Without O_DIRECT the only ceiling is the page cache's.
    drop_cached_pages(file);
    io::BenchOptions o;
    o.file = file;
    o.mode = BenchMode::kBuffered;
    o.bs = std::min<uint64_t>(size / 4096 * 4096, 1 << 20);
    o.qd = 1;
    o.runtime = each;
    SLUICE_ASSIGN_OR_RETURN(auto r, io::run_bench(o));
    c.points.push_back(
        {"buffered", o.bs, 1, r.throughput_gib_s * (1 << 30), r.lat_avg_us, r.cpu_pct / 100});
  }
  return c;
}

namespace {

// Scratch files left by a doctor that was killed (its process is gone) are removed.
void remove_stale_scratch(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".sluice-doctor-")) continue;
    char* end = nullptr;
    long owner = std::strtol(name.c_str() + 15, &end, 10);
    if (owner <= 0 || *end != '\0') continue;
    if (::kill(static_cast<pid_t>(owner), 0) != 0 && errno == ESRCH) fs::remove(it->path(), ec);
  }
}

}  // namespace

Result<std::unique_ptr<ScratchFile>> ScratchFile::create(const std::string& dir,
                                                         const ScratchOptions& o) {
  struct statvfs vf;
  if (::statvfs(dir.c_str(), &vf) != 0) return fail_errno(errno, "statvfs " + dir);
  const uint64_t free_bytes = static_cast<uint64_t>(vf.f_bavail) * vf.f_frsize;
  uint64_t size = o.size ? o.size : std::min<uint64_t>(uint64_t{1} << 30, free_bytes / 4);
  size = size / (1 << 20) * (1 << 20);
  if (o.size && size < (uint64_t{16} << 20))
    return fail(Code::kInvalidArgument, "a scratch file of " +
                                            format_size(static_cast<double>(o.size)) +
                                            " is too small to measure: at least 16 MiB");
  if (size < (uint64_t{16} << 20) || size > free_bytes)
    return fail(Code::kNoSpace,
                dir + " has " + format_size(static_cast<double>(free_bytes)) +
                    " free: too little for a scratch file of " +
                    format_size(static_cast<double>(std::max<uint64_t>(size, uint64_t{16} << 20))));
  remove_stale_scratch(dir);
  const std::string path =
      (std::filesystem::path(dir) / (".sluice-doctor-" + std::to_string(::getpid()))).string();
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      int err = errno;
      return fail(Code::kAlreadyExists,
                  "cannot create the scratch file in " + dir + ": " + std::strerror(err) +
                      (err == EEXIST ? " (a file of that name is there; it is left alone)" : ""));
    }
  }
  std::unique_ptr<ScratchFile> scratch(new ScratchFile(path, size));  // removes it from here on
  io::BenchOptions lay;
  lay.file = path;
  lay.rw = io::BenchRw::kRead;
  lay.bs = 1 << 20;
  lay.qd = 4;
  lay.size = size;
  lay.runtime = 0.01;  // lays the file out; the run itself is cut short
  lay.cancel = o.cancel;
  lay.on_lay_out = o.on_lay_out;
  if (auto laid = io::run_bench(lay); !laid)
    return std::unexpected(laid.error().with_context("scratch file in " + dir));
  drop_cached_pages(path);
  return scratch;
}

ScratchFile::~ScratchFile() {
  ::unlink(path_.c_str());
}

std::string GpuProbe::json() const {
  nlohmann::json j = {{"found", found}};
  if (!why.empty()) j["why"] = why;
  if (found) {
    j["name"] = name;
    j["pinned_h2d_bytes_s"] = pinned_h2d_bytes_s;
    j["pageable_h2d_bytes_s"] = pageable_h2d_bytes_s;
  }
  if (cufile) j["cufile"] = *cufile;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string GpuProbe::text() const {
  if (!found) return "gpu: none found (" + why + ")\n";
  std::string out = "gpu: " + name + "\n";
  out += "  host to device, pinned    " + format_rate(pinned_h2d_bytes_s) + "\n";
  out += "  host to device, pageable  " + format_rate(pageable_h2d_bytes_s) + "\n";
  if (cufile) out += "  cuFile                    " + *cufile + "\n";
  return out;
}

GpuProbe probe_gpu(const std::string& file) {
  GpuProbe g;
  auto cuda = mem::open_cuda_target();
  if (!cuda) {
    g.why = cuda.error().message();
    return g;
  }
  g.found = true;
  g.name = (*cuda)->name();
  const size_t n = size_t{256} << 20;
  auto dev = (*cuda)->allocate(n);
  auto pinned = (*cuda)->staging(n).acquire();
  auto pageable = AlignedBuffer::allocate(n);
  if (!dev || !pinned || !pageable) {
    g.why = "could not allocate 256 MiB on the device and the host";
    return g;
  }
  std::memset(pinned->data(), 1, n);
  std::memset(pageable->data(), 1, n);
  auto rate = [&](const std::byte* src) -> double {
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      auto tk = (*cuda)->copy_to_target(dev->get(), src, n);
      if (!tk || !(*cuda)->wait(*tk)) return 0;
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(n) / s);
    }
    return best;
  };
  g.pinned_h2d_bytes_s = rate(pinned->data());
  g.pageable_h2d_bytes_s = rate(pageable->data());
  if (!file.empty()) {
    auto ctx = io::Context::open({});
    if (ctx) {
      io::OpenOptions oo;
      oo.compat = io::CompatMode::kOff;  // ask for cuFile: the answer says whether it loads
      auto fh = io::FileHandle::open(*ctx, file, oo);
      g.cufile =
          fh ? fh->path_report().describe() + ": " + fh->path_report().why : fh.error().message();
    }
  }
  return g;
}

}  // namespace sluice::doctor
