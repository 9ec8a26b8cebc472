// `sluice doctor`: measures what storage can do (--path) and says why a running job gets
// less (--pid). docs/doctor.md.
#pragma once

#include <CLI/CLI.hpp>

#include "cache_cmd.h"  // CancelHook

namespace sluice::cli {

// Adds `doctor` to the app; it sets rc when it runs.
void add_doctor_command(CLI::App& app, CancelHook cancel, int& rc);

}  // namespace sluice::cli
