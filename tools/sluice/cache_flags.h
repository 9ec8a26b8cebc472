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
  std::string daemon;  // --daemon: sluiced's socket; default $SLUICE_HOME/sluiced.sock; "none"
};

// `client`: a command that may read through sluiced (adds --daemon); false for sluiced.
void add_cache_flags(CLI::App* cmd, CacheFlags& flags, bool client = true);
// The library's options from the flags; `home` is $SLUICE_HOME.
Result<cache::CacheOptions> cache_options(const CacheFlags& flags, const std::string& home);

// sluiced's socket: --daemon, else $SLUICE_HOME/sluiced.sock ("none" is the caller's).
std::string daemon_socket(const CacheFlags& flags, const std::string& home);

// Opens `store_uri` through the node's cache: through sluiced where one answers on the
// --daemon socket, else through the embedded cache in --cache-dir, with a note on stderr
// saying why. `so` carries the backend options (S3). The embedded cache records its
// metrics in `registry` when given (set it here, not as so.registry: that would wrap the
// cache in a telemetry store, which hides the cache's declaration seam from the loader).
Result<std::unique_ptr<store::Store>> open_through_cache(const std::string& store_uri,
                                                         store::StoreOptions so,
                                                         const CacheFlags& flags,
                                                         const std::string& home,
                                                         telemetry::Registry* registry = nullptr);

}  // namespace sluice::cli
