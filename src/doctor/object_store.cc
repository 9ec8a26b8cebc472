// The object-store probe: small GETs one at a time for the latency, then small GETs and large
// ranged reads at rising concurrency, so the report can say where the curve flattens and
// how many requests in flight a rate needs (Little's law: in flight = rate x latency).
#include "sluice/doctor/object_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "sluice/core/thread_annotations.h"

namespace sluice::doctor {

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

bool cancelled(const StoreProbeOptions& o) {
  return o.cancel && o.cancel->load();
}

// Counts requests and keeps the first error, across the probe's threads.
struct Tally {
  Mutex mu;
  uint64_t requests SLUICE_GUARDED_BY(mu) = 0;
  uint64_t errors SLUICE_GUARDED_BY(mu) = 0;
  std::string first_error SLUICE_GUARDED_BY(mu);
  std::string first() {
    MutexLock lk(mu);
    return first_error;
  }
  void report(StoreProbe& p) {
    MutexLock lk(mu);
    p.requests = requests;
    p.errors = errors;
    p.first_error = first_error;
  }
  void add(const Result<size_t>& r) {
    MutexLock lk(mu);
    ++requests;
    if (!r) {
      ++errors;
      if (first_error.empty()) first_error = r.error().message();
    }
  }
};

// `threads` readers calling `one(thread, i)` until `until`; returns the successful calls.
template <typename F>
uint64_t run_level(unsigned threads, Clock::time_point until, const StoreProbeOptions& o, F one) {
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (uint64_t i = 0; Clock::now() < until && !cancelled(o); ++i)
        if (one(t, i)) done.fetch_add(1, std::memory_order_relaxed);  // a plain count
    });
  for (auto& th : ts) th.join();
  return done.load();
}

}  // namespace

Result<StoreProbe> probe_store(store::Store& s, const StoreProbeOptions& o) {
  StoreProbe p;
  p.uri = s.uri();
  store::ListOptions lo;
  lo.max_keys = 1000;
  SLUICE_ASSIGN_OR_RETURN(store::ListPage page, s.list(lo));
  std::vector<store::ObjectInfo> objs;
  for (auto& obj : page.objects)
    if (obj.size > 0) objs.push_back(std::move(obj));
  p.objects_listed = page.objects.size();
  if (objs.empty())
    return fail(Code::kNotFound, "no object with data under " + s.uri() +
                                     ": the doctor only reads, so it needs objects to measure");
  std::sort(objs.begin(), objs.end(), [](const auto& a, const auto& b) { return a.size < b.size; });
  // Small reads rotate over up to 64 of the smallest objects (whole objects up to 1 MiB, or
  // the first 64 KiB of bigger ones); large reads go to the biggest.
  std::vector<store::ObjectInfo> small(objs.begin(),
                                       objs.begin() + std::min<size_t>(64, objs.size()));
  const uint64_t small_read = std::min<uint64_t>(small.front().size, 1 << 20);
  const auto& big = objs.back();
  p.small_key = small.front().key;
  p.small_size = small_read;
  p.big_key = big.key;
  p.big_size = big.size;
  const uint64_t range = std::min<uint64_t>(o.range_bytes, big.size);
  const unsigned max_c =
      o.concurrency.empty() ? 1 : *std::max_element(o.concurrency.begin(), o.concurrency.end());
  std::vector<std::vector<std::byte>> bufs(max_c,
                                           std::vector<std::byte>(std::max(small_read, range)));
  const uint64_t throttled0 = o.throttled ? o.throttled() : 0;
  Tally tally;

  auto small_get = [&](unsigned t, uint64_t i) {
    const auto& obj = small[(t * 7 + i) % small.size()];
    uint64_t n = std::min<uint64_t>(obj.size, small_read);
    store::ReadOptions ro;
    ro.object_size = obj.size;
    ro.split = false;
    auto r = s.read(obj.key, 0, {bufs[t].data(), n}, ro);
    tally.add(r);
    return r.has_value();
  };
  const uint64_t ranges = std::max<uint64_t>(1, big.size / range);
  auto big_read = [&](unsigned t, uint64_t i) {
    store::ReadOptions ro;
    ro.object_size = big.size;
    ro.split = false;
    auto r = s.read(big.key, ((t * 131 + i) % ranges) * range, {bufs[t].data(), range}, ro);
    tally.add(r);
    return r.has_value();
  };

  // Latency: small GETs one at a time (the first opens the connection and is not counted).
  const auto slice = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o.seconds / static_cast<double>(1 + 2 * o.concurrency.size())));
  std::vector<double> lat;
  (void)small_get(0, 0);
  const auto lat_until = Clock::now() + slice;
  for (uint64_t i = 1;
       (lat.size() < 8 || Clock::now() < lat_until) && lat.size() < 10000 && !cancelled(o); ++i) {
    auto t0 = Clock::now();
    if (!small_get(0, i)) {
      if (lat.empty() && i > 8) break;  // nothing succeeds: the error is reported below
      continue;
    }
    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  if (cancelled(o)) return fail(Code::kCancelled, "probe of " + s.uri() + " interrupted");
  if (lat.empty())
    return fail(Code::kUnavailable, "no read from " + s.uri() + " succeeded: " + tally.first());
  std::sort(lat.begin(), lat.end());
  p.latency_p50_ms = lat[lat.size() / 2];
  p.latency_p90_ms = lat[std::min(lat.size() - 1, lat.size() * 9 / 10)];

  for (unsigned c : o.concurrency) {
    if (cancelled(o)) break;
    StoreLevel lv;
    lv.concurrency = c;
    auto t0 = Clock::now();
    uint64_t gets = run_level(c, t0 + slice, o, small_get);
    lv.small_gets_s =
        static_cast<double>(gets) / std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    uint64_t reads = run_level(c, t0 + slice, o, big_read);
    lv.bytes_s = static_cast<double>(reads * range) /
                 std::chrono::duration<double>(Clock::now() - t0).count();
    p.levels.push_back(lv);
  }
  if (cancelled(o)) return fail(Code::kCancelled, "probe of " + s.uri() + " interrupted");
  tally.report(p);
  p.throttled = o.throttled ? o.throttled() - throttled0 : 0;
  return p;
}

std::vector<Cause> diagnose_store(const StoreProbe& p, double target_bytes_s) {
  std::vector<Cause> out;
  if (p.levels.empty()) return out;
  if (p.throttled > 0)
    out.push_back({"throttled", "the store asks to slow down",
                   fmt("%llu of %llu requests were answered 503, 429 or SlowDown",
                       static_cast<unsigned long long>(p.throttled),
                       static_cast<unsigned long long>(p.requests)),
                   "keep fewer requests in flight against one prefix, spread keys over more "
                   "prefixes, and back off on SlowDown (sluice's S3 client does)",
                   2});
  const StoreLevel& one = p.levels.front();
  auto best_gets = *std::max_element(p.levels.begin(), p.levels.end(), [](auto& a, auto& b) {
    return a.small_gets_s < b.small_gets_s;
  });
  auto best_bytes = *std::max_element(p.levels.begin(), p.levels.end(),
                                      [](auto& a, auto& b) { return a.bytes_s < b.bytes_s; });
  if (best_gets.small_gets_s >= 1.5 * one.small_gets_s) {
    // Little's law: requests in flight = rate x time each takes.
    double needed = best_gets.small_gets_s * p.latency_p50_ms / 1000;
    out.push_back(
        {"latency-bound", "small reads are latency-bound: one request at a time",
         fmt("one GET of %s takes %.1f ms (p90 %.1f ms): one at a time gives %.0f GETs/s; %u in "
             "flight give %.0f GETs/s",
             format_bytes(static_cast<double>(p.small_size)).c_str(), p.latency_p50_ms,
             p.latency_p90_ms, one.small_gets_s, best_gets.concurrency, best_gets.small_gets_s),
         fmt("keep at least %.0f requests in flight (GETs/s x latency), or pack small objects into "
             "shards read in large ranges",
             std::ceil(std::max(needed, 2.0))),
         best_gets.small_gets_s / std::max(one.small_gets_s, 1e-9)});
  }
  if (best_bytes.bytes_s >= 1.5 * one.bytes_s)
    out.push_back(
        {"queue-depth", "one large read at a time leaves bandwidth unused",
         fmt("one stream of %s reads reaches %s; %u in flight reach %s",
             format_bytes(static_cast<double>(std::min<uint64_t>(p.big_size, 8 << 20))).c_str(),
             format_rate(one.bytes_s).c_str(), best_bytes.concurrency,
             format_rate(best_bytes.bytes_s).c_str()),
         fmt("read large objects as %u or more ranged GETs in parallel", best_bytes.concurrency),
         best_bytes.bytes_s / std::max(one.bytes_s, 1.0)});
  // Where the curve stops rising: the server or the link is the ceiling.
  const StoreLevel& last = p.levels.back();
  if (p.levels.size() >= 2 && last.bytes_s < 1.2 * p.levels[p.levels.size() - 2].bytes_s)
    out.push_back({"store-ceiling", "the store tops out: more concurrency does not help",
                   fmt("%s at %u in flight, %s at %u",
                       format_rate(p.levels[p.levels.size() - 2].bytes_s).c_str(),
                       p.levels[p.levels.size() - 2].concurrency, format_rate(last.bytes_s).c_str(),
                       last.concurrency),
                   "this is the server's (or the link's) limit: spread the load over more servers "
                   "or prefixes, or cache (sluice's tiered cache, peers)",
                   1});
  if (target_bytes_s > 0) {
    double per = one.bytes_s;
    double needed = per > 0 ? std::ceil(target_bytes_s / per) : 0;
    out.push_back({"target",
                   fmt("%s needs about %.0f large reads in flight",
                       format_rate(target_bytes_s).c_str(), needed),
                   fmt("one stream reaches %s; the most measured was %s", format_rate(per).c_str(),
                       format_rate(best_bytes.bytes_s).c_str()),
                   target_bytes_s > 1.1 * best_bytes.bytes_s
                       ? "the store did not reach this rate at any "
                         "concurrency measured: it is beyond it here"
                       : fmt("keep %.0f or more in flight", needed),
                   1});
  }
  std::stable_sort(out.begin(), out.end(), [](const Cause& a, const Cause& b) {
    bool at = a.id == "throttled", bt = b.id == "throttled";
    if (at != bt) return at;
    return a.gain > b.gain;
  });
  if (out.empty())
    out.push_back({"healthy",
                   "nothing to fix: one request at a time already gets what the store gives",
                   fmt("%.0f GETs/s and %s at 1 in flight, about the same at %u", one.small_gets_s,
                       format_rate(one.bytes_s).c_str(), last.concurrency),
                   "the store is the limit", 1});
  return out;
}

std::string store_text(const StoreProbe& p, const std::vector<Cause>& causes) {
  std::string out = "sluice doctor: " + p.uri + "\n";
  out += fmt("  objects    %llu listed; small reads of %s (%s...), large reads from %s (%s)\n",
             static_cast<unsigned long long>(p.objects_listed),
             format_bytes(static_cast<double>(p.small_size)).c_str(), p.small_key.c_str(),
             p.big_key.c_str(), format_bytes(static_cast<double>(p.big_size)).c_str());
  out += fmt("  latency    one small GET: p50 %.2f ms, p90 %.2f ms\n", p.latency_p50_ms,
             p.latency_p90_ms);
  out += "  in flight      small GETs/s    large reads\n";
  for (const auto& l : p.levels)
    out += fmt("  %9u   %14.0f   %12s\n", l.concurrency, l.small_gets_s,
               format_rate(l.bytes_s).c_str());
  out += fmt("  requests   %llu, %llu failed, %llu slow-down answers\n",
             static_cast<unsigned long long>(p.requests), static_cast<unsigned long long>(p.errors),
             static_cast<unsigned long long>(p.throttled));
  if (!p.first_error.empty()) out += "  first error " + p.first_error + "\n";
  return out + causes_text(causes);
}

std::string store_json(const StoreProbe& p, const std::vector<Cause>& causes) {
  nlohmann::json levels = nlohmann::json::array();
  for (const auto& l : p.levels)
    levels.push_back(
        {{"concurrency", l.concurrency}, {"small_gets_s", l.small_gets_s}, {"bytes_s", l.bytes_s}});
  nlohmann::json j = {{"uri", p.uri},
                      {"objects_listed", p.objects_listed},
                      {"small_key", p.small_key},
                      {"small_bytes", p.small_size},
                      {"big_key", p.big_key},
                      {"big_bytes", p.big_size},
                      {"latency_ms", {{"p50", p.latency_p50_ms}, {"p90", p.latency_p90_ms}}},
                      {"levels", levels},
                      {"requests", p.requests},
                      {"errors", p.errors},
                      {"throttled", p.throttled},
                      {"first_error", p.first_error},
                      {"causes", nlohmann::json::parse(causes_json(causes))}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sluice::doctor
