// How a group of sluice commands is registered: every group has one signature, and main.cc
// adds them from one table.
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

namespace sluice::cli {

// How a long command learns of Ctrl-C or SIGTERM: `install` sets up the signal handlers that
// set `flag` and record the signal's number in `signal`.
struct CancelHook {
  const std::atomic<bool>* flag = nullptr;
  void (*install)() = nullptr;
  const std::atomic<int>* signal = nullptr;

  bool stopped() const { return flag && flag->load(); }
  // 128 + the signal that stopped the command, as a shell reports it: 130 for Ctrl-C,
  // 143 for SIGTERM.
  int exit_code() const {
    int s = signal ? signal->load() : 0;
    return 128 + (s > 0 ? s : 2);
  }
};

// What every group is given: sluice's home ($SLUICE_HOME), Ctrl-C, and where the command that
// runs puts its exit code. A group keeps its flags' storage itself (one command runs per
// process).
struct CommandContext {
  std::string home;
  CancelHook cancel;
  int* rc = nullptr;
};

// Adds a group of commands to `app`.
using AddCommands = void (*)(CLI::App& app, const CommandContext& ctx);

void add_bench_command(CLI::App& app, const CommandContext& ctx);     // bench_cmd.cc
void add_demo_command(CLI::App& app, const CommandContext& ctx);      // demo_cmd.cc
void add_cp_command(CLI::App& app, const CommandContext& ctx);        // cp.cc
void add_cache_commands(CLI::App& app, const CommandContext& ctx);    // cache_cmd.cc: cat, cache
void add_ckpt_commands(CLI::App& app, const CommandContext& ctx);     // ckpt_cmd.cc
void add_dataset_commands(CLI::App& app, const CommandContext& ctx);  // dataset_cmd.cc
// team, project, quota, usage, forecast, capacity, reconcile (ledger_cmd.cc)
void add_ledger_commands(CLI::App& app, const CommandContext& ctx);
void add_gc_commands(CLI::App& app, const CommandContext& ctx);     // gc_cmd.cc
void add_doctor_command(CLI::App& app, const CommandContext& ctx);  // doctor_cmd.cc

}  // namespace sluice::cli
