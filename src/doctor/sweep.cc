// The ceiling sweep of `sluice doctor --path`: the bench engine over a grid of points.
#include "sluice/doctor/sweep.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "sluice/core/fd.h"
#include "sluice/doctor/observe.h"
#include "sluice/io/bench.h"

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

}  // namespace sluice::doctor
