#include "sluice/telemetry/textfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <span>

#include "sluice/core/fd.h"
#include "sluice/telemetry/registry.h"

namespace sluice::telemetry {

Result<std::unique_ptr<TextfileExporter>> TextfileExporter::start(
    const Registry& registry, std::string path, std::chrono::milliseconds interval) {
  if (path.empty()) return fail(Code::kInvalidArgument, "metrics file: no path given");
  if (interval.count() <= 0)
    return fail(Code::kInvalidArgument, "metrics file " + path + ": the interval must be positive");
  std::unique_ptr<TextfileExporter> e(new TextfileExporter(registry, std::move(path), interval));
  SLUICE_RETURN_IF_ERROR(e->write_now());
  e->thread_ = std::thread([raw = e.get()] {
    UniqueLock lock(raw->mu_);
    while (!raw->cv_.wait_for(lock, raw->interval_,
                              [raw]() SLUICE_REQUIRES(raw->mu_) { return raw->stopping_; })) {
      lock.unlock();
      (void)raw->write_now();  // a failed write is tried again at the next interval
      lock.lock();
    }
  });
  return e;
}

TextfileExporter::TextfileExporter(const Registry& registry, std::string path,
                                   std::chrono::milliseconds interval)
    : registry_(registry), path_(std::move(path)), interval_(interval) {}

TextfileExporter::~TextfileExporter() {
  if (!stopped_) (void)stop();
}

Status TextfileExporter::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  stopped_ = true;
  return write_now();
}

Status TextfileExporter::write_now() {
  // The rename below replaces whatever has the name: only ever a regular file of metrics,
  // never a device node, FIFO, symlink or directory (`--metrics-file /dev/null` as root
  // would otherwise replace /dev/null).
  struct stat sb;
  if (::lstat(path_.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode))
    return fail(
        Code::kInvalidArgument,
        "metrics file " + path_ + " exists and is not a regular file; refusing to replace it");
  const std::string text = registry_.prometheus_text();
  const std::string tmp = path_ + ".tmp-" + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return fail_errno(errno, "metrics file " + path_ + ": create " + tmp);
  if (auto st = write_full(fd.get(), std::as_bytes(std::span(text)), "metrics file " + tmp); !st) {
    ::unlink(tmp.c_str());
    return st;
  }
  fd.reset();
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return fail_errno(err, "metrics file " + path_ + ": rename " + tmp);
  }
  return ok();
}

}  // namespace sluice::telemetry
