// `sluice ckpt save|ls|show|verify|restore|gc`: checkpoints of files from the command line
// (safetensors shards, a checkpoint directory), through ckpt::Checkpointer. docs/ckpt.md.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cache_cmd.h"
#include "sluice/client/environment.h"

namespace sluice::cli {

// Adds `ckpt` to the app; its subcommands set rc when they run. `home` is $SLUICE_HOME,
// whose ckpt/ directory is the default tier. save, restore and sync install `cancel`'s
// signal handlers: Ctrl-C stops them with nothing half-written left, and exit 130.
void add_ckpt_commands(CLI::App& app, std::string home, CancelHook cancel, int& rc);

}  // namespace sluice::cli
