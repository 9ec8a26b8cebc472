// sluice/ledger/forecast.h: when will a team (or a tier) hit its limit?
//
// Two estimates from the same usage history, both shown with the points they came from:
// - a least-squares line over a recent window, trusted only when it fits (R^2 at least
//   `min_r2`): a one-off burst, a flat series with one jump, fits a line badly, so it gives
//   no date rather than a false alarm;
// - double exponential smoothing (Holt's linear trend), adapted to unevenly spaced samples:
//   the level follows the newest figures, the trend is a smoothed rate per second; it
//   reacts faster, and also to bursts, so it is shown but the verdict rests on the line.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sluice/ledger/ledger.h"

namespace sluice::ledger {

struct ForecastOptions {
  std::chrono::seconds window{30 * 24 * 3600};  // the line is fitted to this recent span
  size_t min_points = 4;                        // fewer in the window: no line
  double min_r2 = 0.8;                          // the line's goodness of fit needed to give a date
  double alpha = 0.5;                           // Holt: weight of a new figure in the level
  double beta = 0.3;                            // Holt: weight of a new slope in the trend
  // Dates further away than this are "not within the horizon".
  std::chrono::seconds horizon{3 * 365 * 24 * 3600};
};

struct LineFit {
  double slope_per_s = 0;  // units (bytes or objects) per second
  double intercept = 0;    // value at t = window start
  double r2 = 0;           // 1 for a perfect line; 0 when the line explains nothing
  size_t points = 0;
  int64_t from_ns = 0, to_ns = 0;
};

struct Estimate {
  double rate_per_day = 0;
  std::optional<int64_t> hits_at_ns;  // when the limit is reached; none if never (or far)
};

struct Forecast {
  int64_t now_value = 0;  // the newest figure
  int64_t limit = 0;
  std::optional<LineFit> line;  // none: too few points in the window
  Estimate linear;              // from the line (no date unless trusted)
  bool linear_trusted = false;
  Estimate holt;
  // What to tell a person: "hits the limit on 2027-01-12 (in 40 days)", "over the limit
  // now", "flat", "no reliable trend (R^2 0.31): a one-off burst?", "too little history".
  std::string verdict;
  std::optional<int64_t> verdict_at_ns;  // the date the verdict names, if any
};

// `points` in time order (bytes or objects already picked: `HistoryPoint::bytes` is used);
// `now_ns` is the time the forecast is for.
Forecast forecast(std::span<const HistoryPoint> points, int64_t limit, int64_t now_ns,
                  const ForecastOptions& options = {});

// One line of a ledger's forecast: a team (or every team) on a tier, in bytes or objects.
struct ForecastRow {
  std::string team;  // empty: every team together, against the tier's capacity
  Tier tier = Tier::kNvme;
  std::string metric;      // "bytes" or "objects"
  std::string limit_kind;  // "soft limit", "hard limit" or "capacity"
  Forecast forecast;
  std::vector<HistoryPoint> points;  // what it came from, ending with the figure now
};

struct ForecastQuery {
  std::string team;          // empty: every team, and every tier's capacity
  std::optional<Tier> tier;  // only this tier
  ForecastOptions options;   // options.window is also how far back history is read
};

// Every limit in the ledger forecast from its history: each team's nearest limit (the soft
// one where there is one) in bytes and in objects, then, for every team, each tier's
// capacity. Accounts and tiers without a limit give no line.
Result<std::vector<ForecastRow>> forecast_limits(Ledger& ledger, const ForecastQuery& query);

}  // namespace sluice::ledger
