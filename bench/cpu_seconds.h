// The process's CPU time, for the C++ benches that report CPU seconds per GiB.
#pragma once

#include <sys/resource.h>

namespace sluice::bench {

// User + system CPU seconds of this process so far, every thread counted (RUSAGE_SELF).
inline double cpu_seconds() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return secs(r.ru_utime) + secs(r.ru_stime);
}

}  // namespace sluice::bench
