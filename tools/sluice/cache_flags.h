// The tiered cache's settings as command-line flags, shared by sluice and sluiced, and the
// session options every command builds from its flags.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "sluice/cache/tiered_cache.h"
#include "sluice/client/environment.h"
#include "sluice/client/session.h"

namespace sluice::cli {

// The cache settings every command that reads through the cache takes.
struct CacheFlags {
  std::string dir;        // --cache-dir; default $SLUICE_HOME/cache
  std::string ram = "0";  // one command reads a byte once: no RAM tier
  std::string disk = "16G";
  std::string chunk;  // empty: the directory's own (4M for a new one)
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

// Everything a command opens things through: the cache flags, the S3 settings (`aws`,
// then the environment and ~/.aws; none read without `with_s3`, for a command that opens
// no store), the ledger (`ledger_flag`, then $SLUICE_LEDGER) and $SLUICE_HOME; a read that
// falls back to the embedded cache says why on stderr.
Result<client::SessionOptions> session_options(const client::AwsSettings& aws = {},
                                               const std::string& ledger_flag = {},
                                               const CacheFlags& cache = {}, bool with_s3 = true);
// The same, opened.
Result<client::Session> open_session(const client::AwsSettings& aws = {},
                                     const std::string& ledger_flag = {},
                                     const CacheFlags& cache = {}, bool with_s3 = true);

}  // namespace sluice::cli
