// CLI11 validators shared by the commands. Sizes ("--bs 4K", "--target-rate 2G"): the
// value is checked with parse_size and replaced by its byte count, so a bad size fails with
// a clear message.
#pragma once

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

// A number of seconds from `lo` to `hi`: finite (CLI::Range lets nan through, as every
// comparison with it is false).
inline CLI::Validator seconds_validator(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(s, &used);
          if (used != s.size()) return "not a number of seconds: '" + s + "'";
        } catch (const std::exception&) {
          return "not a number of seconds: '" + s + "'";
        }
        if (std::isfinite(v) && v >= lo && v <= hi) return {};
        char msg[80];
        std::snprintf(msg, sizeof msg, "seconds must be from %g to %g", lo, hi);
        return msg;
      },
      "SECONDS");
}

}  // namespace sluice::cli
