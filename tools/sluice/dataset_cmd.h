// `sluice dataset ls|stat|pack|read`: datasets of WebDataset shards or plain objects.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cache_cmd.h"

namespace sluice::cli {

// Adds `dataset` to the app; it sets rc when it runs.
void add_dataset_commands(CLI::App& app, CancelHook cancel, int& rc);

}  // namespace sluice::cli
