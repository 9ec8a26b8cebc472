// What every sluice command shares: how an error is reported, settings files, members.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/peer/membership.h"

namespace sluice::cli {

// Prints "sluice: error: ..." to stderr; returns the exit code (2 for a usage error).
int report_error(const Error& e);
// The node secret: the first line of a file only its owner may read, at least 16 bytes.
Result<std::string> read_secret(const std::string& path);
// A time (nanoseconds since the Unix epoch) in UTC, formatted with strftime's `format`.
std::string format_utc(int64_t ns, const char* format);
// This host's name up to the first dot: the default member name of a node.
std::string short_host_name();

}  // namespace sluice::cli
