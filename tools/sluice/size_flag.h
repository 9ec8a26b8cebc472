// A CLI11 transform for size flags ("--bs 4K", "--target-rate 2G"): the value is checked
// with parse_size and replaced by its byte count, so a bad size fails with a clear message.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "sizes.h"

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

}  // namespace sluice::cli
