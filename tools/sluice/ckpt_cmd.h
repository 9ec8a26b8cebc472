// `sluice ckpt save|ls|show|verify|restore|gc`: checkpoints of files from the command line
// (safetensors shards, a checkpoint directory), through ckpt::Checkpointer. docs/ckpt.md.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "aws_config.h"

namespace sluice::cli {

// Adds `ckpt` to the app; its subcommands set rc when they run. `home` is $SLUICE_HOME,
// whose ckpt/ directory is the default tier.
void add_ckpt_commands(CLI::App& app, std::string home, int& rc);

}  // namespace sluice::cli
