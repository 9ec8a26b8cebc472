#include "cache_flags.h"

#include <sys/stat.h>

#include "common.h"

#include <cstdio>

#include "sluice/core/sizes.h"

namespace sluice::cli {

void add_cache_flags(CLI::App* cmd, CacheFlags& f, bool client) {
  cmd->add_option("--cache-dir", f.dir,
                  "Cache directory (NVMe tier and index; default $SLUICE_HOME/cache)");
  cmd->add_option("--cache-ram", f.ram,
                  "RAM tier limit (0, the default: none; one command reads each byte once)")
      ->default_str("0");
  cmd->add_option("--cache-size", f.disk, "NVMe tier limit")->default_str("16G");
  cmd->add_option("--chunk-size", f.chunk,
                  "Chunk size, 64K to 1G, for a new cache directory (default 4M); a directory's "
                  "chunks keep the size they were cut at, which is used when this is left out");
  cmd->add_option("--policy", f.policy, "Eviction policy: s3fifo, lru or declared")
      ->default_str("s3fifo");
  cmd->add_option(
         "--revalidate-ms", f.revalidate_ms,
         "Re-check an object's etag with the source when what the cache knows is older than this")
      ->default_val(1000);
  cmd->add_flag("--offline", f.offline, "Trust the cache: never re-check objects it holds");
  if (!client) return;  // the daemon itself: no daemon to read through
  cmd->add_option("--daemon", f.daemon,
                  "sluiced's socket: read through the node daemon when it answers there, else "
                  "the embedded cache (default $SLUICE_HOME/sluiced.sock; 'none': never)");
}

Result<cache::CacheOptions> cache_options(const CacheFlags& f, const std::string& home) {
  cache::CacheOptions o;
  o.directory = f.dir.empty() ? home + "/cache" : f.dir;
  SLUICE_ASSIGN_OR_RETURN(o.ram_bytes, size_flag("--cache-ram", f.ram));
  SLUICE_ASSIGN_OR_RETURN(o.disk_bytes, size_flag("--cache-size", f.disk));
  if (!f.chunk.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.chunk_size, size_flag("--chunk-size", f.chunk));
  }
  SLUICE_ASSIGN_OR_RETURN(o.policy, cache::parse_policy(f.policy));
  o.revalidate_after = std::chrono::milliseconds(f.revalidate_ms);
  o.offline = f.offline;
  return o;
}

std::string daemon_socket(const CacheFlags& f, const std::string& home) {
  return f.daemon.empty() ? client::Session::default_daemon_socket(home) : f.daemon;
}

Result<client::SessionOptions> session_options(const client::AwsSettings& aws,
                                               const std::string& ledger_flag, const CacheFlags& f,
                                               bool with_s3) {
  client::SessionOptions o;
  o.home = client::home_from_environment();
  SLUICE_ASSIGN_OR_RETURN(o.cache, cache_options(f, o.home));
  o.daemon_socket = f.daemon;
  // Said when a daemon was asked for (--daemon) or one left its socket (a daemon that died):
  // with no daemon on the node, the embedded cache is the documented default, not news.
  o.on_fallback = [asked = !f.daemon.empty(),
                   socket = daemon_socket(f, o.home)](const std::string& why) {
    struct stat st;
    if (asked || ::lstat(socket.c_str(), &st) == 0)
      std::fprintf(stderr, "sluice: note: %s\n", why.c_str());
  };
  if (with_s3) {
    SLUICE_ASSIGN_OR_RETURN(o.s3, client::s3_options_from_environment(aws));
  }
  o.ledger = client::ledger_from_environment(ledger_flag);
  return o;
}

Result<client::Session> open_session(const client::AwsSettings& aws, const std::string& ledger_flag,
                                     const CacheFlags& cache, bool with_s3) {
  SLUICE_ASSIGN_OR_RETURN(client::SessionOptions o,
                          session_options(aws, ledger_flag, cache, with_s3));
  return client::Session(std::move(o));
}

}  // namespace sluice::cli
