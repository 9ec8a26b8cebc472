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
// A settings file (config, peers, node secret): a regular file of at most 1 MiB. A FIFO or
// a device is refused before it is read (it would block, or never end). `what` names it.
Result<std::string> read_small_file(const std::string& path, const char* what);
// The node secret: the first line of a file only its owner may read, at least 16 bytes.
Result<std::string> read_secret(const std::string& path);
// A time (nanoseconds since the Unix epoch) in UTC, formatted with strftime's `format`.
std::string format_utc(int64_t ns, const char* format);
// This host's name up to the first dot: the default member name of a node.
std::string short_host_name();
// The job's daemons, as --peers names them: a host list file, or "slurm"
// (SLURM_JOB_NODELIST, each member listening on `slurm_port`; 0: refused, there is none).
Result<std::vector<peer::Member>> load_members(const std::string& spec, uint16_t slurm_port);

}  // namespace sluice::cli
