// Forecasts: a guarded least-squares line and time-aware Holt smoothing (forecast.h).
#include "sluice/ledger/forecast.h"

#include <cmath>
#include <cstdio>
#include <ctime>

namespace sluice::ledger {

namespace {

constexpr double kNsPerS = 1e9;
constexpr double kSPerDay = 86400;

std::string date_of(int64_t ns) {
  time_t t = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// When a series at `value` now, growing `rate` per second, reaches `limit`.
std::optional<int64_t> hits_at(double value, double rate, int64_t limit, int64_t now,
                               const ForecastOptions& o) {
  if (value >= static_cast<double>(limit)) return now;
  if (rate <= 0) return std::nullopt;
  double seconds = (static_cast<double>(limit) - value) / rate;
  if (seconds > static_cast<double>(o.horizon.count())) return std::nullopt;
  return now + static_cast<int64_t>(seconds * kNsPerS);
}

}  // namespace

Forecast forecast(std::span<const HistoryPoint> points, int64_t limit, int64_t now,
                  const ForecastOptions& o) {
  Forecast f;
  f.limit = limit;
  if (points.empty()) {
    f.verdict = "no history yet";
    return f;
  }
  f.now_value = points.back().bytes;

  // The window's points, time in seconds from its start.
  const int64_t from = now - o.window.count() * 1'000'000'000;
  std::vector<std::pair<double, double>> w;
  for (const HistoryPoint& p : points)
    if (p.t_ns >= from && p.t_ns <= now)
      w.emplace_back(static_cast<double>(p.t_ns - from) / kNsPerS, static_cast<double>(p.bytes));
  const double now_s = static_cast<double>(now - from) / kNsPerS;

  // Holt's linear trend, for uneven spacing: the trend is a rate per second.
  if (!w.empty()) {
    double level = w[0].second, trend = 0;
    if (w.size() >= 2 && w[1].first > w[0].first)
      trend = (w[1].second - w[0].second) / (w[1].first - w[0].first);
    for (size_t i = 1; i < w.size(); ++i) {
      double dt = w[i].first - w[i - 1].first;
      if (dt <= 0) {
        level = w[i].second;
        continue;
      }
      double predicted = level + trend * dt;
      double next = o.alpha * w[i].second + (1 - o.alpha) * predicted;
      trend = o.beta * (next - level) / dt + (1 - o.beta) * trend;
      level = next;
    }
    double current = level + trend * (now_s - w.back().first);
    f.holt.rate_per_day = trend * kSPerDay;
    f.holt.hits_at_ns = hits_at(current, trend, limit, now, o);
  }

  // The least-squares line over the window.
  if (w.size() >= o.min_points) {
    double n = static_cast<double>(w.size()), mt = 0, my = 0;
    for (auto& [t, y] : w) {
      mt += t;
      my += y;
    }
    mt /= n;
    my /= n;
    double sxx = 0, sxy = 0, syy = 0;
    for (auto& [t, y] : w) {
      sxx += (t - mt) * (t - mt);
      sxy += (t - mt) * (y - my);
      syy += (y - my) * (y - my);
    }
    if (sxx > 0) {
      LineFit line;
      line.slope_per_s = sxy / sxx;
      line.intercept = my - line.slope_per_s * mt;
      line.r2 = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
      line.points = w.size();
      line.from_ns = from + static_cast<int64_t>(w.front().first * kNsPerS);
      line.to_ns = from + static_cast<int64_t>(w.back().first * kNsPerS);
      f.line = line;
      f.linear.rate_per_day = line.slope_per_s * kSPerDay;
      f.linear_trusted = line.r2 >= o.min_r2;
      double fitted_now = line.intercept + line.slope_per_s * now_s;
      if (f.linear_trusted)
        f.linear.hits_at_ns = hits_at(fitted_now, line.slope_per_s, limit, now, o);
    }
  }

  char buf[160];
  const double span_s = w.size() >= 2 ? w.back().first - w.front().first : 0;
  if (f.now_value >= limit) {
    f.verdict = "at or over the limit now";
    f.verdict_at_ns = now;
  } else if (!f.line) {
    std::snprintf(buf, sizeof buf, "too little history (%zu points in the window, %zu needed)",
                  w.size(), o.min_points);
    f.verdict = buf;
  } else if (std::fabs(f.line->slope_per_s * span_s) <=
             0.01 * std::max(std::fabs(static_cast<double>(f.now_value)), 1.0)) {
    f.verdict = "flat: no growth over the window";
  } else if (!f.linear_trusted) {
    std::snprintf(buf, sizeof buf,
                  "no reliable trend (R^2 %.2f below %.2f): a one-off burst or irregular growth",
                  f.line->r2, o.min_r2);
    f.verdict = buf;
  } else if (f.line->slope_per_s < 0) {
    f.verdict = "shrinking";
  } else if (!f.linear.hits_at_ns) {
    f.verdict = "growing, but not within the horizon";
  } else {
    double days = static_cast<double>(*f.linear.hits_at_ns - now) / kNsPerS / kSPerDay;
    if (*f.linear.hits_at_ns <= now)
      std::snprintf(buf, sizeof buf, "at the limit by the trend, though not yet in fact");
    else
      std::snprintf(buf, sizeof buf, "reaches the limit on %s (in %.1f days)",
                    date_of(*f.linear.hits_at_ns).c_str(), days);
    f.verdict = buf;
    f.verdict_at_ns = f.linear.hits_at_ns;
  }
  return f;
}

Result<std::vector<ForecastRow>> forecast_limits(Ledger& ledger, const ForecastQuery& query) {
  if (query.options.window.count() <= 0)
    return fail(Code::kInvalidArgument, "a forecast window must be longer than 0");
  SLUICE_ASSIGN_OR_RETURN(std::vector<Account> accounts, ledger.accounts(query.team));
  SLUICE_ASSIGN_OR_RETURN(std::vector<Capacity> capacities, ledger.capacities());
  const int64_t now = ledger.now_ns();
  const int64_t since = now - query.options.window.count() * 1'000'000'000;
  std::vector<ForecastRow> rows;
  // `points` are (t, bytes, objects); each metric is forecast on its own.
  auto add = [&](const std::string& team, Tier tier, std::vector<HistoryPoint> points,
                 int64_t used_bytes, int64_t used_objects, std::optional<int64_t> bytes_limit,
                 std::optional<int64_t> objects_limit, const std::string& bytes_kind,
                 const std::string& objects_kind) {
    points.push_back({now, used_bytes, used_objects});  // the figure as it is now
    if (bytes_limit)
      rows.push_back({team, tier, "bytes", bytes_kind,
                      forecast(points, *bytes_limit, now, query.options), points});
    if (objects_limit) {
      std::vector<HistoryPoint> objects;
      for (const HistoryPoint& p : points) objects.push_back({p.t_ns, p.objects, p.objects});
      rows.push_back({team, tier, "objects", objects_kind,
                      forecast(objects, *objects_limit, now, query.options), objects});
    }
  };
  for (const Account& acc : accounts) {
    if (query.tier && acc.tier != *query.tier) continue;
    const Limits& lim = acc.limits;
    if (!lim.soft_bytes && !lim.hard_bytes && !lim.soft_objects && !lim.hard_objects) continue;
    SLUICE_ASSIGN_OR_RETURN(std::vector<HistoryPoint> h, ledger.history(acc.team, acc.tier, since));
    add(acc.team, acc.tier, std::move(h), acc.used_bytes, acc.used_objects,
        lim.soft_bytes ? lim.soft_bytes : lim.hard_bytes,
        lim.soft_objects ? lim.soft_objects : lim.hard_objects,
        lim.soft_bytes ? "soft limit" : "hard limit",
        lim.soft_objects ? "soft limit" : "hard limit");
  }
  if (!query.team.empty()) return rows;
  for (const Capacity& cap : capacities) {
    if (query.tier && cap.tier != *query.tier) continue;
    if (!cap.bytes && !cap.objects) continue;
    int64_t bytes = 0, objects = 0;
    for (const Account& acc : accounts)
      if (acc.tier == cap.tier) {
        bytes += acc.used_bytes;
        objects += acc.used_objects;
      }
    SLUICE_ASSIGN_OR_RETURN(std::vector<HistoryPoint> h,
                            ledger.history(kAllTeams, cap.tier, since));
    add("", cap.tier, std::move(h), bytes, objects, cap.bytes, cap.objects, "capacity", "capacity");
  }
  return rows;
}

}  // namespace sluice::ledger
