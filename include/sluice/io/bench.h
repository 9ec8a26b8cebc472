// The bench engine: measures one data path the way gdsio does (`sluice bench`, and the ceiling
// sweep of `sluice doctor --path`).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "sluice/core/status.h"

namespace sluice::io {

enum class BenchMode { kBuffered, kDirect, kUring, kBounce, kGpu, kGds };
enum class BenchRw { kRead, kWrite, kRandRead, kRandWrite };

struct BenchOptions {
  std::string file;
  BenchMode mode = BenchMode::kUring;
  BenchRw rw = BenchRw::kRead;
  uint64_t bs = 1 << 20;
  unsigned qd = 32;
  unsigned threads = 1;
  std::optional<uint64_t> size;  // unset: the file's size; needed to create a file
  double runtime = 0;            // seconds; 0: one pass over `size`
  bool verify = false;
  // Called as the file is laid out (bytes of it laid out so far, its size), after every 16 MiB.
  std::function<void(uint64_t done, uint64_t total)> on_lay_out;
  // Set (by a signal handler): laying out the file stops at the next 16 MiB with kCancelled.
  const std::atomic<bool>* cancel = nullptr;
  std::string cuda_library;
  std::string cufile_library;
};

struct BenchResult {
  std::string mode, rw, path, path_why;
  uint64_t bs = 0, size = 0;
  unsigned qd = 0, threads = 0;
  uint64_t bytes = 0, ops = 0;
  double seconds = 0;
  double throughput_gib_s = 0, iops = 0;
  double lat_avg_us = 0, lat_p50_us = 0, lat_p99_us = 0, lat_p999_us = 0, lat_max_us = 0;
  double cpu_pct = 0, cpu_user_pct = 0, cpu_sys_pct = 0;
  bool verified = false;

  std::string json() const;  // one JSON object (`sluice bench --json`)
};

Result<BenchMode> parse_bench_mode(std::string_view s);
Result<BenchRw> parse_bench_rw(std::string_view s);
std::string_view bench_mode_name(BenchMode m);
std::string_view bench_rw_name(BenchRw rw);

Result<BenchResult> run_bench(const BenchOptions& options);

}  // namespace sluice::io
