// The tiered cache's settings as command-line flags, shared by sluice and sluiced, and the
// session a command opens from its flags (through client::session_options_from_environment,
// the library's composition root).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "sluice/cache/tiered_cache.h"
#include "sluice/client/environment.h"
#include "sluice/client/session.h"

namespace sluice::cli {

// The cache settings every command that reads through the cache takes. An empty one is
// not given: the profile's default (client::Profile) applies.
struct CacheFlags {
  std::string dir;     // --cache-dir; default $SLUICE_HOME/cache
  std::string ram;     // --cache-ram; default client::default_cache_ram(profile)
  std::string disk;    // --cache-size; default 16G
  std::string chunk;   // empty: the directory's own (4M for a new one)
  std::string policy;  // default s3fifo
  unsigned revalidate_ms = 1000;
  bool offline = false;
  std::string daemon;  // --daemon: sluiced's socket; default $SLUICE_HOME/sluiced.sock; "none"
};

// The flags, with `profile`'s defaults in --help. kCommand adds --daemon (a command may
// read through sluiced); the daemon itself has none.
void add_cache_flags(CLI::App* cmd, CacheFlags& flags, client::Profile profile);
// The flags given, checked, into `o` (InvalidArgument names the flag).
Status apply_cache_flags(const CacheFlags& flags, client::SessionOverrides& o);

// A command's session options (client::Profile::kCommand): the cache flags, the S3
// settings (`aws`, then the environment and ~/.aws; none read without `with_s3`, for a
// command that opens no store), the ledger (`ledger_flag`, then $SLUICE_LEDGER) and
// $SLUICE_HOME; a read that falls back to the embedded cache says why on stderr when a
// daemon was asked for or left its socket.
Result<client::SessionOptions> command_session_options(const client::AwsSettings& aws = {},
                                                       const std::string& ledger_flag = {},
                                                       const CacheFlags& cache = {},
                                                       bool with_s3 = true);
// The same, opened.
Result<client::Session> open_session(const client::AwsSettings& aws = {},
                                     const std::string& ledger_flag = {},
                                     const CacheFlags& cache = {}, bool with_s3 = true);

}  // namespace sluice::cli
