// Parsing and printing byte sizes, durations and times, as flags and settings spell them: "4K",
// "1M", "4G", "512", "1.5G".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice {

// Binary units (K = 1024). Accepts an optional "iB"/"B" suffix ("4KiB", "4KB").
Result<uint64_t> parse_size(std::string_view text);
// "1.00 GiB", "512 B".
std::string format_size(double bytes);

// A duration: "90s", "30m", "12h", "7d", "2w" or plain seconds; `what` (a flag or setting)
// names it in the error.
Result<std::chrono::seconds> parse_duration(std::string_view what, std::string_view text);
// A duration as parse_duration reads it back: "45s", "90m", "12h", "7d" (the largest unit,
// up to days, that divides it).
std::string format_duration(std::chrono::seconds d);

// A time (nanoseconds since the Unix epoch) in UTC: "2026-12-05 09:30:00Z"; "-" for 0 or less.
std::string format_utc(int64_t ns);

}  // namespace sluice
