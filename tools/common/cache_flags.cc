#include "cache_flags.h"

#include <sys/stat.h>

#include <cstdio>

#include "common.h"
#include "sluice/client/ledger.h"
#include "sluice/core/sizes.h"

namespace sluice::cli {

namespace {

// A default size as a flag takes it: "0", "256M", "1G".
std::string size_text(uint64_t bytes) {
  if (bytes == 0) return "0";
  if (bytes % (uint64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
  return std::to_string(bytes >> 20) + "M";
}

}  // namespace

void add_cache_flags(CLI::App* cmd, CacheFlags& f, client::Profile profile) {
  const bool daemon = profile == client::Profile::kDaemon;
  cmd->add_option("--cache-dir", f.dir,
                  "Cache directory (NVMe tier and index; default $SLUICE_HOME/cache)");
  cmd->add_option("--cache-ram", f.ram,
                  daemon ? "RAM tier limit"
                         : "RAM tier limit (0, the default: none; one command reads each byte "
                           "once)")
      ->default_str(size_text(client::default_cache_ram(profile)));
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
  if (daemon) return;  // the daemon itself: no daemon to read through
  cmd->add_option("--daemon", f.daemon,
                  "sluiced's socket: read through the node daemon when it answers there, else "
                  "the embedded cache (default $SLUICE_HOME/sluiced.sock; 'none': never)");
}

Status apply_cache_flags(const CacheFlags& f, client::SessionOverrides& o) {
  o.cache_dir = f.dir;
  auto size = [](const char* flag, const std::string& text,
                 std::optional<uint64_t>& into) -> Status {
    if (text.empty()) return ok();
    SLUICE_ASSIGN_OR_RETURN(into, size_flag(flag, text));
    return ok();
  };
  SLUICE_RETURN_IF_ERROR(size("--cache-ram", f.ram, o.cache_ram));
  SLUICE_RETURN_IF_ERROR(size("--cache-size", f.disk, o.cache_size));
  SLUICE_RETURN_IF_ERROR(size("--chunk-size", f.chunk, o.chunk_size));
  if (!f.policy.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.policy, cache::parse_policy(f.policy));
  }
  o.revalidate_after = std::chrono::milliseconds(f.revalidate_ms);
  o.offline = f.offline;
  o.daemon_socket = f.daemon;
  return ok();
}

Result<client::SessionOptions> command_session_options(const client::AwsSettings& aws,
                                                       const std::string& ledger_flag,
                                                       const CacheFlags& f, bool with_s3) {
  client::SessionOverrides given;
  given.aws = aws;
  given.with_s3 = with_s3;
  given.ledger = ledger_flag;
  SLUICE_RETURN_IF_ERROR(apply_cache_flags(f, given));
  SLUICE_ASSIGN_OR_RETURN(client::SessionOptions o, client::session_options_from_environment(
                                                        given, client::Profile::kCommand));
  o.charging = client::ledger_charging();  // a command's writes are charged where a ledger is
  // Said when a daemon was asked for (--daemon) or one left its socket (a daemon that died):
  // with no daemon on the node, the embedded cache is the documented default, not news.
  const std::string socket =
      f.daemon.empty() ? client::Session::default_daemon_socket(o.home) : f.daemon;
  o.on_fallback = [asked = !f.daemon.empty(), socket](const std::string& why) {
    struct stat st;
    if (asked || ::lstat(socket.c_str(), &st) == 0)
      std::fprintf(stderr, "sluice: note: %s\n", why.c_str());
  };
  return o;
}

Result<client::Session> open_session(const client::AwsSettings& aws, const std::string& ledger_flag,
                                     const CacheFlags& cache, bool with_s3) {
  SLUICE_ASSIGN_OR_RETURN(client::SessionOptions o,
                          command_session_options(aws, ledger_flag, cache, with_s3));
  return client::Session(std::move(o));
}

}  // namespace sluice::cli
