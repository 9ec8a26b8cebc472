// `sluice team|project|quota|usage`: the ledger from the command line (docs/ledger.md).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "sluice/ledger/ledger.h"
#include "sluice/store/store.h"

namespace sluice::cli {

// The ledger's URI: $SLUICE_LEDGER, else $SLUICE_HOME/ledger.db.
std::string default_ledger_uri(const std::string& home);

// Opens the ledger named by a --ledger flag (empty: the default), creating the embedded one.
Result<std::unique_ptr<ledger::Ledger>> open_ledger_at(const std::string& flag,
                                                       const std::string& home);

// A duration flag: "90s", "30m", "12h", "7d", "2w" or plain seconds.
Result<std::chrono::seconds> duration_flag(const std::string& flag, const std::string& text);

// Adds team, project, quota and usage to the app; each sets rc when it runs.
void add_ledger_commands(CLI::App& app, std::string home, int& rc);

// The ledger every writing command charges through: opened when $SLUICE_LEDGER is set or
// $SLUICE_HOME/ledger.db exists and it holds at least one project; null otherwise (nothing
// to charge). An error when it is set but cannot be opened: a write is never let through
// uncounted because the ledger was unreachable.
Result<std::shared_ptr<ledger::Ledger>> ledger_for_writes(const std::string& home);

// `store` wrapped so its writes are charged (ledger::with_charging; as `kind` when given,
// else each project's default), or returned as it is when there is no ledger to charge.
Result<std::shared_ptr<store::Store>> charged(std::shared_ptr<store::Store> store,
                                              const std::string& home,
                                              std::optional<ledger::Kind> kind = {});

}  // namespace sluice::cli
