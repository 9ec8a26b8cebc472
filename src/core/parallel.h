// Running a function over indexes on a few threads: internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller's among them). The
// first error wins and is returned; after it no new index starts.
inline Status parallel_for(size_t n, unsigned threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  Mutex mu;
  std::optional<Error> first;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      if (auto st = fn(i); !st) {
        MutexLock lock(mu);
        if (!first) first = st.error();
        next.store(n);
      }
    }
  };
  std::vector<std::jthread> pool;
  size_t t = std::min<size_t>(std::max(1u, threads), n);
  for (size_t k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  pool.clear();  // joins
  if (first) return std::unexpected(*first);
  return ok();
}

}  // namespace sluice
