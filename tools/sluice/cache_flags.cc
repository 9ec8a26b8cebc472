#include "cache_flags.h"

#include "sizes.h"

namespace sluice::cli {

void add_cache_flags(CLI::App* cmd, CacheFlags& f) {
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

}  // namespace sluice::cli
