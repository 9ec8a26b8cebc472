#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "sluice/telemetry/registry.h"

namespace sluice::telemetry {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

int Histogram::bucket_of(uint64_t v) {
  if (v < static_cast<uint64_t>(kSub)) return static_cast<int>(v);
  int e = std::bit_width(v) - 1;  // >= kSubBits
  int sub = static_cast<int>((v >> (e - kSubBits)) & (kSub - 1));
  return kSub + (e - kSubBits) * kSub + sub;
}

uint64_t Histogram::bucket_lower(int idx) {
  if (idx < kSub) return static_cast<uint64_t>(idx);
  int e = (idx - kSub) / kSub + kSubBits;
  uint64_t sub = static_cast<uint64_t>((idx - kSub) % kSub);
  return (uint64_t{1} << e) + (sub << (e - kSubBits));
}

uint64_t Histogram::bucket_upper(int idx) {
  if (idx + 1 >= kBuckets) return UINT64_MAX;
  return bucket_lower(idx + 1);
}

HistogramSnapshot Histogram::snapshot() const {
  HistogramSnapshot s;
  s.buckets.resize(kBuckets);
  for (int i = 0; i < kBuckets; ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  s.max = max_.load(std::memory_order_relaxed);
  return s;
}

double HistogramSnapshot::quantile(double q) const {
  if (count == 0) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count)));
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    seen += buckets[i];
    if (seen >= rank) {
      int idx = static_cast<int>(i);
      double lo = static_cast<double>(Histogram::bucket_lower(idx));
      double hi = static_cast<double>(Histogram::bucket_upper(idx));
      double mid = idx < Histogram::kSub ? lo : (lo + hi) / 2.0;
      return std::min(mid, static_cast<double>(max));
    }
  }
  return static_cast<double>(max);
}

void HistogramSnapshot::merge(const HistogramSnapshot& other) {
  if (buckets.empty()) buckets.resize(other.buckets.size());
  for (size_t i = 0; i < other.buckets.size() && i < buckets.size(); ++i)
    buckets[i] += other.buckets[i];
  count += other.count;
  sum += other.sum;
  max = std::max(max, other.max);
}

Registry::Family& Registry::family_locked(std::string_view name, std::string_view help, Kind kind) {
  for (auto& f : families_) {
    if (f->name == name) {
      if (f->kind != kind)
        throw std::logic_error("telemetry metric '" + f->name + "' registered with two kinds");
      return *f;
    }
  }
  auto f = std::make_unique<Family>();
  f->name = std::string(name);
  f->help = std::string(help);
  f->kind = kind;
  families_.push_back(std::move(f));
  return *families_.back();
}

template <typename M>
static M& find_or_add(std::vector<std::pair<Labels, std::unique_ptr<M>>>& v, const Labels& l) {
  for (auto& [labels, m] : v)
    if (labels == l) return *m;
  v.emplace_back(l, std::make_unique<M>());
  return *v.back().second;
}

Counter& Registry::counter(std::string_view name, const Labels& labels, std::string_view help) {
  MutexLock lock(mu_);
  return find_or_add(family_locked(name, help, Kind::kCounter).counters, labels);
}

Gauge& Registry::gauge(std::string_view name, const Labels& labels, std::string_view help) {
  MutexLock lock(mu_);
  return find_or_add(family_locked(name, help, Kind::kGauge).gauges, labels);
}

Histogram& Registry::histogram(std::string_view name, const Labels& labels, std::string_view help,
                               double unit_scale) {
  MutexLock lock(mu_);
  Family& f = family_locked(name, help, Kind::kHistogram);
  f.unit_scale = unit_scale;
  return find_or_add(f.histograms, labels);
}

static std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

static std::string label_text(const Labels& labels, std::string_view extra = {}) {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k + "=\"" + escape_label(v) + "\"";
  }
  if (!extra.empty()) {
    if (!first) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

static std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string Registry::prometheus_text() const {
  MutexLock lock(mu_);
  std::string out;
  for (auto& f : families_) {
    if (!f->help.empty()) out += "# HELP " + f->name + " " + f->help + "\n";
    switch (f->kind) {
      case Kind::kCounter:
        out += "# TYPE " + f->name + " counter\n";
        for (auto& [l, c] : f->counters)
          out += f->name + label_text(l) + " " + std::to_string(c->value()) + "\n";
        break;
      case Kind::kGauge:
        out += "# TYPE " + f->name + " gauge\n";
        for (auto& [l, g] : f->gauges)
          out += f->name + label_text(l) + " " + std::to_string(g->value()) + "\n";
        break;
      case Kind::kHistogram:
        out += "# TYPE " + f->name + " histogram\n";
        for (auto& [l, h] : f->histograms) {
          HistogramSnapshot s = h->snapshot();
          // Export cumulative counts at power-of-two boundaries: fine enough for dashboards
          // and a bounded number of series, whatever the recorded range.
          uint64_t cumulative = 0;
          int idx = 0;
          for (int e = 0; e < 64 && cumulative < s.count; ++e) {
            uint64_t bound = uint64_t{1} << e;
            while (idx < Histogram::kBuckets && Histogram::bucket_upper(idx) <= bound)
              cumulative += s.buckets[idx++];
            std::string le = "le=\"" + number(static_cast<double>(bound) * f->unit_scale) + "\"";
            out +=
                f->name + "_bucket" + label_text(l, le) + " " + std::to_string(cumulative) + "\n";
          }
          out += f->name + "_bucket" + label_text(l, "le=\"+Inf\"") + " " +
                 std::to_string(s.count) + "\n";
          out += f->name + "_sum" + label_text(l) + " " +
                 number(static_cast<double>(s.sum) * f->unit_scale) + "\n";
          out += f->name + "_count" + label_text(l) + " " + std::to_string(s.count) + "\n";
        }
        break;
    }
  }
  return out;
}

std::string Registry::json_text() const {
  MutexLock lock(mu_);
  nlohmann::json counters = nlohmann::json::array(), gauges = nlohmann::json::array(),
                 histograms = nlohmann::json::array();
  auto labels_json = [](const Labels& l) {
    nlohmann::json j = nlohmann::json::object();
    for (auto& [k, v] : l) j[k] = v;
    return j;
  };
  for (auto& f : families_) {
    for (auto& [l, c] : f->counters)
      counters.push_back({{"name", f->name}, {"labels", labels_json(l)}, {"value", c->value()}});
    for (auto& [l, g] : f->gauges)
      gauges.push_back({{"name", f->name}, {"labels", labels_json(l)}, {"value", g->value()}});
    for (auto& [l, h] : f->histograms) {
      HistogramSnapshot s = h->snapshot();
      double k = f->unit_scale;
      histograms.push_back({{"name", f->name},
                            {"labels", labels_json(l)},
                            {"count", s.count},
                            {"sum", static_cast<double>(s.sum) * k},
                            {"mean", s.mean() * k},
                            {"p50", s.quantile(0.50) * k},
                            {"p99", s.quantile(0.99) * k},
                            {"p999", s.quantile(0.999) * k},
                            {"max", static_cast<double>(s.max) * k}});
    }
  }
  nlohmann::json root = {{"counters", counters}, {"gauges", gauges}, {"histograms", histograms}};
  return root.dump();
}

}  // namespace sluice::telemetry
