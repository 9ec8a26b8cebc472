// `sluice cache stat|ls|warm|evict|pin|unpin|verify|peers` and `sluice cat`: the node's cache
// from the command line, through sluiced when it answers, else the cache directory itself.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "command.h"
#include "common.h"
#include "cp.h"
#include "sluice/cache/json.h"
#include "sluice/client/location.h"
#include "sluice/client/object.h"
#include "sluice/client/read.h"
#include "sluice/client/warm.h"
#include "sluice/core/sizes.h"
#include "sluice/node/stats.h"
#include "sluice/xfer/copy.h"

namespace sluice::cli {

using client::Location;
using client::parse_location;
namespace fs = std::filesystem;

namespace {

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

// The node's cache these commands look after: sluiced's when it answers, else the directory.
// `sources`: the command opens source stores (S3 settings are read only then).
Result<std::unique_ptr<cache::Control>> open_control(const CacheArgs& a, bool sources) {
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws, {}, a.cache, sources));
  return session.cache_control();
}

// `cache stat` through sluiced: its tiers, hits and misses, and what its server did.
int print_daemon_stat(const CacheArgs& a, const cache::ControlStatus& st) {
  const cache::DaemonStatus& d = *st.daemon;
  if (a.json) {
    nlohmann::json j = d.stats;
    j["daemon"] = {{"socket", d.socket}, {"pid", d.pid}, {"team", d.team}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  const cache::CacheStats& s = d.stats.cache;
  const node::ServerStats& sv = d.stats.server;
  auto size = [](uint64_t n) { return format_size(static_cast<double>(n)); };
  std::printf("sluiced pid %ld on %s: cache %s (policy %s, %s)\n", static_cast<long>(d.pid),
              d.socket.c_str(), s.directory.c_str(), s.policy.c_str(), s.io_path.c_str());
  for (const auto& [name, t] : {std::pair{"RAM", s.ram}, std::pair{"NVMe", s.disk}}) {
    std::printf("%s tier: %s of %s in %lu chunks; %lu hits (%s)\n", name, size(t.bytes).c_str(),
                size(t.capacity).c_str(), static_cast<unsigned long>(t.chunks),
                static_cast<unsigned long>(t.hits), size(t.hit_bytes).c_str());
  }
  std::printf(
      "misses: %lu chunks (%s from the sources); hand-offs: %lu chunks (%s), inline %s (%s "
      "through reply windows)\n",
      static_cast<unsigned long>(s.misses), size(s.miss_bytes).c_str(),
      static_cast<unsigned long>(sv.handoff_chunks), size(sv.handoff_bytes).c_str(),
      size(sv.inline_bytes).c_str(), size(sv.window_bytes).c_str());
  std::printf("connections: %lu served, %lu refused; requests: %lu, %lu failed\n",
              static_cast<unsigned long>(sv.connections),
              static_cast<unsigned long>(sv.connections_refused),
              static_cast<unsigned long>(sv.requests),
              static_cast<unsigned long>(sv.request_errors));
  if (const auto& c = d.stats.charging) {
    std::printf("charged to teams (%s): %s kept, %s freed; %lu chunks not kept (quota)\n",
                c->ledger.c_str(), size(c->admitted_bytes).c_str(), size(c->freed_bytes).c_str(),
                static_cast<unsigned long>(c->refused_chunks));
  }
  return 0;
}

// `cache stat` of the directory: its NVMe tier and what each source store has there.
int print_directory_stat(const CacheArgs& a, cache::Control& control, const cache::CacheStats& s) {
  auto listing = control.chunks("", "");
  if (!listing) return report_error(listing.error());
  std::vector<cache::StoreHolding> stores = cache::holdings_by_store(listing->chunks);
  if (a.json) {
    nlohmann::json j = s;
    j["stores"] = stores;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("cache %s (policy %s, %s)\n", s.directory.c_str(), s.policy.c_str(),
              s.io_path.c_str());
  std::printf("NVMe tier: %s of %s in %lu chunks\n",
              format_size(static_cast<double>(s.disk.bytes)).c_str(),
              format_size(static_cast<double>(s.disk.capacity)).c_str(),
              static_cast<unsigned long>(s.disk.chunks));
  for (const cache::StoreHolding& p : stores) {
    std::printf(
        "  %-40s %6lu objects %8lu chunks %12s%s\n", p.store.c_str(),
        static_cast<unsigned long>(p.objects), static_cast<unsigned long>(p.chunks),
        format_size(static_cast<double>(p.bytes)).c_str(),
        p.pinned_chunks ? (" (" + std::to_string(p.pinned_chunks) + " pinned)").c_str() : "");
  }
  if (stores.empty()) std::printf("  (empty)\n");
  return 0;
}

int cmd_stat(const CacheArgs& a) {
  auto control = open_control(a, false);
  if (!control) return report_error(control.error());
  auto st = (*control)->status();
  if (!st) return report_error(st.error());
  return st->daemon ? print_daemon_stat(a, *st) : print_directory_stat(a, **control, st->stats);
}

// `cache peers`: the membership of the running daemon and each peer's state.
int cmd_peers(const CacheArgs& a) {
  auto session = open_session(a.aws, {}, a.cache, false);
  if (!session) return report_error(session.error());
  auto control = session->cache_control();
  if (!control) return report_error(control.error());
  auto st = (*control)->status();
  if (!st) return report_error(st.error());
  if (!st->daemon)
    return report_error(Error(Code::kUnavailable,
                              "cache peers: no sluiced answers on " + session->daemon_socket()));
  const std::string& socket = st->daemon->socket;
  const node::DaemonStats& d = st->daemon->stats;
  if (a.json) {
    nlohmann::json j = d;
    std::printf(
        "%s\n",
        nlohmann::json({{"peers", j["peers"]}, {"bytes_from", j["bytes_from"]}}).dump().c_str());
    return 0;
  }
  if (d.peers.empty()) {
    std::printf("sluiced on %s has no peers (start it with --peers)\n", socket.c_str());
    return 0;
  }
  std::printf("%-20s %-22s %-7s %10s %12s %7s  %s\n", "NAME", "ADDRESS", "STATE", "CHUNKS",
              "FETCHED", "ERRORS", "LAST ERROR");
  for (const node::PeerStatus& p : d.peers)
    std::printf("%-20s %-22s %-7s %10lu %12s %7lu  %s\n", printable(p.name).c_str(),
                printable(p.address).c_str(), printable(p.state).c_str(),
                static_cast<unsigned long>(p.fetched_chunks),
                format_size(static_cast<double>(p.fetched_bytes)).c_str(),
                static_cast<unsigned long>(p.errors), printable(p.last_error).c_str());
  return 0;
}

// `cache ls`: the cached chunks of every store (through sluiced: of the roots this caller's
// team may read), or under a URI prefix.
int cmd_ls(const CacheArgs& a) {
  client::StoreKey where;
  if (!a.target.empty()) {
    auto named = client::store_key(a.target);
    if (!named) return report_error(named.error());
    where = *named;
  }
  auto control = open_control(a, !a.target.empty());
  if (!control) return report_error(control.error());
  auto listing = (*control)->chunks(where.store_uri, where.key);
  if (!listing) return report_error(listing.error());
  nlohmann::json out = nlohmann::json::array();
  for (const cache::CachedChunk& c : listing->chunks) {
    if (a.json) {
      out.push_back(c);
    } else {
      // "file:///" + "/" + "tmp/x" would print four slashes.
      const char* sep = c.store.ends_with('/') ? "" : "/";
      std::printf("%-8s %10lu %s%s%s chunk %lu%s\n", cache::chunk_tiers(c).c_str(),
                  static_cast<unsigned long>(c.length), printable(c.store).c_str(), sep,
                  printable(c.key).c_str(), static_cast<unsigned long>(c.index),
                  c.pinned ? " pinned" : "");
    }
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  if (listing->truncated)
    std::fprintf(stderr, "sluice: cache ls: the daemon sent the first %zu chunks only\n",
                 listing->chunks.size());
  return 0;
}

int cmd_verify(const CacheArgs& a) {
  auto control = open_control(a, false);
  if (!control) return report_error(control.error());
  auto rep = (*control)->verify();
  if (!rep) return report_error(rep.error().with_context("cache verify"));
  if (a.json) {
    std::printf("%s\n", nlohmann::json(*rep).dump().c_str());
  } else {
    for (const std::string& why : rep->corrupt)
      std::fprintf(stderr, "sluice: cache verify: %s\n", why.c_str());
    std::printf("verified %lu chunks (%s): %zu corrupt%s\n",
                static_cast<unsigned long>(rep->chunks),
                format_size(static_cast<double>(rep->bytes)).c_str(), rep->corrupt.size(),
                rep->corrupt.empty() ? "" : ", dropped (the next read fetches them again)");
  }
  return rep->corrupt.empty() ? 0 : 1;
}

// evict, pin, unpin: one call on a URI prefix.
int cmd_prefix(const CacheArgs& a, const std::string& verb) {
  auto where = client::store_key(a.target);
  if (!where) return report_error(where.error());
  auto control = open_control(a, true);
  if (!control) return report_error(control.error());
  auto n = verb == "evict" ? (*control)->evict(where->store_uri, where->key)
                           : (*control)->pin(where->store_uri, where->key, verb == "pin");
  if (!n) return report_error(n.error());
  if (a.json) {
    std::printf("%s\n", nlohmann::json({{verb, a.target}, {"chunks", *n}}).dump().c_str());
  } else {
    std::printf("%s %s: %lu chunk%s%s\n",
                verb == "evict" ? "evicted"
                : verb == "pin" ? "pinned"
                                : "unpinned",
                a.target.c_str(), static_cast<unsigned long>(*n), *n == 1 ? "" : "s",
                verb == "pin" ? " now, and whatever of it is cached later" : "");
  }
  return 0;
}

// What `warm PREFIX` or `warm [PREFIX] --list FILE` names. The list holds one URI or path
// a line, all in one store: PREFIX's when given, else the first line's.
Result<client::WarmRequest> warm_request(const CacheArgs& a) {
  std::string first = a.target;
  if (first.empty() && !a.list_file.empty()) {
    std::ifstream in(a.list_file);
    while (std::getline(in, first) && (first.empty() || first[0] == '#')) {
    }
  }
  if (first.empty())
    return fail(Code::kInvalidArgument, "warm: give a URI prefix, or --list FILE of URIs");
  SLUICE_ASSIGN_OR_RETURN(client::StoreKey named, client::store_key(first));
  client::WarmRequest r;
  r.store_uri = named.store_uri;
  r.prefix = named.key;
  if (a.list_file.empty()) return r;
  std::ifstream in(a.list_file);
  if (!in) return fail_errno(errno, "open " + a.list_file);
  r.keys.emplace();
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    const std::string where = a.list_file + " line " + std::to_string(n);
    auto k = client::store_key(line);
    if (!k) return std::unexpected(k.error().with_context(where));
    if (k->store_uri != r.store_uri)
      return fail(Code::kInvalidArgument,
                  where + ": '" + line + "' is not in the same store as '" + first + "'");
    r.keys->push_back(k->key);
  }
  return r;
}

int cmd_warm(const CacheArgs& a, const CancelHook& cancel) {
  auto what = warm_request(a);
  if (!what) return report_error(what.error());
  // Through the running daemon (its cache fills), else the embedded cache.
  auto control = open_control(a, true);
  if (!control) return report_error(control.error());
  client::WarmOptions how;
  how.jobs = a.jobs;
  how.cancel = cancel.flag;
  auto t0 = std::chrono::steady_clock::now();
  bool progress = !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  if (progress)
    how.on_progress = [&](const xfer::CopyProgress& p) {
      draw_progress(p, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    false);
    };
  if (cancel.install) cancel.install();
  auto warmed = client::warm(**control, *what, how);
  if (progress) std::fputc('\n', stderr);
  if (!warmed) return report_error(warmed.error());
  const xfer::CopyReport& rep = warmed->copy;
  for (const xfer::CopyFailure& f : warmed->skipped)
    std::fprintf(stderr, "sluice: cache warm: skipped '%s': %s\n", f.src_key.c_str(),
                 f.error.message().c_str());
  for (const xfer::CopyFailure& f : rep.failures)
    std::fprintf(stderr, "sluice: error: cache warm %s: %s\n", f.src_key.c_str(),
                 f.error.to_string().c_str());
  if (a.json) {
    std::printf("%s\n", nlohmann::json({{"objects", rep.objects},
                                        {"bytes", rep.bytes},
                                        {"seconds", rep.seconds},
                                        {"already_cached_bytes", warmed->already_cached()},
                                        {"fetched_bytes", warmed->fetched},
                                        {"not_kept_bytes", warmed->not_kept},
                                        {"failed", rep.failures.size()},
                                        {"cancelled", rep.cancelled}})
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "warmed %s, %s in %.2f s: %s fetched, %s already cached%s%s%s\n",
        count_of(rep.objects, "object").c_str(),
        format_size(static_cast<double>(rep.bytes)).c_str(), rep.seconds,
        format_size(static_cast<double>(warmed->fetched)).c_str(),
        format_size(static_cast<double>(warmed->already_cached())).c_str(),
        warmed->not_kept == 0
            ? ""
            : (", " + format_size(static_cast<double>(warmed->not_kept)) + " NOT KEPT").c_str(),
        rep.failures.empty() ? ""
                             : (", " + std::to_string(rep.failures.size()) + " FAILED").c_str(),
        rep.cancelled ? ", INTERRUPTED" : "");
  }
  // A warm that could not keep what it fetched did not do its job: said, and not exit 0.
  if (warmed->not_kept > 0)
    std::fprintf(
        stderr,
        "sluice: error: cache warm: %s of it could not be kept (the object changed, or the cache "
        "is too small, its disk full, its chunks pinned, the team over quota); reads of "
        "it will fetch again\n",
        format_size(static_cast<double>(warmed->not_kept)).c_str());
  if (rep.cancelled) return cancel.exit_code();
  return rep.failures.empty() && warmed->not_kept == 0 ? 0 : 1;
}

// "A-B" (inclusive, as HTTP and curl -r), "A-" (to the end), or "-N" (the last N bytes).
Result<std::pair<uint64_t, std::optional<uint64_t>>> parse_range(const std::string& r,
                                                                 uint64_t size) {
  size_t dash = r.find('-');
  auto bad = [&](const std::string& why) {
    return fail(Code::kInvalidArgument, "--range '" + r + "': " + why);
  };
  if (dash == std::string::npos) return bad("expected A-B, A- or -N");
  std::string a = r.substr(0, dash), b = r.substr(dash + 1);
  if (a.empty()) {
    auto n = parse_size(b);
    if (!n) return bad(n.error().message());
    return std::pair{size - std::min(size, *n), std::optional<uint64_t>(size)};
  }
  auto from = parse_size(a);
  if (!from) return bad(from.error().message());
  if (*from >= size)  // as HTTP's 416: a range that starts past the end is no range
    return bad("starts at byte " + std::to_string(*from) + ", past the end of the object (" +
               std::to_string(size) + " bytes)");
  if (b.empty()) return std::pair{*from, std::optional<uint64_t>()};
  auto to = parse_size(b);
  if (!to) return bad(to.error().message());
  if (*to < *from) return bad("the end is before the start");
  return std::pair{*from, std::optional<uint64_t>(*to + 1)};
}

int cmd_cat(const CacheArgs& a) {
  auto loc = parse_location(a.target);
  if (!loc) return report_error(loc.error());
  if (a.target.ends_with('/'))
    return report_error(
        Error(Code::kInvalidArgument, "'" + a.target +
                                          "' names a prefix, not an object: cat writes one object "
                                          "(sluice cp --recursive copies a prefix)"));
  auto session = open_session(a.aws, {}, a.cache);
  if (!session) return report_error(session.error());
  auto obj = client::open_object(*session, a.target, {.through_cache = a.use_cache});
  if (!obj) return report_error(obj.error());
  store::Store* src = obj->store.get();
  const std::string& key = obj->key;
  auto info = src->stat(key);
  if (!info) return report_error(info.error());
  uint64_t from = 0, to = info->size;
  if (!a.range.empty()) {
    auto r = parse_range(a.range, info->size);
    if (!r) return report_error(r.error());
    from = r->first;
    to = std::min(info->size, r->second.value_or(info->size));
  }
  client::ReadRangeOptions ro;
  ro.offset = from;
  ro.end = to;
  auto written =
      client::read_range(*src, key, *info, ro, [](std::span<const std::byte> b) -> Status {
        if (std::fwrite(b.data(), 1, b.size(), stdout) != b.size())
          return fail_errno(errno, "write to stdout");
        return ok();
      });
  if (!written) return report_error(written.error().with_context(a.target));
  if (std::fflush(stdout) != 0) return report_error(error_from_errno(errno, "write to stdout"));
  return 0;
}

}  // namespace

void add_cache_commands(CLI::App& app, const CommandContext& ctx) {
  static CacheArgs a;  // CLI11 binds to it; one command runs per process
  const CancelHook cancel = ctx.cancel;
  int& rc = *ctx.rc;
  auto* cat = app.add_subcommand("cat",
                                 "Write an object (or --range of it) to stdout; through the cache "
                                 "for cache+ URIs or with --cache");
  cat->add_option(
         "URI", a.target,
         "s3://bucket/key, a local path, mem://name/key; cache+ in front reads through the cache")
      ->required();
  cat->add_option("--range", a.range, "Bytes A-B (inclusive, like curl -r), A- or -N (the last N)");
  cat->add_flag("--cache", a.use_cache, "Read through the tiered cache");
  cat->add_option("--endpoint-url", a.aws.endpoint_url,
                  "S3 endpoint (else AWS_ENDPOINT_URL, ~/.aws/config)");
  cat->add_option("--profile", a.aws.profile, "Profile in ~/.aws/credentials and ~/.aws/config");
  cat->add_option("--region", a.aws.region, "Region (else AWS_REGION, the profile, us-east-1)");
  add_cache_flags(cat, a.cache, client::Profile::kCommand);
  cat->callback([&] { rc = cmd_cat(a); });

  auto* cache = app.add_subcommand(
      "cache",
      "Look after the node's cache: through sluiced when it answers on --daemon, else the "
      "cache directory itself (the embedded cache)");
  cache->require_subcommand(1);
  auto with_common = [&](CLI::App* c, bool source) {
    add_cache_flags(c, a.cache, client::Profile::kCommand);
    c->add_flag("--json", a.json, "Print the result as JSON");
    if (source) {
      c->add_option("--endpoint-url", a.aws.endpoint_url,
                    "S3 endpoint (else AWS_ENDPOINT_URL, ~/.aws/config)");
      c->add_option("--profile", a.aws.profile, "Profile in ~/.aws/credentials and ~/.aws/config");
      c->add_option("--region", a.aws.region, "Region (else AWS_REGION, the profile, us-east-1)");
    }
    return c;
  };
  with_common(
      cache->add_subcommand("stat", "Tier sizes and what each source store has in the cache"),
      false)
      ->callback([&] { rc = cmd_stat(a); });
  auto* ls = with_common(
      cache->add_subcommand("ls", "List cached chunks (of every store, or under a URI prefix)"),
      true);
  ls->add_option("PREFIX", a.target, "URI prefix: s3://bucket/data/, /local/dir/");
  ls->callback([&] { rc = cmd_ls(a); });
  auto* warm = with_common(
      cache->add_subcommand("warm",
                            "Read objects into the cache ahead of use, in parallel, with progress"),
      true);
  warm->add_option("PREFIX", a.target, "URI prefix to warm: every object under it");
  warm->add_option("--list", a.list_file, "File of URIs to warm, one per line (all in one store)");
  warm->add_option("-j,--jobs", a.jobs, "Objects read at once")
      ->default_val(16)
      ->check(CLI::Range(1u, 1024u));
  warm->add_flag("--no-progress", a.no_progress, "No progress bar, even on a terminal");
  warm->callback([&, cancel] { rc = cmd_warm(a, cancel); });
  for (const char* verb : {"evict", "pin", "unpin"}) {
    const char* what = std::string(verb) == "evict" ? "Drop every cached chunk under a URI prefix"
                       : std::string(verb) == "pin"
                           ? "Keep every chunk under a URI prefix (now and later) from eviction"
                           : "Undo pin";
    auto* c = with_common(cache->add_subcommand(verb, what), true);
    c->add_option("PREFIX", a.target, "URI prefix: s3://bucket/data/, /local/dir/")->required();
    c->callback([&, v = std::string(verb)] { rc = cmd_prefix(a, v); });
  }
  with_common(cache->add_subcommand(
                  "peers", "The running sluiced's peer daemons: membership, state, bytes fetched"),
              false)
      ->callback([&] { rc = cmd_peers(a); });
  with_common(cache->add_subcommand(
                  "verify", "Re-read every NVMe chunk and check its checksum; drop corrupt ones"),
              false)
      ->callback([&] { rc = cmd_verify(a); });
}

}  // namespace sluice::cli
