// Reading a job's storage behaviour from /proc and /sys: parsers kept apart from the file
// reading so they are tested on fixture text, and every read of the job's state tolerant of
// the job going away.
#include "sluice/doctor/observe.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "sluice/core/fd.h"

namespace sluice::doctor {

namespace fs = std::filesystem;

namespace {

std::vector<std::string_view> fields(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\n') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::optional<uint64_t> to_u64(std::string_view s, int base = 10) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// The whole of a small /proc or /sys file; kNotFound when it is gone (the job exited).
Result<std::string> slurp(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return fail_errno(errno, "open " + path);
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read " + path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (1 << 20)) return fail(Code::kInvalidArgument, path + " is over 1 MiB");
  }
  return text;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

uint64_t read_u64_or(const std::string& path, uint64_t fallback) {
  auto t = slurp(path);
  if (!t) return fallback;
  return to_u64(trim(*t)).value_or(fallback);
}

std::string fs_type_name(int64_t magic) {
  switch (magic) {
    case EXT4_SUPER_MAGIC:
      return "ext4";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case TMPFS_MAGIC:
      return "tmpfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlay";
    case 0x65735546:
      return "fuse";
    case 0x2fc12fc1:
      return "zfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(magic));
      return buf;
    }
  }
}

std::string dev_name(unsigned major, unsigned minor) {
  return std::to_string(major) + ":" + std::to_string(minor);
}

}  // namespace

Result<DiskCounters> parse_disk_stat(std::string_view text) {
  auto f = fields(text);
  if (f.size() < 11)
    return fail(Code::kCorruption,
                "block device stat has " + std::to_string(f.size()) + " fields, not 11 or more");
  uint64_t v[11];
  for (size_t i = 0; i < 11; ++i) {
    auto x = to_u64(f[i]);
    if (!x) return fail(Code::kCorruption, "block device stat field '" + std::string(f[i]) + "'");
    v[i] = *x;
  }
  return DiskCounters{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
}

Result<ProcIo> parse_proc_io(std::string_view text) {
  ProcIo io;
  int seen = 0;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    auto f = fields(std::string_view(line).substr(colon + 1));
    if (f.size() != 1) continue;
    auto v = to_u64(f[0]);
    if (!v) return fail(Code::kCorruption, "/proc io line '" + line + "'");
    uint64_t* slot = key == "rchar"         ? &io.rchar
                     : key == "wchar"       ? &io.wchar
                     : key == "syscr"       ? &io.syscr
                     : key == "syscw"       ? &io.syscw
                     : key == "read_bytes"  ? &io.read_bytes
                     : key == "write_bytes" ? &io.write_bytes
                                            : nullptr;
    if (slot) {
      *slot = *v;
      ++seen;
    }
  }
  if (seen < 6)
    return fail(Code::kCorruption, "/proc io has " + std::to_string(seen) + " of 6 counters");
  return io;
}

Result<ThreadTicks> parse_task_stat(std::string_view text) {
  // "TID (comm) S ppid ...": comm may hold spaces and parentheses, so it ends at the last ')'.
  auto open = text.find('('), close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return fail(Code::kCorruption, "task stat without (comm)");
  ThreadTicks t;
  auto head = fields(text.substr(0, open));
  auto tid = to_u64(head.empty() ? "" : head[0]);
  if (!tid) return fail(Code::kCorruption, "task stat without a thread id");
  t.tid = static_cast<int>(*tid);
  t.name = std::string(text.substr(open + 1, close - open - 1));
  auto f = fields(text.substr(close + 1));
  // After the comm: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
  // cmajflt utime(14) stime(15).
  if (f.size() < 13) return fail(Code::kCorruption, "task stat has too few fields");
  t.state = f[0].empty() ? '?' : f[0][0];
  auto u = to_u64(f[11]), s = to_u64(f[12]);
  if (!u || !s) return fail(Code::kCorruption, "task stat CPU fields");
  t.user = *u;
  t.sys = *s;
  return t;
}

Result<BlockDevice> block_device(dev_t dev, const ObserveOptions& o) {
  BlockDevice b;
  b.major = ::major(dev);
  b.minor = ::minor(dev);
  if (b.major == 0)
    return fail(Code::kNotFound, "device " + dev_name(b.major, b.minor) +
                                     " is not a block device (tmpfs, overlay or a network file "
                                     "system)");
  std::error_code ec;
  fs::path link = fs::path(o.sys_root) / "dev/block" / dev_name(b.major, b.minor);
  fs::path real = fs::canonical(link, ec);
  if (ec)
    return fail(Code::kNotFound, "no block device " + dev_name(b.major, b.minor) + " in " +
                                     o.sys_root + ": " + ec.message());
  b.name = real.filename().string();
  fs::path disk = fs::exists(real / "partition") ? real.parent_path() : real;
  b.disk = disk.filename().string();
  fs::path q = disk / "queue";
  b.max_sectors_kb = read_u64_or(q / "max_sectors_kb", 0);
  b.read_ahead_kb = read_u64_or(q / "read_ahead_kb", 0);
  b.logical_block = read_u64_or(q / "logical_block_size", 512);
  b.rotational = read_u64_or(q / "rotational", 0) != 0;
  if (auto s = slurp(q / "scheduler")) {
    auto a = s->find('['), z = s->find(']');
    b.scheduler = a != std::string::npos && z > a ? s->substr(a + 1, z - a - 1) : trim(*s);
  }
  return b;
}

Result<int64_t> extent_count(int fd) {
  struct fiemap fm {};
  fm.fm_start = 0;
  fm.fm_length = FIEMAP_MAX_OFFSET;
  fm.fm_flags = 0;         // no FIEMAP_FLAG_SYNC: that would write back the job's dirty pages
  fm.fm_extent_count = 0;  // count only
  if (::ioctl(fd, FS_IOC_FIEMAP, &fm) != 0) {
    if (errno == EOPNOTSUPP || errno == ENOTTY)
      return fail(Code::kUnsupported, "the file system has no FIEMAP");
    return fail_errno(errno, "FIEMAP");
  }
  return static_cast<int64_t>(fm.fm_mapped_extents);
}

Result<std::vector<OpenFile>> open_files(pid_t pid, const ObserveOptions& o) {
  const std::string base = o.proc_root + "/" + std::to_string(pid);
  std::error_code ec;
  fs::directory_iterator it(base + "/fd", ec);
  if (ec) return fail_errno(ec.value(), "list open files of process " + std::to_string(pid));
  std::vector<OpenFile> out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    auto n = to_u64(it->path().filename().string());
    if (!n) continue;
    OpenFile f;
    f.fd = static_cast<int>(*n);
    const std::string fdpath = it->path().string();
    f.path = fs::read_symlink(fdpath, ec).string();
    if (ec) continue;  // closed meanwhile
    struct stat sb;
    if (::stat(fdpath.c_str(), &sb) != 0) continue;
    if (S_ISBLK(sb.st_mode)) {
      f.block_device = true;
      f.dev = sb.st_rdev;
    } else if (S_ISREG(sb.st_mode)) {
      f.dev = sb.st_dev;
      f.size = static_cast<uint64_t>(sb.st_size);
    } else {
      continue;
    }
    if (auto info = slurp(base + "/fdinfo/" + std::to_string(f.fd))) {
      std::istringstream in(*info);
      std::string line;
      while (std::getline(in, line)) {
        auto kv = fields(line);
        if (kv.size() != 2) continue;
        if (kv[0] == "flags:") f.direct = (to_u64(kv[1], 8).value_or(0) & O_DIRECT) != 0;
        if (kv[0] == "pos:") f.position = to_u64(kv[1]).value_or(0);
      }
    }
    // Our own read-only descriptor of the same file: statfs and FIEMAP never touch the job's.
    UniqueFd mine(::open(fdpath.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!f.block_device) {
      UniqueFd direct(::open(fdpath.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_DIRECT));
      f.direct_ok = direct.valid() || errno != EINVAL;
    }
    if (mine.valid() && !f.block_device) {
      struct statfs sf;
      if (::fstatfs(mine.get(), &sf) == 0)
        f.fs_type = fs_type_name(static_cast<int64_t>(sf.f_type));
      if (auto e = extent_count(mine.get())) f.extents = *e;
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<ReadLimit> read_limit(pid_t pid, unsigned major, unsigned minor,
                                    const ObserveOptions& o) {
  auto text = slurp(o.proc_root + "/" + std::to_string(pid) + "/cgroup");
  if (!text) return std::nullopt;
  const std::string want = dev_name(major, minor);
  std::optional<ReadLimit> best;
  auto consider = [&](const std::string& cg, const std::string& file, uint64_t bps, uint64_t iops) {
    if (!bps && !iops) return;
    if (!best || (bps && (!best->bytes_per_s || bps < best->bytes_per_s))) {
      best = ReadLimit{cg, file, bps, iops};
    }
  };
  // Limits of every ancestor apply too: walk from the job's cgroup up to the root.
  auto walk = [&](const fs::path& root, std::string cg, auto&& read_dir) {
    for (;;) {
      read_dir(root / fs::path(cg).relative_path(), cg);
      if (cg.empty() || cg == "/") break;
      auto slash = cg.rfind('/');
      cg = slash == 0 || slash == std::string::npos ? "/" : cg.substr(0, slash);
    }
  };
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1), cg = line.substr(b + 1);
    if (controllers.empty()) {  // cgroup v2: io.max "MAJ:MIN rbps=N wbps=max riops=max ..."
      for (const char* mount : {"", "unified"}) {
        walk(fs::path(o.cgroup_root) / mount, cg, [&](const fs::path& dir, const std::string& c) {
          auto t = slurp(dir / "io.max");
          if (!t) return;
          std::istringstream lines(*t);
          std::string l;
          while (std::getline(lines, l)) {
            auto f = fields(l);
            if (f.empty() || f[0] != want) continue;
            uint64_t bps = 0, iops = 0;
            for (auto kv : f) {
              if (kv.starts_with("rbps=")) bps = to_u64(kv.substr(5)).value_or(0);
              if (kv.starts_with("riops=")) iops = to_u64(kv.substr(6)).value_or(0);
            }
            consider(c, "io.max", bps, iops);
          }
        });
      }
    } else if (("," + controllers + ",").find(",blkio,") != std::string::npos) {
      walk(fs::path(o.cgroup_root) / "blkio", cg, [&](const fs::path& dir, const std::string& c) {
        uint64_t bps = 0, iops = 0;
        for (auto [file, slot] : {std::pair{"blkio.throttle.read_bps_device", &bps},
                                  std::pair{"blkio.throttle.read_iops_device", &iops}}) {
          auto t = slurp(dir / file);
          if (!t) continue;
          std::istringstream lines(*t);
          std::string l;
          while (std::getline(lines, l)) {
            auto f = fields(l);
            if (f.size() == 2 && f[0] == want) *slot = to_u64(f[1]).value_or(0);
          }
        }
        consider(c, "blkio.throttle.read_bps_device", bps, iops);
      });
    }
  }
  return best;
}

Result<Snapshot> snapshot(pid_t pid, const std::vector<dev_t>& devices, const ObserveOptions& o) {
  Snapshot s;
  s.t_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  const std::string base = o.proc_root + "/" + std::to_string(pid);
  auto io_text = slurp(base + "/io");
  if (!io_text) {
    if (io_text.error().code() == Code::kNotFound)
      return fail(Code::kNotFound, "process " + std::to_string(pid) + " is gone");
    return std::unexpected(
        io_text.error().with_context("I/O counters of process " + std::to_string(pid)));
  }
  SLUICE_ASSIGN_OR_RETURN(s.io, parse_proc_io(*io_text));
  std::error_code ec;
  for (fs::directory_iterator it(base + "/task", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    auto t = slurp(it->path().string() + "/stat");
    if (!t) continue;  // the thread ended
    if (auto tt = parse_task_stat(*t)) s.threads.push_back(std::move(*tt));
  }
  for (dev_t d : devices) {
    auto t = slurp(o.sys_root + "/dev/block/" + dev_name(::major(d), ::minor(d)) + "/stat");
    if (!t) continue;
    if (auto c = parse_disk_stat(*t)) s.disks[d] = *c;
  }
  return s;
}

DeviceActivity device_activity(const BlockDevice& dev, const DiskCounters& a, const DiskCounters& b,
                               double seconds) {
  DeviceActivity d;
  d.device = dev;
  if (seconds <= 0) return d;
  auto delta = [](uint64_t x, uint64_t y) { return y >= x ? static_cast<double>(y - x) : 0.0; };
  double reads = delta(a.reads, b.reads), merges = delta(a.read_merges, b.read_merges);
  double bytes = delta(a.read_sectors, b.read_sectors) * 512;
  d.read_bytes_s = bytes / seconds;
  d.read_iops = reads / seconds;
  d.avg_read_bytes = reads > 0 ? bytes / reads : 0;
  d.read_await_ms = reads > 0 ? delta(a.read_ms, b.read_ms) / reads : 0;
  d.write_bytes_s = delta(a.write_sectors, b.write_sectors) * 512 / seconds;
  d.in_flight = delta(a.queue_ms, b.queue_ms) / (seconds * 1000);
  d.utilisation = std::min(1.0, delta(a.io_ms, b.io_ms) / (seconds * 1000));
  d.read_merged = reads + merges > 0 ? merges / (reads + merges) : 0;
  return d;
}

JobActivity job_activity(const Snapshot& a, const Snapshot& b, long ticks_per_second) {
  JobActivity j;
  j.seconds = static_cast<double>(b.t_ns - a.t_ns) / 1e9;
  if (j.seconds <= 0) return j;
  auto delta = [](uint64_t x, uint64_t y) { return y >= x ? static_cast<double>(y - x) : 0.0; };
  j.read_bytes_s = delta(a.io.read_bytes, b.io.read_bytes) / j.seconds;
  j.rchar_s = delta(a.io.rchar, b.io.rchar) / j.seconds;
  double calls = delta(a.io.syscr, b.io.syscr);
  j.read_calls_s = calls / j.seconds;
  j.avg_call_bytes = calls > 0 ? delta(a.io.rchar, b.io.rchar) / calls : 0;
  j.write_bytes_s = delta(a.io.write_bytes, b.io.write_bytes) / j.seconds;
  const double hz = static_cast<double>(ticks_per_second > 0 ? ticks_per_second : 100);
  for (const auto& t : b.threads) {
    ThreadTicks before{t.tid, t.name, t.state, 0, 0};
    for (const auto& u : a.threads)
      if (u.tid == t.tid) before = u;
    ThreadActivity ta{t.tid, t.name, 0, delta(before.user, t.user) / hz / j.seconds,
                      delta(before.sys, t.sys) / hz / j.seconds};
    ta.cpu = ta.user + ta.sys;
    j.cpu += ta.cpu;
    j.threads.push_back(std::move(ta));
  }
  std::sort(j.threads.begin(), j.threads.end(),
            [](const ThreadActivity& x, const ThreadActivity& y) { return x.cpu > y.cpu; });
  return j;
}

namespace {

// The processes whose parent is `pid` (from each /proc/N/stat: the kernel here has no
// task/T/children).
std::vector<pid_t> children_of(pid_t pid, const ObserveOptions& o) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(o.proc_root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    auto stat = slurp(it->path().string() + "/stat");
    if (!stat) continue;
    const size_t close = stat->rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(stat->c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == pid)
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<Observation> observe(pid_t pid, double seconds, const ObserveOptions& o) {
  Observation ob;
  ob.pid = pid;
  const std::string base = o.proc_root + "/" + std::to_string(pid);
  auto comm = slurp(base + "/comm");
  if (!comm) {
    if (comm.error().code() == Code::kNotFound)
      return fail(Code::kNotFound, "no process " + std::to_string(pid));
    return std::unexpected(comm.error());
  }
  ob.command = trim(*comm);

  // Every block device is sampled (the job may open files on any of them meanwhile); the
  // one it used is picked afterwards.
  std::vector<dev_t> all;
  std::error_code ec;
  for (fs::directory_iterator it(o.sys_root + "/dev/block", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    unsigned ma = 0, mi = 0;
    if (std::sscanf(it->path().filename().c_str(), "%u:%u", &ma, &mi) == 2)
      all.push_back(makedev(ma, mi));
  }
  SLUICE_ASSIGN_OR_RETURN(Snapshot a, snapshot(pid, all, o));
  // Descriptors are listed several times over the window, so a job that opens and closes
  // files per read is still seen; each listing is followed by a snapshot, so a job that
  // exits during the watch is reported up to its last one.
  std::map<std::string, OpenFile> files;
  std::optional<Snapshot> last;
  bool exited = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    if (auto fl = open_files(pid, o))
      for (auto& f : *fl) files.insert_or_assign(f.path, std::move(f));
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::clamp<int64_t>(static_cast<int64_t>(seconds * 1000 / 8), 10, 500)));
    auto s = snapshot(pid, all, o);
    // Gone, or a zombie its parent has not reaped yet (its /proc entry stays): exited.
    const bool zombie = s && !s->threads.empty() &&
                        std::all_of(s->threads.begin(), s->threads.end(), [](const ThreadTicks& t) {
                          return t.state == 'Z' || t.state == 'X';
                        });
    if ((!s && s.error().code() == Code::kNotFound) || zombie) {
      exited = true;
      break;
    }
    if (!s) return std::unexpected(s.error());
    last = std::move(*s);
  } while (std::chrono::steady_clock::now() < until);
  if (!last)
    return fail(Code::kNotFound, "process " + std::to_string(pid) + " (" + ob.command +
                                     ") exited before anything could be measured");
  const Snapshot& b = *last;
  if (exited) {
    char note[160];
    std::snprintf(note, sizeof note,
                  "the process exited during the watch: the figures cover the %.1f s before it "
                  "did (%.1f s were asked for)",
                  static_cast<double>(b.t_ns - a.t_ns) / 1e9, seconds);
    ob.notes.push_back(note);
  }
  for (auto& [p, f] : files) ob.files.push_back(std::move(f));
  ob.job = job_activity(a, b, ::sysconf(_SC_CLK_TCK));

  std::set<dev_t> used;
  for (const auto& f : ob.files) used.insert(f.dev);
  double most = -1;
  const double dt = static_cast<double>(b.t_ns - a.t_ns) / 1e9;
  for (dev_t d : used) {
    auto bd = block_device(d, o);
    if (!bd) {
      ob.notes.push_back(bd.error().message());
      continue;
    }
    auto ia = a.disks.find(d);
    auto ib = b.disks.find(d);
    if (ia == a.disks.end() || ib == b.disks.end()) continue;
    DeviceActivity act = device_activity(*bd, ia->second, ib->second, dt);
    if (act.read_bytes_s > most) {
      most = act.read_bytes_s;
      ob.device = act;
    }
  }
  if (ob.files.empty()) ob.notes.push_back("the process had no regular file or block device open");
  // A launcher (torchrun, a shell, srun) reads nothing itself: its workers do.
  if (ob.job.read_bytes_s < 1024 * 1024 && ob.job.rchar_s < 1024 * 1024) {
    if (std::vector<pid_t> kids = children_of(pid, o); !kids.empty()) {
      std::string list;
      for (size_t i = 0; i < kids.size() && i < 8; ++i)
        list += (i ? ", " : "") + std::to_string(kids[i]);
      if (kids.size() > 8) list += ", ...";
      ob.notes.push_back("process " + std::to_string(pid) + " read almost nothing itself but has " +
                         std::to_string(kids.size()) + " child process(es) (" + list +
                         "): the I/O is likely in them; watch the one that reads instead");
    }
  }
  // Whether the job's path can use pinned staging or GPUDirect Storage at all: the CUDA
  // runtime and cuFile mapped in its address space.
  if (auto maps = slurp(base + "/maps")) {
    std::set<std::string> seen;
    std::istringstream in(*maps);
    std::string line;
    while (std::getline(in, line)) {
      auto slash = line.rfind('/');
      if (slash == std::string::npos) continue;
      std::string lib = line.substr(slash + 1);
      if (lib.starts_with("libcudart") || lib.starts_with("libcufile") ||
          lib.starts_with("libcuda.so"))
        seen.insert(lib);
    }
    ob.gpu_libraries.assign(seen.begin(), seen.end());
  }
  if (ob.device) ob.limit = read_limit(pid, ob.device->device.major, ob.device->device.minor, o);
  return ob;
}

}  // namespace sluice::doctor
