// The one backoff every retrying client uses (S3 requests, the loader backing off a
// throttled store): exponential with full jitter, so clients that failed together do not
// retry together. Internal.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace sluice {

// How long to wait before retry `attempt` (0-based): uniform in [0, min(max, base * 2^attempt)].
inline std::chrono::microseconds backoff_delay(unsigned attempt, std::chrono::microseconds base,
                                               std::chrono::microseconds max) {
  const uint64_t b = static_cast<uint64_t>(std::max<int64_t>(base.count(), 0));
  const uint64_t m = static_cast<uint64_t>(std::max<int64_t>(max.count(), 0));
  const uint64_t cap = std::min<uint64_t>(m, b << std::min(attempt, 20u));
  // The jitter is not part of any order, so a plain per-thread generator does.
  thread_local std::minstd_rand rng(std::random_device{}());
  return std::chrono::microseconds(cap ? std::uniform_int_distribution<uint64_t>(0, cap)(rng)
                                       : uint64_t{0});
}

inline void sleep_backoff(unsigned attempt, std::chrono::microseconds base,
                          std::chrono::microseconds max) {
  std::this_thread::sleep_for(backoff_delay(attempt, base, max));
}

}  // namespace sluice
