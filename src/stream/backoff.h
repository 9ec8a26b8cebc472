// Backing off a store that answers Unavailable (S3 SlowDown, 503): internal to the loader.
#pragma once

#include <chrono>

#include "core/backoff.h"
#include "sluice/core/status.h"

namespace sluice::stream {

inline constexpr int kMaxBackoffs = 8;

// Sleeps before retry `attempt` (0-based): core/backoff.h's, from 10 ms up to 2.5 s.
inline void back_off(int attempt) {
  sleep_backoff(static_cast<unsigned>(attempt), std::chrono::milliseconds(10),
                std::chrono::milliseconds(2500));
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
