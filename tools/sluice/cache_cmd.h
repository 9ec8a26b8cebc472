// `sluice cache stat|ls|warm|evict|pin|unpin|verify` and `sluice cat`: the tiered cache
// from the command line, on the local cache directory (the embedded default: no daemon).
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cache_flags.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/client/environment.h"

namespace sluice::cli {

struct CacheArgs {
  CacheFlags cache;
  client::AwsSettings aws;
  std::string target;      // URI or URI prefix (ls, warm, evict, pin, unpin, cat)
  std::string list_file;   // warm --list
  std::string range;       // cat --range A-B
  bool use_cache = false;  // cat --cache
  bool json = false;
  bool no_progress = false;
  unsigned jobs = 16;
};

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

// Adds `cat` and `cache` to the app; each sets rc when it runs.
void add_cache_commands(CLI::App& app, CacheArgs& args, CancelHook cancel, int& rc);

}  // namespace sluice::cli
