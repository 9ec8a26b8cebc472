#include "cache_flags.h"

#include <cstdio>

#include "sizes.h"
#include "sluice/node/client.h"

namespace sluice::cli {

void add_cache_flags(CLI::App* cmd, CacheFlags& f, bool client) {
  cmd->add_option("--cache-dir", f.dir,
                  "Cache directory (NVMe tier and index; default $SLUICE_HOME/cache)");
  cmd->add_option("--cache-ram", f.ram,
                  "RAM tier limit (0, the default: none; one command reads each byte once)")
      ->default_str("0");
  cmd->add_option("--cache-size", f.disk, "NVMe tier limit")->default_str("16G");
  cmd->add_option(
         "--chunk-size", f.chunk,
         "Chunk size, 64K to 1G (a cache directory's chunks keep the size they were cut at)")
      ->default_str("4M");
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
  auto size = [](const char* flag, const std::string& text) -> Result<uint64_t> {
    auto v = parse_size(text);
    if (!v)
      return fail(Code::kInvalidArgument,
                  std::string(flag) + " '" + text + "': " + v.error().message());
    return v;
  };
  SLUICE_ASSIGN_OR_RETURN(o.ram_bytes, size("--cache-ram", f.ram));
  SLUICE_ASSIGN_OR_RETURN(o.disk_bytes, size("--cache-size", f.disk));
  SLUICE_ASSIGN_OR_RETURN(o.chunk_size, size("--chunk-size", f.chunk));
  SLUICE_ASSIGN_OR_RETURN(o.policy, cache::parse_policy(f.policy));
  o.revalidate_after = std::chrono::milliseconds(f.revalidate_ms);
  o.offline = f.offline;
  return o;
}

std::string daemon_socket(const CacheFlags& f, const std::string& home) {
  return f.daemon.empty() ? home + "/sluiced.sock" : f.daemon;
}

Result<std::unique_ptr<store::Store>> open_through_cache(const std::string& store_uri,
                                                         store::StoreOptions so,
                                                         const CacheFlags& f,
                                                         const std::string& home,
                                                         telemetry::Registry* registry) {
  SLUICE_ASSIGN_OR_RETURN(cache::CacheOptions co, cache_options(f, home));
  co.registry = registry;
  so.backend.set(co);
  cache::register_scheme();
  if (f.daemon == "none") return store::open_store("cache+" + store_uri, so);
  node::NodeOptions no;
  no.socket = daemon_socket(f, home);
  no.on_fallback = [](const std::string& why) {
    std::fprintf(stderr, "sluice: note: %s\n", why.c_str());
  };
  so.backend.set(no);
  node::register_scheme();
  return store::open_store("node+" + store_uri, so);
}

}  // namespace sluice::cli
