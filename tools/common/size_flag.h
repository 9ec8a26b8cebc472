// CLI11 validators shared by the commands. Sizes ("--bs 4K", "--target-rate 2G") and
// durations ("--grace 1h"): the value is checked with parse_size or parse_duration and
// replaced by its byte or second count, so a bad one fails with a clear message.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "sluice/core/sizes.h"

namespace sluice::cli {

inline CLI::Validator size_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto v = parse_size(s);
        if (!v) return v.error().message();
        s = std::to_string(*v);
        return {};
      },
      "SIZE");
}

// A duration from `lo` to `hi` seconds: a number of seconds ("2.5") or a whole number with a
// unit ("90s", "30m", "12h", "7d", "2w"), replaced by its seconds (use with ->transform);
// finite (CLI::Range lets nan through, as every comparison with it is false).
inline CLI::Validator seconds_validator(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (!s.empty() && std::isalpha(static_cast<unsigned char>(s.back()))) {
          auto d = parse_duration("", s);
          if (!d) return "not a duration: '" + s + "' (90s, 30m, 12h, 7d or seconds)";
          v = static_cast<double>(d->count());
          s = std::to_string(d->count());
        } else {
          try {
            size_t used = 0;
            v = std::stod(s, &used);
            if (used != s.size()) return "not a number of seconds: '" + s + "'";
          } catch (const std::exception&) {
            return "not a number of seconds: '" + s + "'";
          }
        }
        if (std::isfinite(v) && v >= lo && v <= hi) return {};
        char msg[80];
        std::snprintf(msg, sizeof msg, "seconds must be from %g to %g", lo, hi);
        return msg;
      },
      "DURATION");
}

}  // namespace sluice::cli
