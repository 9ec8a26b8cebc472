#include "cp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <semaphore>
#include <thread>

#include <nlohmann/json.hpp>

#include "sizes.h"
#include "sluice/store/store.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cli {
namespace fs = std::filesystem;

std::string CpSummary::text() const {
  double mib_s = seconds > 0 ? static_cast<double>(bytes) / seconds / (1 << 20) : 0;
  char buf[512];
  std::snprintf(buf, sizeof buf, "copied %lu object%s, %s in %.2f s (%.1f MiB/s), %lu retr%s%s",
                static_cast<unsigned long>(objects), objects == 1 ? "" : "s",
                format_size(static_cast<double>(bytes)).c_str(), seconds, mib_s,
                static_cast<unsigned long>(retries), retries == 1 ? "y" : "ies",
                failed ? (", " + std::to_string(failed) + " FAILED").c_str() : "");
  return buf;
}

std::string CpSummary::json() const {
  nlohmann::json j = {
      {"objects", objects},
      {"bytes", bytes},
      {"seconds", seconds},
      {"throughput_mib_s", seconds > 0 ? static_cast<double>(bytes) / seconds / (1 << 20) : 0},
      {"retries", retries},
      {"failed", failed}};
  if (failed) j["error"] = first_error;
  return j.dump();
}

namespace {

struct Task {
  std::string src_key;  // key in the source store (s3) or path (local)
  std::string dst;      // destination path (local) or key (s3)
  uint64_t size = 0;
  std::string etag;  // known from a listing: saves a HEAD
  bool known = false;
};

struct Progress {
  std::atomic<uint64_t> bytes{0}, objects{0};
  uint64_t total_bytes = 0, total_objects = 0;
};

// Downloads one object into a temporary file beside `path`, then renames it into place:
// a failure leaves nothing at `path`.
// Extra part workers (each with a part-sized buffer) across all downloads at once, so a
// recursive copy of many large objects does not hold jobs x part_concurrency buffers.
using WorkerBudget = std::counting_semaphore<1024>;

Status download(store::Store& s3, Task& t, Progress& prog, const s3::S3Options& opt, bool fsync,
                WorkerBudget& budget) {
  if (!t.known) {
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, s3.stat(t.src_key));
    t.size = info.size;
    t.etag = info.etag;
  }
  fs::path dst(t.dst);
  std::error_code ec;
  if (dst.has_parent_path()) fs::create_directories(dst.parent_path(), ec);
  static std::atomic<uint64_t> n{0};
  std::string tmp = (dst.has_parent_path() ? dst.parent_path().string() + "/" : std::string()) +
                    "." + dst.filename().string() + ".sluice-" + std::to_string(::getpid()) + "-" +
                    std::to_string(n.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail_errno(errno, "create " + tmp);
  auto cleanup = [&](Error e) -> Status {
    ::close(fd);
    ::unlink(tmp.c_str());
    return std::unexpected(std::move(e));
  };
  if (t.size > 0) {
    // Reserve the blocks first: a full disk is a clear NoSpace before any byte moves.
    if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(t.size)); rc != 0)
      return cleanup(
          error_from_errno(rc, "reserve " + std::to_string(t.size) + " bytes for " + tmp));
    // Parts are fetched in parallel into reused buffers and written at their offsets;
    // every ranged GET is pinned to the ETag seen in the listing or the HEAD.
    const uint64_t part = std::max<uint64_t>(opt.part_size, 1);
    const uint64_t parts = (t.size + part - 1) / part;
    std::atomic<uint64_t> next{0};
    std::mutex err_mu;
    std::optional<Error> err;
    auto worker = [&](bool first_only) {
      std::unique_ptr<std::byte[]> buf(new std::byte[std::min(part, t.size)]);
      while (true) {
        if (first_only && next.load() > 0) return;
        {
          std::lock_guard lock(err_mu);
          if (err) return;
        }
        uint64_t i = next.fetch_add(1);
        if (i >= parts) return;
        uint64_t off = i * part, len = std::min(part, t.size - off);
        auto r = s3.read_full(t.src_key, off, std::span(buf.get(), len),
                              store::ReadOptions{t.etag, t.size});
        Status st = ok();
        if (!r)
          st = std::unexpected(r.error());
        else if (*r != len)
          st = fail(Code::kUnavailable, "object " + t.src_key + " ended at " +
                                            std::to_string(off + *r) + " bytes, expected " +
                                            std::to_string(t.size));
        for (uint64_t done = 0; st && done < len;) {
          ssize_t w = ::pwrite(fd, buf.get() + done, len - done, static_cast<off_t>(off + done));
          if (w < 0 && errno == EINTR) continue;
          if (w < 0)
            st = fail_errno(errno, "write " + tmp + " at offset " + std::to_string(off + done));
          else
            done += static_cast<uint64_t>(w);
        }
        if (!st) {
          std::lock_guard lock(err_mu);
          if (!err) err = st.error();
          return;
        }
        prog.bytes.fetch_add(len, std::memory_order_relaxed);
      }
    };
    unsigned workers =
        static_cast<unsigned>(std::min<uint64_t>(std::max(1u, opt.part_concurrency), parts));
    // The first part alone: a refused or missing object fails after one request, and
    // the rest are fetched only once one part of this version has arrived.
    worker(true);
    const bool first_failed = err.has_value();  // no other thread runs yet
    std::vector<std::thread> threads;
    for (unsigned w = 1; w < workers && !first_failed && budget.try_acquire(); ++w)
      threads.emplace_back([&] {
        worker(false);
        budget.release();
      });
    if (!first_failed) worker(false);
    for (auto& th : threads) th.join();
    if (err) return cleanup(*err);
  }
  if (fsync && ::fsync(fd) != 0) return cleanup(error_from_errno(errno, "sync " + tmp));
  if (::rename(tmp.c_str(), t.dst.c_str()) != 0)
    return cleanup(error_from_errno(errno, "rename " + tmp + " to " + t.dst));
  ::close(fd);
  if (fsync) {  // the rename itself must survive a crash too
    std::string dir = dst.has_parent_path() ? dst.parent_path().string() : ".";
    int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0 || ::fsync(d) != 0) {
      int e = errno;
      if (d >= 0) ::close(d);
      return fail_errno(e, "sync directory " + dir);
    }
    ::close(d);
  }
  return ok();
}

// Uploads a local file; the writer publishes only on commit, so a failure leaves no
// object (and no multipart parts) behind.
Status upload(store::Store& s3, const Task& t, Progress& prog) {
  int fd = ::open(t.src_key.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail_errno(errno, "open " + t.src_key);
  std::unique_ptr<int, void (*)(int*)> guard(&fd, [](int* f) { ::close(*f); });
  SLUICE_ASSIGN_OR_RETURN(auto writer, s3.create(t.dst, {}));
  std::vector<std::byte> buf(8 << 20);
  uint64_t off = 0;
  while (true) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      writer->abort();
      return fail_errno(errno, "read " + t.src_key + " at offset " + std::to_string(off));
    }
    if (n == 0) break;
    if (auto st = writer->append(std::span(buf.data(), static_cast<size_t>(n))); !st) {
      writer->abort();
      return st;
    }
    off += static_cast<uint64_t>(n);
    prog.bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  }
  return writer->commit();
}

// A relative key component like ".." would write outside the destination directory.
Status check_relative(const std::string& rel, const std::string& key) {
  if (rel.empty() || rel.front() == '/' || rel == ".." || rel.starts_with("../") ||
      rel.find("/../") != std::string::npos || rel.ends_with("/.."))
    return fail(Code::kInvalidArgument,
                "refusing key '" + key + "': it would land outside the destination");
  return ok();
}

bool is_s3(const std::string& s) {
  return s.starts_with("s3://");
}
std::string local_path(const std::string& s) {
  return s.starts_with("file://") ? s.substr(7) : s;
}

void draw(const Progress& p, double seconds, bool final) {
  uint64_t b = p.bytes.load(std::memory_order_relaxed);
  double frac = p.total_bytes ? static_cast<double>(b) / static_cast<double>(p.total_bytes) : 1.0;
  int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(static_cast<size_t>(width), ' ');
  std::fprintf(stderr, "\r[%s] %3.0f%% %s / %s  %.1f MiB/s  %lu/%lu objects%s", bar.c_str(),
               frac * 100, format_size(static_cast<double>(b)).c_str(),
               format_size(static_cast<double>(p.total_bytes)).c_str(),
               seconds > 0 ? static_cast<double>(b) / seconds / (1 << 20) : 0.0,
               static_cast<unsigned long>(p.objects.load()),
               static_cast<unsigned long>(p.total_objects), final ? "\n" : "");
}

}  // namespace

Result<CpSummary> run_cp(const CpOptions& o) {
  bool src_s3 = is_s3(o.src), dst_s3 = is_s3(o.dst);
  if (src_s3 == dst_s3)
    return fail(Code::kUnsupported,
                "sluice cp copies between a local path and an s3:// URI; got '" + o.src +
                    "' and '" + o.dst + "'");
  telemetry::Registry registry;
  s3::S3Options so = o.s3;
  so.registry = &registry;
  const std::string& uri = src_s3 ? o.src : o.dst;
  SLUICE_ASSIGN_OR_RETURN(s3::S3Location loc, s3::parse_s3_uri(uri));
  SLUICE_ASSIGN_OR_RETURN(auto s3store, s3::open_s3_store("s3://" + loc.bucket, so));

  std::vector<Task> tasks;
  if (src_s3) {
    std::string dst = local_path(o.dst);
    if (o.recursive) {
      std::string prefix = loc.prefix;
      if (!prefix.empty() && !prefix.ends_with('/')) prefix += '/';
      SLUICE_ASSIGN_OR_RETURN(auto objects, s3store->list_all(prefix));
      for (auto& obj : objects) {
        if (obj.key.ends_with('/')) continue;  // "directory" marker objects
        std::string rel = obj.key.substr(prefix.size());
        SLUICE_RETURN_IF_ERROR(check_relative(rel, obj.key));
        tasks.push_back(Task{obj.key, (fs::path(dst) / rel).string(), obj.size, obj.etag, true});
      }
    } else {
      if (loc.prefix.empty() || loc.prefix.ends_with('/'))
        return fail(Code::kInvalidArgument,
                    "'" + o.src + "' names no object (use --recursive for a prefix)");
      std::string name = loc.prefix.substr(loc.prefix.rfind('/') + 1);
      std::error_code ec;
      if (dst.ends_with('/') || fs::is_directory(dst, ec)) dst = (fs::path(dst) / name).string();
      tasks.push_back(Task{loc.prefix, dst, 0, "", false});
    }
  } else {
    std::string src = local_path(o.src);
    std::error_code ec;
    if (o.recursive) {
      if (!fs::is_directory(src, ec))
        return fail(Code::kNotFound, "'" + src + "' is not a directory");
      std::string prefix = loc.prefix;
      if (!prefix.empty() && !prefix.ends_with('/')) prefix += '/';
      for (auto it = fs::recursive_directory_iterator(src, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        std::string rel = fs::relative(it->path(), src, ec).generic_string();
        tasks.push_back(Task{it->path().string(), prefix + rel, it->file_size(ec), "", true});
      }
      if (ec) return fail_errno(ec.value(), "walk " + src);
      std::sort(tasks.begin(), tasks.end(), [](auto& a, auto& b) { return a.dst < b.dst; });
    } else {
      struct stat st;
      if (::stat(src.c_str(), &st) != 0) return fail_errno(errno, "stat " + src);
      if (S_ISDIR(st.st_mode))
        return fail(Code::kInvalidArgument, "'" + src + "' is a directory (use --recursive)");
      std::string key = loc.prefix;
      if (key.empty() || key.ends_with('/')) key += fs::path(src).filename().string();
      tasks.push_back(Task{src, key, static_cast<uint64_t>(st.st_size), "", true});
    }
  }

  Progress prog;
  prog.total_objects = tasks.size();
  for (auto& t : tasks) prog.total_bytes += t.size;
  CpSummary sum;
  WorkerBudget budget(
      std::min<std::ptrdiff_t>(1024, std::max(o.s3.part_concurrency, o.s3.max_in_flight)));
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto t0 = std::chrono::steady_clock::now();
  auto work = [&] {
    while (true) {
      size_t i = next.fetch_add(1);
      if (i >= tasks.size()) return;
      Status st = src_s3 ? download(*s3store, tasks[i], prog, o.s3, o.fsync, budget)
                         : upload(*s3store, tasks[i], prog);
      std::lock_guard lock(mu);
      if (st) {
        ++sum.objects;
        sum.bytes += tasks[i].size;
        prog.objects.fetch_add(1);
      } else {
        ++sum.failed;
        if (sum.first_error.empty()) sum.first_error = st.error().to_string();
        std::string name =
            src_s3 ? "s3://" + loc.bucket + "/" + tasks[i].src_key : tasks[i].src_key;
        std::fprintf(stderr, "%ssluice: cp %s: %s\n", o.progress ? "\n" : "", name.c_str(),
                     st.error().to_string().c_str());
      }
    }
  };
  unsigned jobs = std::max(
      1u, std::min<unsigned>(o.recursive ? o.jobs : 1, static_cast<unsigned>(tasks.size())));
  std::vector<std::thread> threads;
  for (unsigned j = 0; j < jobs; ++j) threads.emplace_back(work);
  std::atomic<bool> done{false};
  std::thread bar;
  if (o.progress)
    bar = std::thread([&] {
      while (!done.load()) {
        draw(prog, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             false);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  for (auto& t : threads) t.join();
  done.store(true);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bar.joinable()) {
    bar.join();
    draw(prog, sum.seconds, true);
  }

  sum.retries = registry.counter("sluice_s3_retries_total").value();
  return sum;
}

}  // namespace sluice::cli
