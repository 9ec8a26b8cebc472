// sluice/telemetry/registry.h: counters, gauges and log-bucketed histograms.
//
// Contract:
// - Metrics are created (or found) by name and labels through a Registry, which takes a
//   lock; do that once, at set-up, and keep the returned reference. The reference stays
//   valid for the Registry's lifetime.
// - Recording (`Counter::add`, `Gauge::set`, `Histogram::record`) is wait-free: one or two
//   relaxed atomic adds, no lock, no allocation, no string formatting. Any number of
//   threads may record at once.
// - Relaxed ordering is enough: each metric is an independent monotonic or last-value
//   cell, and readers (exporters) only need each cell to be eventually consistent; no other
//   memory is published through these atomics.
// - Export (`prometheus_text`, `json_text`) takes the registry lock and reads every cell;
//   it may run concurrently with recording.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/thread_annotations.h"

namespace sluice::telemetry {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};  // relaxed: an independent cell (the contract above)
};

class Gauge {
 public:
  void set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { value_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};  // relaxed: an independent cell (the contract above)
};

// A read-only copy of a histogram's buckets, for quantiles and export.
struct HistogramSnapshot {
  std::vector<uint64_t> buckets;  // Histogram::kBuckets entries
  uint64_t count = 0;
  uint64_t sum = 0;
  uint64_t max = 0;

  // The q-quantile (0 <= q <= 1) in recorded units: the midpoint of the bucket that holds
  // it, clamped to `max`. Relative error is at most 1/32. Zero when empty.
  double quantile(double q) const;
  double mean() const { return count ? static_cast<double>(sum) / count : 0.0; }
  void merge(const HistogramSnapshot& other);
};

// Log-linear histogram of non-negative integers (nanoseconds, bytes): values below 16 get
// a bucket each; above, each power of two is split into 16 equal buckets.
class Histogram {
 public:
  static constexpr int kSubBits = 4;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kBuckets = kSub + (64 - kSubBits) * kSub;

  void record(uint64_t v) {
    buckets_[bucket_of(v)].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
    uint64_t m = max_.load(std::memory_order_relaxed);
    while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
    }
  }
  HistogramSnapshot snapshot() const;

  static int bucket_of(uint64_t v);
  static uint64_t bucket_lower(int idx);
  static uint64_t bucket_upper(int idx);  // exclusive

 private:
  // Relaxed, each: independent cells (the contract above); a snapshot taken while values
  // are recorded may be off by those few, never torn.
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter& counter(std::string_view name, const Labels& labels = {}, std::string_view help = "");
  Gauge& gauge(std::string_view name, const Labels& labels = {}, std::string_view help = "");
  // `unit_scale` converts recorded units to exported ones (1e-9 for nanoseconds recorded
  // into a `_seconds` histogram).
  Histogram& histogram(std::string_view name, const Labels& labels = {}, std::string_view help = "",
                       double unit_scale = 1.0);

  // Prometheus text exposition format 0.0.4.
  std::string prometheus_text() const;
  // One JSON object: {"counters": [...], "gauges": [...], "histograms": [...]}.
  std::string json_text() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    std::string name;
    std::string help;
    Kind kind;
    double unit_scale = 1.0;
    std::vector<std::pair<Labels, std::unique_ptr<Counter>>> counters;
    std::vector<std::pair<Labels, std::unique_ptr<Gauge>>> gauges;
    std::vector<std::pair<Labels, std::unique_ptr<Histogram>>> histograms;
  };
  Family& family_locked(std::string_view name, std::string_view help, Kind kind)
      SLUICE_REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ SLUICE_GUARDED_BY(mu_);
};

// Latency recording helper: nanoseconds since `start` on the steady clock.
uint64_t now_ns();

}  // namespace sluice::telemetry
