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

// Opens the ledger named by a --ledger flag (empty: the default), creating the embedded one.
Result<std::unique_ptr<ledger::Ledger>> open_ledger_at(const std::string& flag,
                                                       const std::string& home);

// A CLI11 check for options whose empty value would read as "not given": refused.
CLI::Validator not_empty();

}  // namespace sluice::cli
