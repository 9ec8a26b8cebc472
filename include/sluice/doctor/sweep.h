// sluice/doctor/sweep.h: a path's ceiling, measured with the bench engine (sluice/io/bench.h)
// over block size x queue depth x engine, reading only (`sluice doctor --path`).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "sluice/core/status.h"
#include "sluice/doctor/diagnose.h"

namespace sluice::doctor {

struct SweepOptions {
  double budget = 20;         // seconds for the whole grid; a short one measures fewer points
  bool with_buffered = true;  // also the page cache from a cold start
  const std::atomic<bool>* cancel = nullptr;  // set: stops before the next point (kCancelled)
  // Called before each point: its index (from 1), the count, and the point.
  std::function<void(size_t index, size_t count, std::string_view engine, uint64_t bs, unsigned qd)>
      on_point;
};

// Measures `file` (a regular file or block device, only read) and returns its ceiling.
Result<Ceiling> sweep(const std::string& file, const SweepOptions& options);

}  // namespace sluice::doctor
