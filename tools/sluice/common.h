// What every sluice command shares: where $SLUICE_HOME is, how an error is reported.
#pragma once

#include <string>

#include "sluice/core/status.h"

namespace sluice::cli {

// $SLUICE_HOME, else ~/.sluice, else ./.sluice.
std::string sluice_home();
// Prints "sluice: error: ..." to stderr; returns the exit code (2 for a usage error).
int report_error(const Error& e);

}  // namespace sluice::cli
