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

// A CLI11 check for options whose empty value would read as "not given": refused.
CLI::Validator not_empty();

// Adds team, project, quota and usage to the app; each sets rc when it runs.
void add_ledger_commands(CLI::App& app, std::string home, int& rc);

// The ledger every writing command charges through: `flag` (a --ledger) when given, else
// $SLUICE_LEDGER when set, else $SLUICE_HOME/ledger.db when it exists; null when there is
// none, or it holds no project (nothing to charge). An error when one is configured but
// cannot be opened: a write is never let through uncounted because the ledger was down.
Result<std::shared_ptr<ledger::Ledger>> ledger_for_writes(const std::string& home,
                                                          const std::string& flag = {});

// `store` wrapped so its writes are charged (ledger::with_charging; as `kind` when given,
// else each project's default), or returned as it is when there is no ledger to charge.
Result<std::shared_ptr<store::Store>> charged(std::shared_ptr<store::Store> store,
                                              const std::string& home,
                                              std::optional<ledger::Kind> kind = {},
                                              const std::string& ledger_flag = {});

}  // namespace sluice::cli
