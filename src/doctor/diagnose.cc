// The doctor's rules. Each rule looks for one cause, quotes the figures that point at it, and
// estimates what fixing it would gain from the measured ceiling; causes are ranked by that
// gain, except that hard evidence of an outside limit (a cgroup throttle, a neighbour
// saturating the device, a thread that never waits on I/O) comes first: while one of those
// holds, the job's own request pattern cannot be judged. docs/doctor.md explains each rule.
#include "sluice/doctor/diagnose.h"

#include <sys/sysmacros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

namespace sluice::doctor {

namespace {

constexpr double kKiB = 1024, kMiB = 1024 * 1024, kGiB = 1024.0 * 1024 * 1024;

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

bool is_direct_engine(const std::string& e) {
  return e == "uring" || e == "direct";
}

}  // namespace

std::string format_bytes(double b) {
  if (b >= kGiB) return fmt("%.1f GiB", b / kGiB);
  if (b >= kMiB) return fmt("%.0f MiB", b / kMiB);
  if (b >= kKiB) return fmt("%.0f KiB", b / kKiB);
  return fmt("%.0f B", b);
}

std::string format_rate(double bytes_s) {
  if (bytes_s >= kGiB) return fmt("%.2f GiB/s", bytes_s / kGiB);
  if (bytes_s >= kMiB) return fmt("%.0f MiB/s", bytes_s / kMiB);
  return fmt("%.0f KiB/s", bytes_s / kKiB);
}

std::optional<SweepPoint> Ceiling::best(const std::string& engine) const {
  std::optional<SweepPoint> b;
  for (const auto& p : points)
    if ((engine.empty() ? is_direct_engine(p.engine) || !direct : p.engine == engine) &&
        (!b || p.bytes_s > b->bytes_s))
      b = p;
  return b;
}

std::optional<SweepPoint> Ceiling::best_at(uint64_t bs, unsigned max_qd) const {
  // The measured block size nearest to `bs` on a log scale.
  std::optional<uint64_t> near;
  for (const auto& p : points) {
    if (!is_direct_engine(p.engine) && direct) continue;
    if (!near ||
        std::abs(std::log2(static_cast<double>(p.bs)) - std::log2(std::max<double>(bs, 1))) <
            std::abs(std::log2(static_cast<double>(*near)) - std::log2(std::max<double>(bs, 1))))
      near = p.bs;
  }
  std::optional<SweepPoint> b;
  for (const auto& p : points)
    if ((is_direct_engine(p.engine) || !direct) && near && p.bs == *near && p.qd <= max_qd &&
        (!b || p.bytes_s > b->bytes_s))
      b = p;
  return b;
}

std::optional<SweepPoint> Ceiling::knee() const {
  auto top = best();
  if (!top) return std::nullopt;
  std::optional<SweepPoint> k;
  for (const auto& p : points)
    if (p.engine == top->engine && p.bs == top->bs && p.bytes_s >= 0.9 * top->bytes_s &&
        (!k || p.qd < k->qd))
      k = p;
  return k;
}

std::string Ceiling::json() const {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : points)
    pts.push_back({{"engine", p.engine},
                   {"bs", p.bs},
                   {"qd", p.qd},
                   {"bytes_s", p.bytes_s},
                   {"lat_us", p.lat_us},
                   {"cpu", p.cpu}});
  nlohmann::json j = {{"target", target},
                      {"device", device},
                      {"direct", direct},
                      {"direct_why", direct_why},
                      {"points", pts}};
  if (auto b = best())
    j["best"] = {{"engine", b->engine}, {"bs", b->bs}, {"qd", b->qd}, {"bytes_s", b->bytes_s}};
  if (auto k = knee())
    j["knee"] = {{"engine", k->engine}, {"bs", k->bs}, {"qd", k->qd}, {"bytes_s", k->bytes_s}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<Ceiling> Ceiling::from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kInvalidArgument,
                "a ceiling must be the JSON object `sluice doctor --path "
                "--json` prints");
  // `--json` of a whole report holds the ceiling under "ceiling".
  if (j.contains("ceiling") && j["ceiling"].is_object()) {
    nlohmann::json inner = std::move(j["ceiling"]);  // moved: a copy of a deep tree recurses
    j = std::move(inner);
  }
  Ceiling c;
  try {
    c.target = j.value("target", "");
    c.device = j.value("device", "");
    c.direct = j.value("direct", true);
    c.direct_why = j.value("direct_why", "");
    for (const auto& p : j.at("points")) {
      const nlohmann::json &bs = p.at("bs"), &qd = p.at("qd");
      // Whole numbers only: a float out of range has no integer value (converting it would be
      // undefined), and a count over 32 bits must not wrap into range.
      if (!bs.is_number_unsigned() || !qd.is_number_unsigned())
        return fail(Code::kInvalidArgument, "a ceiling point's bs and qd must be whole numbers");
      SweepPoint s{p.at("engine").get<std::string>(),
                   bs.get<uint64_t>(),
                   static_cast<unsigned>(std::min<uint64_t>(qd.get<uint64_t>(), 65537)),
                   p.at("bytes_s").get<double>(),
                   p.value("lat_us", 0.0),
                   p.value("cpu", 0.0)};
      if (s.bs == 0 || s.qd == 0 || !std::isfinite(s.bytes_s) || s.bytes_s < 0)
        return fail(Code::kInvalidArgument, "a ceiling point has bs 0, qd 0 or a bad rate");
      if (s.bs > (uint64_t{1} << 30) || s.qd > 65536 ||
          (s.engine != "uring" && s.engine != "direct" && s.engine != "buffered" &&
           s.engine != "buffered-cached"))
        return fail(Code::kInvalidArgument, "a ceiling point has an unknown engine '" + s.engine +
                                                "', or bs over 1 GiB, or qd over 65536");
      c.points.push_back(std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    return fail(Code::kInvalidArgument, std::string("ceiling JSON: ") + e.what());
  }
  if (c.points.empty()) return fail(Code::kInvalidArgument, "the ceiling has no measured point");
  return c;
}

namespace {

// What the rules share: the figures, and the ceiling's answers with fallbacks when no sweep
// was run (then a gain is a plain guess of 2 and the report says no ceiling was measured).
struct Facts {
  const Observation& ob;
  const std::optional<Ceiling>& ceiling;
  double job = 0;   // bytes/s the job read from storage
  double best = 0;  // the ceiling's best, or 0
  const DeviceActivity* dev = nullptr;
  std::vector<const OpenFile*> files;  // the job's files on that device
  bool direct = false, buffered = false;
  const ThreadActivity* top = nullptr;  // the busiest thread
  // The device's requests: average size R and how many in flight Q; the job's read calls'
  // average size S.
  double R = 0, Q = 0, S = 0;
  unsigned qd_now = 1;
  bool no_direct = false;          // a file's file system refuses O_DIRECT
  const OpenFile* frag = nullptr;  // the most fragmented of the job's files, if any is
  bool split = false;              // the device sees requests under half the calls' size

  double gain_to(double rate) const {
    if (rate <= 0) return 2;
    return rate / std::max(job, 1.0);
  }
  double at(uint64_t bs, unsigned max_qd = ~0u) const {
    if (!ceiling) return 0;
    auto p = ceiling->best_at(bs, max_qd);
    return p ? p->bytes_s : 0;
  }
  double best_of(const char* engine) const {
    if (!ceiling) return 0;
    auto b = ceiling->best(engine);
    return b ? b->bytes_s : 0;
  }
  // Fragmentation explains the small requests (fragmented), rather than splitting.
  bool fragmented() const { return frag && (split || R < 256 * kKiB); }
};

Facts gather(const Observation& ob, const std::optional<Ceiling>& ceiling) {
  Facts f{ob, ceiling};
  f.job = ob.job.read_bytes_s;
  if (ceiling)
    if (auto b = ceiling->best()) f.best = b->bytes_s;
  f.top = ob.job.threads.empty() ? nullptr : &ob.job.threads.front();
  if (!ob.device) return f;
  f.dev = &*ob.device;
  for (const auto& file : ob.files) {
    if (::major(file.dev) != f.dev->device.major || ::minor(file.dev) != f.dev->device.minor)
      continue;
    f.files.push_back(&file);
    (file.direct ? f.direct : f.buffered) = true;
  }
  f.R = f.dev->avg_read_bytes;
  f.Q = f.dev->in_flight;
  f.S = ob.job.avg_call_bytes;
  f.qd_now = static_cast<unsigned>(std::max(1.0, std::round(f.Q)));
  for (auto* file : f.files) {
    f.no_direct = f.no_direct || !file->direct_ok;
    if (!file->block_device && file->extents >= 256 &&
        static_cast<double>(file->size) / static_cast<double>(file->extents) < kMiB &&
        (!f.frag || file->extents > f.frag->extents))
      f.frag = file;
  }
  f.split = f.S > 0 && f.R > 0 && f.R < f.S / 2;
  return f;
}

// --- the rules: each looks for one cause and says what points at it -------------------

// An outside limit: a cgroup throttle on the device.
std::optional<Cause> throttled(const Facts& f) {
  if (!f.ob.limit) return std::nullopt;
  const auto& l = *f.ob.limit;
  bool at_bps = l.bytes_per_s && f.job >= 0.7 * static_cast<double>(l.bytes_per_s);
  bool at_iops = l.iops && f.dev->read_iops >= 0.7 * static_cast<double>(l.iops);
  if (!at_bps && !at_iops) return std::nullopt;
  return Cause{"throttled", "the device is throttled for this job's cgroup",
               fmt("%s of cgroup %s limits reads on %s to %s; the job reads %s", l.file.c_str(),
                   l.cgroup.c_str(), f.dev->device.name.c_str(),
                   at_bps ? format_rate(static_cast<double>(l.bytes_per_s)).c_str()
                          : fmt("%llu IOPS", static_cast<unsigned long long>(l.iops)).c_str(),
                   format_rate(f.job).c_str()),
               "raise or remove the limit (" + l.file + "), or run the job in a cgroup without it",
               f.gain_to(f.best)};
}

// An outside limit: other processes' I/O on the same device.
std::optional<Cause> shared_device(const Facts& f) {
  double total = f.dev->read_bytes_s + f.dev->write_bytes_s;
  double others = std::max(0.0, total - f.job - f.ob.job.write_bytes_s);
  bool busy = f.dev->utilisation >= 0.7 || (f.best > 0 && total >= 0.6 * f.best);
  if (total <= 0 || others < 0.3 * total || !busy) return std::nullopt;
  return Cause{"shared-device", "another process's I/O shares the device",
               fmt("%s moved %s (%.0f%% busy, %.1f requests in flight); this job read %s of it, "
                   "others %s (%.0f%%)",
                   f.dev->device.name.c_str(), format_rate(total).c_str(), 100 * f.dev->utilisation,
                   f.dev->in_flight, format_rate(f.job).c_str(), format_rate(others).c_str(),
                   100 * others / total),
               "move the other I/O to another device or time, or give this job a larger share "
               "(io.weight / blkio.weight, or a throttle on the neighbour)",
               f.gain_to(f.best > 0 ? f.best : total)};
}

// A thread that computes instead of waiting for I/O.
std::optional<Cause> cpu_bound(const Facts& f) {
  const ThreadActivity* top = f.top;
  if (!top || top->cpu < 0.85 || top->user < 0.5 * top->cpu) return std::nullopt;
  return Cause{"cpu-bound", "one thread is saturated by its own computation",
               fmt("thread %d (%s) used %.0f%% of a core, %.0f%% of it in user code, while the "
                   "job read %s",
                   top->tid, top->name.c_str(), 100 * top->cpu, 100 * top->user / top->cpu,
                   format_rate(f.job).c_str()),
               "move the work between reads off the reading thread (more reader threads, or "
               "prefetch on another thread), or make it cheaper",
               f.gain_to(f.best)};
}

std::optional<Cause> no_direct(const Facts& f) {
  if (!f.no_direct) return std::nullopt;
  return Cause{
      "no-direct", "the file system does not take O_DIRECT: every read goes through the page cache",
      fmt("%s refuses O_DIRECT; the job reads %s from storage in %s requests",
          f.files.front()->fs_type.c_str(), format_rate(f.job).c_str(), format_bytes(f.R).c_str()),
      "use large reads and more readahead (posix_fadvise SEQUENTIAL, read_ahead_kb), or "
      "keep hot data on a file system that takes O_DIRECT",
      std::max(1.2, f.gain_to(f.best_of("buffered")))};
}

std::optional<Cause> buffered(const Facts& f) {
  // Where O_DIRECT is refused, no-direct says it; reads the page cache serves are not this.
  if (f.no_direct || f.job < 0.1 * f.ob.job.rchar_s) return std::nullopt;
  const double buffered_best = f.best_of("buffered");
  return Cause{
      "buffered", "buffered reads from a cold page cache",
      fmt("the job's files are open without O_DIRECT; the device sees %s requests "
          "(read_ahead_kb %llu) with %.1f in flight%s%s",
          format_bytes(f.R).c_str(), static_cast<unsigned long long>(f.dev->device.read_ahead_kb),
          f.Q,
          buffered_best > 0
              ? ("; buffered reads top out at " + format_rate(buffered_best) + " here").c_str()
              : "",
          f.best > 0 ? ("; O_DIRECT reaches " + format_rate(f.best)).c_str() : ""),
      "read with O_DIRECT and large requests in flight (sluice's data path does), or at least "
      "posix_fadvise(SEQUENTIAL) and a larger read_ahead_kb",
      f.gain_to(f.best)};
}

std::optional<Cause> page_cache_thrash(const Facts& f) {
  const double used = f.ob.job.rchar_s;
  if (used <= 0 || f.job <= 1.3 * used) return std::nullopt;
  return Cause{"page-cache-thrash", "the page cache throws away what it read ahead",
               fmt("the job fetched %s from storage but read only %s: %.1f bytes fetched per "
                   "byte used",
                   format_rate(f.job).c_str(), format_rate(used).c_str(), f.job / used),
               "lower read_ahead_kb or use posix_fadvise(RANDOM) for random reads, give the job "
               "more memory, or read with O_DIRECT",
               f.job / used};
}

std::optional<Cause> fragmented(const Facts& f) {
  if (!f.fragmented()) return std::nullopt;
  const OpenFile& file = *f.frag;
  double avg_extent = static_cast<double>(file.size) / static_cast<double>(file.extents);
  return Cause{
      "fragmented", "the file is fragmented: each read is cut at extent boundaries",
      fmt("%s has %lld extents (%s on average over %s); the device sees %s requests%s",
          file.path.c_str(), static_cast<long long>(file.extents), format_bytes(avg_extent).c_str(),
          format_bytes(static_cast<double>(file.size)).c_str(), format_bytes(f.R).c_str(),
          f.S > 0 ? fmt(" for %s read calls", format_bytes(f.S).c_str()).c_str() : ""),
      "rewrite the file in one go (cp to a new file, or e4defrag / xfs_fsr), and preallocate "
      "(fallocate) files written piece by piece",
      std::max(1.5, f.gain_to(f.at(f.S > 0 ? static_cast<uint64_t>(f.S) : 1 << 20, f.qd_now)))};
}

std::optional<Cause> split_requests(const Facts& f) {
  if (!f.split || f.fragmented()) return std::nullopt;
  return Cause{"split-requests", "requests are split before they reach the device",
               fmt("the job reads %s per call but the device sees %s requests (max_sectors_kb "
                   "%llu on %s)",
                   format_bytes(f.S).c_str(), format_bytes(f.R).c_str(),
                   static_cast<unsigned long long>(f.dev->device.max_sectors_kb),
                   f.dev->device.disk.c_str()),
               "raise max_sectors_kb on the disk, or read in pieces of at most that size with "
               "more in flight",
               std::max(1.2, f.at(static_cast<uint64_t>(f.S), f.qd_now) /
                                 std::max(1.0, f.at(static_cast<uint64_t>(f.R), f.qd_now)))};
}

std::optional<Cause> unaligned(const Facts& f) {
  if (f.S <= 0 || std::fmod(f.S, 4096) == 0 || f.direct) return std::nullopt;
  return Cause{"unaligned", "reads are not aligned to 4 KiB",
               fmt("the job's read calls average %.0f bytes, not a multiple of 4 KiB", f.S),
               "read in multiples of 4 KiB at 4 KiB-aligned offsets", 1.2};
}

std::optional<Cause> queue_depth(const Facts& f) {
  if (f.Q >= 2 || f.R <= 0) return std::nullopt;
  double more = f.at(static_cast<uint64_t>(f.R));
  if (more != 0 && more < 1.5 * f.job) return std::nullopt;
  return Cause{"queue-depth", "too little parallelism: one request at a time",
               fmt("average request %s and %.1f requests in flight, %.2f ms each: the reader "
                   "waits for every read before it issues the next",
                   format_bytes(f.R).c_str(), f.Q, f.dev->read_await_ms),
               more > 0 ? fmt("keep more reads in flight (io_uring or more threads): %s "
                              "requests reach %s here",
                              format_bytes(f.R).c_str(), format_rate(more).c_str())
                        : "keep more reads in flight (io_uring, or more reader threads)",
               f.gain_to(more)};
}

std::optional<Cause> request_size(const Facts& f) {
  if (f.R <= 0 || f.R >= 128 * kKiB || f.frag || f.split) return std::nullopt;
  double big = f.at(1 << 20, f.qd_now), now = f.at(static_cast<uint64_t>(f.R), f.qd_now);
  if (big != 0 && big < 1.5 * now) return std::nullopt;
  return Cause{"request-size", "requests are too small",
               fmt("average request %s; at %.0f in flight the sweep reaches %s with 1 MiB "
                   "requests against %s with %s",
                   format_bytes(f.R).c_str(), std::max(1.0, f.Q), format_rate(big).c_str(),
                   format_rate(now).c_str(), format_bytes(f.R).c_str()),
               "read in larger pieces (1 MiB or more), or batch small samples into shards",
               f.gain_to(big)};
}

// Where a rule looks.
enum class Scope {
  kJob,            // always: the job's threads
  kDevice,         // the job's device was found
  kBufferedReads,  // the device, no outside limit, the job's files read through the page cache
  kDirectReads,    // the device, no outside limit, otherwise
};

struct Rule {
  // The rank of what it finds: 0-1 an outside limit (while one holds, the job's own request
  // pattern cannot be judged), 2 the job's own threads, 3 its request pattern (ranked by
  // the gain fixing it would bring, shown only from a 15% gain).
  int rank;
  Scope scope;
  std::optional<Cause> (*find)(const Facts&);
};

// Every rule, in the order of the report's ties (docs/doctor.md explains each).
constexpr Rule kRules[] = {
    {0, Scope::kDevice, throttled},
    {1, Scope::kDevice, shared_device},
    {2, Scope::kJob, cpu_bound},
    {3, Scope::kBufferedReads, no_direct},
    {3, Scope::kBufferedReads, buffered},
    {3, Scope::kBufferedReads, page_cache_thrash},
    {3, Scope::kDirectReads, fragmented},
    {3, Scope::kDirectReads, split_requests},
    {3, Scope::kDirectReads, unaligned},
    {3, Scope::kDirectReads, queue_depth},
    {3, Scope::kDirectReads, request_size},
};

}  // namespace

Diagnosis diagnose(const Observation& ob, const std::optional<Ceiling>& ceiling) {
  Diagnosis d;
  const Facts f = gather(ob, ceiling);
  d.job_bytes_s = f.job;
  d.ceiling_bytes_s = f.best;
  const JobActivity& job = ob.job;

  // Two verdicts come before any rule: nothing was read, or nothing is left to gain.
  if (f.job < 64 * kKiB && job.rchar_s < 64 * kKiB) {
    d.causes.push_back(
        {"idle", "the job read almost nothing while it was watched",
         fmt("%s from storage and %s through read calls over %.1f s", format_rate(f.job).c_str(),
             format_rate(job.rchar_s).c_str(), job.seconds),
         "watch it while it reads (--seconds longer, or at another moment)", 1});
    return d;
  }
  // Reads served by the page cache never reach the device: the job is limited by copies.
  const bool from_cache = f.job < 0.1 * job.rchar_s;
  if (f.best > 0 && (f.job >= 0.75 * f.best || (from_cache && job.rchar_s >= 0.75 * f.best))) {
    const double reads = std::max(f.job, from_cache ? job.rchar_s : 0);
    d.causes.push_back(
        {"healthy", "nothing to fix: the job reads at the storage's ceiling",
         fmt("the job reads %s, %.0f%% of the %s the sweep measured", format_rate(reads).c_str(),
             100 * reads / f.best, format_rate(f.best).c_str()),
         "faster storage, or fewer bytes (compression, caching on a faster tier)", 1});
    return d;
  }

  std::vector<std::pair<int, Cause>> found;
  auto in_scope = [&](Scope scope) {
    if (scope == Scope::kJob) return true;
    if (!f.dev) return false;
    if (scope == Scope::kDevice) return true;
    const bool outside =
        std::any_of(found.begin(), found.end(), [](const auto& x) { return x.first < 2; });
    if (outside) return false;
    const bool buffered_only = f.buffered && !f.direct;
    return buffered_only == (scope == Scope::kBufferedReads);
  };
  for (const Rule& r : kRules)
    if (in_scope(r.scope))
      if (auto c = r.find(f)) found.emplace_back(r.rank, std::move(*c));

  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return a.second.gain > b.second.gain;
  });
  for (auto& [rank, c] : found)
    if (rank < 3 || c.gain >= 1.15) d.causes.push_back(std::move(c));
  if (d.causes.empty()) {
    d.causes.push_back({"healthy", "no cause found",
                        f.best > 0
                            ? fmt("the job reads %s against a ceiling of %s, and no rule matched",
                                  format_rate(f.job).c_str(), format_rate(f.best).c_str())
                            : "no rule matched, and no ceiling was measured to compare with",
                        f.best > 0 ? "measure again under load; the gap may be the job's own pauses"
                                   : "run without --no-sweep, or give --ceiling",
                        1});
  }
  return d;
}

std::string ceiling_text(const Ceiling& c) {
  std::string out =
      "ceiling of " + printable(c.target) + (c.device.empty() ? "" : " (" + c.device + ")") + "\n";
  std::map<uint64_t, std::map<unsigned, double>> grid;
  std::vector<unsigned> qds;
  for (const auto& p : c.points) {
    if (p.engine != "uring") continue;
    grid[p.bs][p.qd] = p.bytes_s;
    if (std::find(qds.begin(), qds.end(), p.qd) == qds.end()) qds.push_back(p.qd);
  }
  std::sort(qds.begin(), qds.end());
  if (!grid.empty()) {
    out += "  O_DIRECT, io_uring    ";
    for (unsigned q : qds) out += fmt("%12s", fmt("QD%u", q).c_str());
    out += "\n";
    for (const auto& [bs, row] : grid) {
      out += fmt("  %-21s ", format_bytes(static_cast<double>(bs)).c_str());
      for (unsigned q : qds) {
        auto it = row.find(q);
        out += fmt("%12s", it == row.end() ? "-" : format_rate(it->second).c_str());
      }
      out += "\n";
    }
  }
  for (const auto& p : c.points)
    if (p.engine != "uring")
      out += fmt("  %-8s %-12s QD%-4u %s\n", p.engine.c_str(),
                 format_bytes(static_cast<double>(p.bs)).c_str(), p.qd,
                 format_rate(p.bytes_s).c_str());
  if (!c.direct) out += "  O_DIRECT: not available here (" + printable(c.direct_why) + ")\n";
  auto best = c.best();
  if (!best) return out + "  nothing was measured\n";
  out += fmt("  => reaches %s at %s x QD%u with %s", format_rate(best->bytes_s).c_str(),
             format_bytes(static_cast<double>(best->bs)).c_str(), best->qd,
             best->engine == "uring"    ? "O_DIRECT (io_uring)"
             : best->engine == "direct" ? "O_DIRECT (threads)"
                                        : "the page cache");
  if (auto k = c.knee(); k && k->qd > 1)
    out += fmt("; below QD%u it is latency-bound (QD%u: %s)", k->qd, 1u,
               format_rate(c.best_at(k->bs, 1) ? c.best_at(k->bs, 1)->bytes_s : 0).c_str());
  if (auto b = c.best("buffered"))
    out += fmt("; buffered reads from a cold cache top out at %s", format_rate(b->bytes_s).c_str());
  return out + "\n";
}

std::string report_text(const Observation& ob, const std::optional<Ceiling>& ceiling,
                        const Diagnosis& d) {
  const auto& j = ob.job;
  std::string out = fmt("sluice doctor: process %d (%s), watched %.1f s\n", ob.pid,
                        printable(ob.command).c_str(), j.seconds);
  out +=
      fmt("  job        reads %s from storage, %s through %.0f read calls/s (%s each); "
          "writes %s; CPU %.2f cores\n",
          format_rate(j.read_bytes_s).c_str(), format_rate(j.rchar_s).c_str(), j.read_calls_s,
          format_bytes(j.avg_call_bytes).c_str(), format_rate(j.write_bytes_s).c_str(), j.cpu);
  for (size_t i = 0; i < std::min<size_t>(3, j.threads.size()); ++i) {
    const auto& t = j.threads[i];
    out += fmt("  thread     %d %-15s %5.1f%% of a core (user %.1f%%, sys %.1f%%)\n", t.tid,
               printable(t.name).c_str(), 100 * t.cpu, 100 * t.user, 100 * t.sys);
  }
  if (ob.device) {
    const auto& v = *ob.device;
    out +=
        fmt("  device     %s (disk %s, %s): reads %s, %.0f IOPS, %s per request, %.1f in "
            "flight, await %.2f ms, %.0f%% busy, %.0f%% merged; writes %s\n",
            v.device.name.c_str(), v.device.disk.c_str(),
            v.device.scheduler.empty() ? "-" : v.device.scheduler.c_str(),
            format_rate(v.read_bytes_s).c_str(), v.read_iops,
            format_bytes(v.avg_read_bytes).c_str(), v.in_flight, v.read_await_ms,
            100 * v.utilisation, 100 * v.read_merged, format_rate(v.write_bytes_s).c_str());
  }
  for (size_t i = 0; i < std::min<size_t>(5, ob.files.size()); ++i) {
    const auto& f = ob.files[i];
    out +=
        fmt("  file       fd %d %s (%s%s%s)\n", f.fd, printable(f.path).c_str(),
            f.block_device ? "block device" : format_bytes(static_cast<double>(f.size)).c_str(),
            f.direct ? ", O_DIRECT" : ", buffered",
            f.extents >= 0 ? fmt(", %lld extents", static_cast<long long>(f.extents)).c_str() : "");
  }
  if (ob.files.size() > 5) out += fmt("  file       ... and %zu more\n", ob.files.size() - 5);
  if (ob.limit)
    out += fmt("  limit      %s in cgroup %s: %s\n", ob.limit->file.c_str(),
               printable(ob.limit->cgroup).c_str(),
               ob.limit->bytes_per_s
                   ? format_rate(static_cast<double>(ob.limit->bytes_per_s)).c_str()
                   : fmt("%llu IOPS", static_cast<unsigned long long>(ob.limit->iops)).c_str());
  {
    std::string libs;
    for (const auto& l : ob.gpu_libraries) libs += (libs.empty() ? "" : ", ") + l;
    out += "  gpu        " +
           (libs.empty() ? std::string("no CUDA or cuFile library loaded: host memory only")
                         : libs + " loaded" +
                               (libs.find("libcufile") == std::string::npos
                                    ? " (no cuFile: device reads go through host staging)"
                                    : "")) +
           "\n";
  }
  for (const auto& n : ob.notes) out += "  note       " + printable(n) + "\n";
  if (ceiling) {
    out += "\n" + ceiling_text(*ceiling);
  } else {
    out += "\n  no ceiling was measured: gains are guesses\n";
  }
  return out + causes_text(d.causes);
}

std::string causes_text(const std::vector<Cause>& causes) {
  std::string out = "\ncauses, most likely first:\n";
  int i = 0;
  for (const auto& c : causes) {
    out += fmt("  %d. [%s] %s", ++i, c.id.c_str(), c.title.c_str());
    if (c.gain > 1.05) out += fmt(" (up to %.1fx faster if fixed)", c.gain);
    out += "\n     evidence: " + printable(c.evidence) + "\n     change:   " + c.advice + "\n";
  }
  return out;
}

std::string causes_json(const std::vector<Cause>& causes) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : causes)
    out.push_back({{"id", c.id},
                   {"title", c.title},
                   {"evidence", c.evidence},
                   {"advice", c.advice},
                   {"gain", c.gain}});
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string report_json(const Observation& ob, const std::optional<Ceiling>& ceiling,
                        const Diagnosis& d) {
  nlohmann::json threads = nlohmann::json::array();
  for (const auto& t : ob.job.threads)
    threads.push_back(
        {{"tid", t.tid}, {"name", t.name}, {"cpu", t.cpu}, {"user", t.user}, {"sys", t.sys}});
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : ob.files)
    files.push_back({{"fd", f.fd},
                     {"path", f.path},
                     {"block_device", f.block_device},
                     {"size", f.size},
                     {"direct", f.direct},
                     {"direct_ok", f.direct_ok},
                     {"fs_type", f.fs_type},
                     {"extents", f.extents}});
  nlohmann::json j = {{"pid", ob.pid},
                      {"command", ob.command},
                      {"job",
                       {{"seconds", ob.job.seconds},
                        {"read_bytes_s", ob.job.read_bytes_s},
                        {"rchar_s", ob.job.rchar_s},
                        {"read_calls_s", ob.job.read_calls_s},
                        {"avg_call_bytes", ob.job.avg_call_bytes},
                        {"write_bytes_s", ob.job.write_bytes_s},
                        {"cpu", ob.job.cpu},
                        {"threads", threads}}},
                      {"files", files},
                      {"notes", ob.notes},
                      {"gpu_libraries", ob.gpu_libraries},
                      {"ceiling_bytes_s", d.ceiling_bytes_s}};
  if (ob.device) {
    const auto& v = *ob.device;
    j["device"] = {{"name", v.device.name},
                   {"disk", v.device.disk},
                   {"major", v.device.major},
                   {"minor", v.device.minor},
                   {"max_sectors_kb", v.device.max_sectors_kb},
                   {"read_ahead_kb", v.device.read_ahead_kb},
                   {"scheduler", v.device.scheduler},
                   {"read_bytes_s", v.read_bytes_s},
                   {"read_iops", v.read_iops},
                   {"avg_read_bytes", v.avg_read_bytes},
                   {"read_await_ms", v.read_await_ms},
                   {"write_bytes_s", v.write_bytes_s},
                   {"in_flight", v.in_flight},
                   {"utilisation", v.utilisation},
                   {"read_merged", v.read_merged}};
  }
  if (ob.limit)
    j["limit"] = {{"cgroup", ob.limit->cgroup},
                  {"file", ob.limit->file},
                  {"bytes_per_s", ob.limit->bytes_per_s},
                  {"iops", ob.limit->iops}};
  if (ceiling) j["ceiling"] = nlohmann::json::parse(ceiling->json());
  j["causes"] = nlohmann::json::parse(causes_json(d.causes));
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sluice::doctor
