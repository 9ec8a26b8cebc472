// Parsing and printing byte sizes for the CLI: "4K", "1M", "4G", "512", "1.5G".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice::cli {

// Binary units (K = 1024). Accepts an optional "iB"/"B" suffix ("4KiB", "4KB").
Result<uint64_t> parse_size(std::string_view text);
// "1.00 GiB", "512 B".
std::string format_size(double bytes);

// A duration flag: "90s", "30m", "12h", "7d", "2w" or plain seconds; `flag` names it in the
// error.
Result<std::chrono::seconds> duration_flag(const std::string& flag, const std::string& text);

}  // namespace sluice::cli
