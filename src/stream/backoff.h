// Backing off a store that answers Unavailable (S3 SlowDown, 503): internal to the loader.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

#include "sluice/core/status.h"

namespace sluice::stream {

inline constexpr int kMaxBackoffs = 8;

// Sleeps before retry `attempt` (0-based): exponential with full jitter, 10 ms, 20 ms, ...
// up to 2.5 s. The jitter is not part of any order, so a plain generator does.
inline void back_off(int attempt) {
  thread_local std::minstd_rand rng(std::random_device{}());
  uint64_t cap_us = std::min<uint64_t>(uint64_t{10'000} << attempt, 2'500'000);
  std::uniform_int_distribution<uint64_t> jitter(cap_us / 2, cap_us);
  std::this_thread::sleep_for(std::chrono::microseconds(jitter(rng)));
}

// Runs `call` (returning a Result) again after a back-off while it fails with Unavailable,
// at most kMaxBackoffs times; `on_throttle` runs before each back-off.
template <typename Call, typename OnThrottle>
auto retry_unavailable(Call call, OnThrottle on_throttle) -> decltype(call()) {
  for (int attempt = 0;; ++attempt) {
    auto r = call();
    if (r || r.error().code() != Code::kUnavailable || attempt >= kMaxBackoffs) return r;
    on_throttle();
    back_off(attempt);
  }
}

}  // namespace sluice::stream
