// `sluice gc rule|pin|unpin|plan|run|restore|trash`: retention and clean-up through the
// ledger (docs/ledger.md).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace sluice::cli {

// Adds `gc` to the app; its subcommands set rc when they run. `home` is $SLUICE_HOME.
void add_gc_commands(CLI::App& app, std::string home, int& rc);

}  // namespace sluice::cli
