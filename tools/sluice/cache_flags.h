// The tiered cache's settings as command-line flags, shared by sluice and sluiced.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "sluice/cache/tiered_cache.h"

namespace sluice::cli {

// The cache settings every command that reads through the cache takes.
struct CacheFlags {
  std::string dir;                                    // --cache-dir; default $SLUICE_HOME/cache
  std::string ram = "0", disk = "16G", chunk = "4M";  // one command reads a byte once: no RAM tier
  std::string policy = "s3fifo";
  unsigned revalidate_ms = 1000;
  bool offline = false;
};

void add_cache_flags(CLI::App* cmd, CacheFlags& flags);
// The library's options from the flags; `home` is $SLUICE_HOME.
Result<cache::CacheOptions> cache_options(const CacheFlags& flags, const std::string& home);

}  // namespace sluice::cli
