#include "cache_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "common.h"
#include "cp.h"
#include "sluice/cache/read_ahead.h"
#include "sluice/client/location.h"
#include "sluice/core/sizes.h"
#include "sluice/mem/buffer_pool.h"
#include "sluice/node/client.h"
#include "sluice/s3/store.h"
#include "sluice/store/wrapper.h"
#include "sluice/xfer/copy.h"

namespace sluice::cli {

using client::Location;
using client::parse_location;
namespace fs = std::filesystem;

namespace {

// A backing store for commands that only look after the cache directory (stat, verify,
// ls): every call says there is none.
class NoBackingStore final : public store::Store {
 public:
  Result<store::ObjectInfo> stat(std::string_view key) override { return none(key); }
  Result<size_t> read(std::string_view key, uint64_t, std::span<std::byte>,
                      const store::ReadOptions&) override {
    return none(key);
  }
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions&) override {
    return none(key);
  }
  Result<store::ListPage> list(const store::ListOptions& o) override { return none(o.prefix); }
  Status remove(std::string_view key) override { return none(key); }
  std::string uri() const override { return "none://"; }

 private:
  static std::unexpected<Error> none(std::string_view key) {
    return fail(Code::kUnavailable,
                "'" + std::string(key) + "': this command opened the cache without its source");
  }
};

struct Target {
  std::unique_ptr<cache::TieredCache> cache;
  std::string key;  // key or prefix in the cache's backing store
};

// Opens the store `text` names (a URI, or a local path, cache+ or not) behind the cache.
// Local files are named from the root (file:///, key = absolute path), as cp --cache does.
struct Named {
  std::string store_uri, key;
};
Result<Named> name_in_store(const std::string& text) {
  SLUICE_ASSIGN_OR_RETURN(Location loc, parse_location(text));
  Named n{loc.store_uri, loc.path};
  if (loc.local) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(loc.path, ec);
    if (ec) return fail_errno(ec.value(), "resolve " + loc.path);
    n.store_uri = "file:///";
    n.key = p.string().substr(1);
    if (loc.path.ends_with('/') && !n.key.empty() && !n.key.ends_with('/')) n.key += '/';
  }
  return n;
}

Result<Target> open_target(const std::string& text, const CacheArgs& a) {
  SLUICE_ASSIGN_OR_RETURN(Named n, name_in_store(text));
  std::string key = n.key;
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws, {}, a.cache));
  SLUICE_ASSIGN_OR_RETURN(auto backing, session.open_store(n.store_uri));
  SLUICE_ASSIGN_OR_RETURN(auto c,
                          cache::TieredCache::open(std::move(backing), session.cache_options()));
  return Target{std::move(c), key};
}

Result<std::unique_ptr<cache::TieredCache>> open_directory_only(const CacheArgs& a,
                                                                const std::string& home) {
  SLUICE_ASSIGN_OR_RETURN(cache::CacheOptions co, cache_options(a.cache, home));
  co.ram_bytes = 0;
  // Looking must not evict: a directory filled under a larger --cache-size keeps it all.
  co.disk_bytes = std::numeric_limits<uint64_t>::max() / 2;
  co.store_id = "none://";
  return cache::TieredCache::open(std::make_unique<NoBackingStore>(), co);
}

std::string tiers(const cache::CachedChunk& c) {
  return std::string(c.in_ram ? "ram" : "") + (c.in_ram && c.on_disk ? "+" : "") +
         (c.on_disk ? "nvme" : "");
}

// The running daemon the cache commands should talk to: null when none answers on the
// default socket (the commands then act on the directory); an error when --daemon names a
// socket where none answers, or when it refuses this caller.
Result<std::unique_ptr<node::NodeClient>> running_daemon(const CacheArgs& a,
                                                         const std::string& home) {
  if (a.cache.daemon == "none") return std::unique_ptr<node::NodeClient>();
  std::string socket = daemon_socket(a.cache, home);
  auto client = node::NodeClient::connect(socket, std::chrono::seconds(10));
  if (!client && client.error().code() == Code::kUnavailable && a.cache.daemon.empty())
    return std::unique_ptr<node::NodeClient>();
  return client;
}

// A reply's JSON body as an object; Corruption when the daemon sent something else.
Result<nlohmann::json> reply_json(const Result<std::string>& body) {
  if (!body) return std::unexpected(body.error());
  nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kCorruption, "sluiced sent a reply that is not a JSON object");
  return j;
}

// `cache stat` of a running daemon: its tiers, hits and misses, and what its server did.
// false: no daemon answers (the caller looks at the directory instead).
bool daemon_stat(const CacheArgs& a, const std::string& home, int& rc) {
  if (a.cache.daemon == "none") return false;
  std::string socket = daemon_socket(a.cache, home);
  auto client = node::NodeClient::connect(socket, std::chrono::seconds(10));
  if (!client) {
    if (client.error().code() == Code::kUnavailable && a.cache.daemon.empty()) return false;
    rc = report_error(client.error());
    return true;
  }
  auto body = (*client)->cache_stat();
  if (!body) {
    rc = report_error(body.error());
    return true;
  }
  nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    rc = report_error(Error(Code::kCorruption, "sluiced sent a stat reply that is not JSON"));
    return true;
  }
  j["daemon"] = {
      {"socket", socket}, {"pid", (*client)->daemon().pid}, {"team", (*client)->daemon().team}};
  rc = 0;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return true;
  }
  auto n = [&](const nlohmann::json& v) { return v.is_number() ? v.get<double>() : 0.0; };
  std::printf("sluiced pid %.0f on %s: cache %s (policy %s, %s)\n", n(j["daemon"]["pid"]),
              socket.c_str(), j.value("directory", "").c_str(), j.value("policy", "").c_str(),
              j.value("io_path", "").c_str());
  for (const char* tier : {"ram", "disk"}) {
    nlohmann::json& t = j[tier];
    std::printf("%s tier: %s of %s in %.0f chunks; %.0f hits (%s)\n",
                std::string_view(tier) == "ram" ? "RAM" : "NVMe",
                format_size(n(t["bytes"])).c_str(), format_size(n(t["capacity"])).c_str(),
                n(t["chunks"]), n(t["hits"]), format_size(n(t["hit_bytes"])).c_str());
  }
  nlohmann::json& sv = j["server"];  // not const: a field an older daemon lacks reads as null
  std::printf(
      "misses: %.0f chunks (%s from the sources); hand-offs: %.0f chunks (%s), inline %s (%s "
      "through reply windows)\n",
      n(j["misses"]), format_size(n(j["miss_bytes"])).c_str(), n(sv["handoff_chunks"]),
      format_size(n(sv["handoff_bytes"])).c_str(), format_size(n(sv["inline_bytes"])).c_str(),
      format_size(n(sv["window_bytes"])).c_str());
  std::printf("connections: %.0f served, %.0f refused; requests: %.0f, %.0f failed\n",
              n(sv["connections"]), n(sv["connections_refused"]), n(sv["requests"]),
              n(sv["request_errors"]));
  if (const nlohmann::json& c = j["charging"]; c.is_object()) {
    std::printf("charged to teams (%s): %s kept, %s freed; %.0f chunks not kept (quota)\n",
                c.value("ledger", "").c_str(), format_size(n(c["admitted_bytes"])).c_str(),
                format_size(n(c["freed_bytes"])).c_str(), n(c["refused_chunks"]));
  }
  return true;
}

// `cache peers`: the membership of the running daemon and each peer's state.
int cmd_peers(const CacheArgs& a, const std::string& home) {
  std::string socket = daemon_socket(a.cache, home);
  auto client = running_daemon(a, home);
  if (!client) return report_error(client.error());
  if (!*client)
    return report_error(Error(Code::kUnavailable, "cache peers: no sluiced answers on " + socket));
  auto body = (*client)->cache_stat();
  if (!body) return report_error(body.error());
  nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("peers") || !j["peers"].is_array())
    return report_error(Error(Code::kCorruption, "sluiced sent a stat reply without peers"));
  if (a.json) {
    std::printf(
        "%s\n",
        nlohmann::json({{"peers", j["peers"]}, {"bytes_from", j["bytes_from"]}}).dump().c_str());
    return 0;
  }
  if (j["peers"].empty()) {
    std::printf("sluiced on %s has no peers (start it with --peers)\n", socket.c_str());
    return 0;
  }
  std::printf("%-20s %-22s %-5s %10s %12s %7s  %s\n", "NAME", "ADDRESS", "STATE", "CHUNKS",
              "FETCHED", "ERRORS", "LAST ERROR");
  for (const nlohmann::json& p : j["peers"]) {
    auto num = [&](const char* k) { return p.value(k, 0.0); };
    std::string state = p.value("self", false) ? "self" : p.value("up", false) ? "up" : "down";
    std::printf("%-20s %-22s %-5s %10.0f %12s %7.0f  %s\n", printable(p.value("name", "")).c_str(),
                printable(p.value("address", "")).c_str(), state.c_str(), num("fetched_chunks"),
                format_size(num("fetched_bytes")).c_str(), num("errors"),
                printable(p.value("last_error", "")).c_str());
  }
  return 0;
}

int cmd_stat(const CacheArgs& a, const std::string& home) {
  if (int rc = 0; daemon_stat(a, home, rc)) return rc;
  auto c = open_directory_only(a, home);
  if (!c) return report_error(c.error());
  cache::CacheStats s = (*c)->stats();
  struct PerStore {
    uint64_t chunks = 0, bytes = 0, pinned = 0, objects = 0;
    std::string last_key;
  };
  std::map<std::string, PerStore> stores;
  for (const cache::CachedChunk& ch : (*c)->chunks("", true)) {
    PerStore& p = stores[ch.store];
    ++p.chunks;
    p.bytes += ch.length;
    p.pinned += ch.pinned;
    if (ch.key != p.last_key) ++p.objects, p.last_key = ch.key;
  }
  if (a.json) {
    nlohmann::json j = {
        {"directory", s.directory},
        {"policy", s.policy},
        {"io_path", s.io_path},
        {"nvme",
         {{"bytes", s.disk.bytes}, {"capacity", s.disk.capacity}, {"chunks", s.disk.chunks}}}};
    j["stores"] = nlohmann::json::array();
    for (const auto& [name, p] : stores) {
      j["stores"].push_back({{"store", name},
                             {"objects", p.objects},
                             {"chunks", p.chunks},
                             {"bytes", p.bytes},
                             {"pinned_chunks", p.pinned}});
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("cache %s (policy %s, %s)\n", s.directory.c_str(), s.policy.c_str(),
              s.io_path.c_str());
  std::printf("NVMe tier: %s of %s in %lu chunks\n",
              format_size(static_cast<double>(s.disk.bytes)).c_str(),
              format_size(static_cast<double>(s.disk.capacity)).c_str(),
              static_cast<unsigned long>(s.disk.chunks));
  for (const auto& [name, p] : stores) {
    std::printf("  %-40s %6lu objects %8lu chunks %12s%s\n", name.c_str(),
                static_cast<unsigned long>(p.objects), static_cast<unsigned long>(p.chunks),
                format_size(static_cast<double>(p.bytes)).c_str(),
                p.pinned ? (" (" + std::to_string(p.pinned) + " pinned)").c_str() : "");
  }
  if (stores.empty()) std::printf("  (empty)\n");
  return 0;
}

// `cache ls` of a running daemon: the chunks of the roots this caller's team may read.
int daemon_ls(const CacheArgs& a, node::NodeClient& d) {
  Named n;
  if (!a.target.empty()) {
    auto named = name_in_store(a.target);
    if (!named) return report_error(named.error());
    n = *named;
  }
  auto j = reply_json(d.chunks(n.store_uri, n.key));
  if (!j) return report_error(j.error());
  const nlohmann::json& chunks = (*j)["chunks"];
  if (!chunks.is_array()) return report_error(Error(Code::kCorruption, "sluiced: no chunk list"));
  nlohmann::json out = nlohmann::json::array();
  for (const nlohmann::json& c : chunks) {
    std::string where = std::string(c.value("in_ram", false) ? "ram" : "") +
                        (c.value("in_ram", false) && c.value("on_disk", false) ? "+" : "") +
                        (c.value("on_disk", false) ? "nvme" : "");
    std::string root = c.value("root", ""), key = c.value("key", "");
    if (a.json) {
      out.push_back({{"store", root},
                     {"key", key},
                     {"etag", c.value("etag", "")},
                     {"chunk", c.value("index", 0)},
                     {"bytes", c.value("length", 0)},
                     {"tiers", where},
                     {"pinned", c.value("pinned", false)}});
    } else {
      // "file:///" + "/" + "tmp/x" would print four slashes.
      const char* sep = root.ends_with('/') ? "" : "/";
      std::printf("%-5s %10lu %s%s%s chunk %lu%s\n", where.c_str(),
                  static_cast<unsigned long>(c.value("length", 0ul)), printable(root).c_str(), sep,
                  printable(key).c_str(), static_cast<unsigned long>(c.value("index", 0ul)),
                  c.value("pinned", false) ? " pinned" : "");
    }
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  if (j->value("truncated", false))
    std::fprintf(stderr, "sluice: cache ls: the daemon sent the first %zu chunks only\n",
                 chunks.size());
  return 0;
}

int cmd_ls(const CacheArgs& a, const std::string& home) {
  auto d = running_daemon(a, home);
  if (!d) return report_error(d.error());
  if (*d) return daemon_ls(a, **d);
  std::vector<cache::CachedChunk> chunks;
  if (a.target.empty()) {
    auto c = open_directory_only(a, home);
    if (!c) return report_error(c.error());
    chunks = (*c)->chunks("", true);
  } else {
    auto t = open_target(a.target, a);
    if (!t) return report_error(t.error());
    chunks = t->cache->chunks(t->key);
  }
  nlohmann::json j = nlohmann::json::array();
  for (const cache::CachedChunk& c : chunks) {
    if (a.json) {
      j.push_back({{"store", c.store},
                   {"key", c.key},
                   {"etag", c.etag},
                   {"chunk", c.index},
                   {"bytes", c.length},
                   {"tiers", tiers(c)},
                   {"pinned", c.pinned}});
    } else {
      std::printf("%-5s %10lu %s%s chunk %lu%s\n", tiers(c).c_str(),
                  static_cast<unsigned long>(c.length), c.store.c_str(), printable(c.key).c_str(),
                  static_cast<unsigned long>(c.index), c.pinned ? " pinned" : "");
    }
  }
  if (a.json) std::printf("%s\n", j.dump().c_str());
  return 0;
}

int cmd_verify(const CacheArgs& a, const std::string& home) {
  auto d = running_daemon(a, home);
  if (!d) return report_error(d.error());
  if (*d)
    return report_error(Error(Code::kUnavailable,
                              "cache verify: sluiced (pid " + std::to_string((*d)->daemon().pid) +
                                  ") owns " + (*d)->daemon().directory +
                                  " and checks every chunk it reads from NVMe; stop it to "
                                  "re-check the whole directory"));
  auto c = open_directory_only(a, home);
  if (!c) return report_error(c.error());
  auto rep = (*c)->verify();
  if (!rep) return report_error(rep.error());
  if (a.json) {
    std::printf(
        "%s\n",
        nlohmann::json({{"chunks", rep->chunks}, {"bytes", rep->bytes}, {"corrupt", rep->corrupt}})
            .dump()
            .c_str());
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
int cmd_prefix(const CacheArgs& a, const std::string& home, const std::string& verb) {
  auto d = running_daemon(a, home);
  if (!d) return report_error(d.error());
  Result<uint64_t> n = uint64_t{0};
  if (*d) {
    auto named = name_in_store(a.target);
    if (!named) return report_error(named.error());
    n = verb == "evict" ? (*d)->evict(named->store_uri, named->key)
                        : (*d)->pin(named->store_uri, named->key, verb == "pin");
  } else {
    auto t = open_target(a.target, a);
    if (!t) return report_error(t.error());
    n = verb == "evict" ? t->cache->evict(t->key) : t->cache->pin(t->key, verb == "pin");
  }
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

// The keys `warm --list FILE` names: one URI or path per line, all in one store.
Result<std::vector<xfer::CopyItem>> list_file_items(const std::string& file,
                                                    const std::string& store_uri,
                                                    const std::string& first_text) {
  std::ifstream in(file);
  if (!in) return fail_errno(errno, "open " + file);
  std::vector<xfer::CopyItem> items;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    auto where = [&] { return file + " line " + std::to_string(n); };
    auto loc = parse_location(line);
    if (!loc) return std::unexpected(loc.error().with_context(where()));
    std::string uri = loc->local ? "file:///" : loc->store_uri;
    std::string key = loc->path;
    if (loc->local) {
      std::error_code ec;  // a path the file system refuses is this line's error, not a throw
      fs::path p = fs::weakly_canonical(loc->path, ec);
      if (ec) return fail_errno(ec.value(), where() + ": resolve '" + loc->path + "'");
      key = p.string().substr(1);
    }
    if (uri != store_uri && !(loc->local && store_uri == "file:///")) {
      return fail(Code::kInvalidArgument, file + " line " + std::to_string(n) + ": '" + line +
                                              "' is not in the same store as '" + first_text + "'");
    }
    items.push_back(xfer::CopyItem{key, key, std::nullopt});
  }
  return items;
}

// A cache (the daemon's, or the embedded one) as a copy source whose reads make their range
// resident and carry no byte back (TieredCache::warm, NodeClient::warm): copied into the
// discard store, it warms with copy_all's parts, jobs, progress and cancellation. What a
// read leaves in its buffer is not the object's bytes; nothing but the discard store may
// receive them. Counts what the warms fetched and what the cache could not keep.
class WarmingSource final : public store::StoreWrapper {
 public:
  struct Warmed {
    uint64_t size = 0, fetched = 0, not_kept = 0;
    std::string etag;
  };
  using WarmFn =
      std::function<Result<Warmed>(const std::string& key, uint64_t offset, uint64_t length)>;
  WarmingSource(std::shared_ptr<store::Store> lister, WarmFn warm)
      : StoreWrapper(std::move(lister)), warm_(std::move(warm)) {}
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(Warmed w, warm_(std::string(key), offset, dst.size()));
    fetched.fetch_add(w.fetched, std::memory_order_relaxed);
    not_kept.fetch_add(w.not_kept, std::memory_order_relaxed);
    if (!options.if_match.empty() && w.etag != options.if_match)
      return fail(Code::kConflict, "'" + std::string(key) + "' changed during the warm");
    return offset >= w.size ? size_t{0}
                            : static_cast<size_t>(std::min<uint64_t>(dst.size(), w.size - offset));
  }
  std::atomic<uint64_t> fetched{0}, not_kept{0};  // relaxed: read once the copy is over

 private:
  WarmFn warm_;
};

int cmd_warm(const CacheArgs& a, const std::string& home, const CancelHook& cancel) {
  std::string first = a.target;
  if (first.empty() && !a.list_file.empty()) {
    std::ifstream in(a.list_file);
    while (std::getline(in, first) && (first.empty() || first[0] == '#')) {
    }
  }
  if (first.empty()) {
    return report_error(
        Error(Code::kInvalidArgument, "warm: give a URI prefix, or --list FILE of URIs"));
  }
  // Through the running daemon (its cache fills), else the embedded cache.
  auto d = running_daemon(a, home);
  if (!d) return report_error(d.error());
  std::optional<Target> t;
  std::unique_ptr<WarmingSource> src;
  std::string key;
  if (*d) {
    auto named = name_in_store(first);
    if (!named) return report_error(named.error());
    node::NodeOptions no;
    no.socket = daemon_socket(a.cache, home);
    no.fallback = false;
    auto ns = node::NodeStore::open(named->store_uri, no);
    if (!ns) return report_error(ns.error());
    std::shared_ptr<node::NodeStore> node = std::move(*ns);
    src = std::make_unique<WarmingSource>(
        node,
        [node, root = named->store_uri](const std::string& k, uint64_t off,
                                        uint64_t len) -> Result<WarmingSource::Warmed> {
          SLUICE_ASSIGN_OR_RETURN(node::NodeClient::Warmed w,
                                  node->client().warm(root, k, off, len));
          return WarmingSource::Warmed{w.size, w.fetched, w.not_kept, w.etag};
        });
    key = named->key;
  } else {
    auto opened = open_target(first, a);
    if (!opened) return report_error(opened.error());
    t = std::move(*opened);
    cache::TieredCache* cache = t->cache.get();
    // Not owned: `t` holds the cache past the copy.
    std::shared_ptr<store::Store> lister(cache, [](store::Store*) {});
    src = std::make_unique<WarmingSource>(
        lister,
        [cache](const std::string& k, uint64_t off, uint64_t len) -> Result<WarmingSource::Warmed> {
          SLUICE_ASSIGN_OR_RETURN(cache::TieredCache::Warmed w, cache->warm(k, off, len));
          return WarmingSource::Warmed{w.info.size, w.fetched, w.not_kept, w.info.etag};
        });
    key = t->key;
  }
  std::vector<xfer::CopyItem> items;
  if (!a.list_file.empty()) {
    auto loc = parse_location(first);
    std::string uri = loc && !loc->local ? loc->store_uri : "file:///";
    auto li = list_file_items(a.list_file, uri, first);
    if (!li) return report_error(li.error());
    items = std::move(*li);
  } else {
    auto plan = xfer::plan_prefix(*src, key, key);
    if (!plan) return report_error(plan.error());
    items = std::move(plan->items);
    if (items.empty() && plan->rejected.empty()) {  // a typo must not look like a warm cache
      return report_error(Error(Code::kNotFound, "cache warm: nothing under '" + a.target + "'"));
    }
    for (const xfer::CopyFailure& f : plan->rejected) {
      std::fprintf(stderr, "sluice: cache warm: skipped '%s': %s\n", f.src_key.c_str(),
                   f.error.message().c_str());
    }
  }
  auto discard = store::make_discard_store();
  xfer::CopyOptions co;
  co.jobs = a.jobs;
  co.cancel = cancel.flag;
  if (cancel.install) cancel.install();
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  bool progress = !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  if (progress)
    co.on_progress = [&](const xfer::CopyProgress& p) { draw_progress(p, elapsed(), false); };
  xfer::CopyReport rep = xfer::copy_all(*src, *discard, items, co);
  if (progress) std::fputc('\n', stderr);
  for (const xfer::CopyFailure& f : rep.failures) {
    std::fprintf(stderr, "sluice: cache warm %s: %s\n", f.src_key.c_str(),
                 f.error.to_string().c_str());
  }
  const uint64_t fetched = src->fetched.load(std::memory_order_relaxed);
  const uint64_t not_kept = src->not_kept.load(std::memory_order_relaxed);
  uint64_t hit = rep.bytes > fetched ? rep.bytes - fetched : 0;
  if (a.json) {
    std::printf("%s\n", nlohmann::json({{"objects", rep.objects},
                                        {"bytes", rep.bytes},
                                        {"seconds", rep.seconds},
                                        {"already_cached_bytes", hit},
                                        {"fetched_bytes", fetched},
                                        {"not_kept_bytes", not_kept},
                                        {"failed", rep.failures.size()},
                                        {"cancelled", rep.cancelled}})
                            .dump()
                            .c_str());
  } else {
    std::printf("warmed %lu objects, %s in %.2f s: %s fetched, %s already cached%s%s\n",
                static_cast<unsigned long>(rep.objects),
                format_size(static_cast<double>(rep.bytes)).c_str(), rep.seconds,
                format_size(static_cast<double>(fetched)).c_str(),
                format_size(static_cast<double>(hit)).c_str(),
                rep.failures.empty()
                    ? ""
                    : (", " + std::to_string(rep.failures.size()) + " FAILED").c_str(),
                rep.cancelled ? ", INTERRUPTED" : "");
  }
  // A warm that could not keep what it fetched did not do its job: said, and not exit 0.
  if (not_kept > 0)
    std::fprintf(stderr,
                 "sluice: cache warm: %s of it could not be kept (the object changed, or the cache "
                 "is too small, its disk full, its chunks pinned, the team over quota); reads of "
                 "it will fetch again\n",
                 format_size(static_cast<double>(not_kept)).c_str());
  if (rep.cancelled) return cancel.exit_code();
  return rep.failures.empty() && not_kept == 0 ? 0 : 1;
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
  if (b.empty()) return std::pair{*from, std::optional<uint64_t>()};
  auto to = parse_size(b);
  if (!to) return bad(to.error().message());
  if (*to < *from) return bad("the end is before the start");
  return std::pair{*from, std::optional<uint64_t>(*to + 1)};
}

int cmd_cat(const CacheArgs& a) {
  auto loc = parse_location(a.target);
  if (!loc) return report_error(loc.error());
  std::unique_ptr<store::Store> plain;
  store::Store* src = nullptr;
  std::string key;
  auto session = open_session(a.aws, {}, a.cache);
  if (!session) return report_error(session.error());
  if (loc->cached || a.use_cache) {
    auto n = name_in_store(a.target);
    if (!n) return report_error(n.error());
    auto s = session->open_cached(n->store_uri);
    if (!s) return report_error(s.error());
    plain = std::move(*s);
    key = n->key;
    src = plain.get();
  } else {
    std::string uri = loc->local ? "file://" + (fs::path(loc->path).has_parent_path()
                                                    ? fs::path(loc->path).parent_path().string()
                                                    : std::string("."))
                                 : loc->store_uri;
    key = loc->local ? fs::path(loc->path).filename().string() : loc->path;
    auto s = session->open_store(uri);
    if (!s) return report_error(s.error());
    plain = std::move(*s);
    src = plain.get();
  }
  auto info = src->stat(key);
  if (!info) return report_error(info.error());
  uint64_t from = 0, to = info->size;
  if (!a.range.empty()) {
    auto r = parse_range(a.range, info->size);
    if (!r) return report_error(r.error());
    from = r->first;
    to = std::min(info->size, r->second.value_or(info->size));
  }
  // Through a cache, the whole range is declared first: the cache (or sluiced) fetches
  // ahead of the reads. Windows of 32 MiB (eight chunks a request), kDepth read at once
  // (each request on its own connection to sluiced) while the one before is written, so the
  // device and the daemon stay busy between requests. Aligned for O_DIRECT: handed-off
  // chunks are read straight into them, not through a bounce buffer and a copy (which cost
  // a quarter of cat's time on a RAM-backed device).
  if (auto* ahead = dynamic_cast<cache::ReadAhead*>(src); ahead && from < to) {
    // At most what one declaration may name (256 GiB at 4 MiB chunks): the rest is read
    // without prefetch.
    // (kMax - 1) chunks of bytes touch at most kMax chunks wherever they start.
    const uint64_t most =
        (cache::kMaxDeclaredChunks - 1) * std::max<uint64_t>(ahead->chunk_size(), 1);
    cache::PlannedRead whole{key, from, std::min(to - from, most)};
    (void)ahead->declare(std::span(&whole, 1));  // advice only: a refusal costs prefetch
  }
  constexpr size_t kWindow = 32 << 20;
  constexpr size_t kDepth = 2;
  const size_t window = static_cast<size_t>(std::min<uint64_t>(kWindow, to - from));
  AlignedBuffer bufs[kDepth + 1];
  store::ReadOptions ro;
  ro.if_match = info->etag;  // one version from the first byte to the last
  ro.object_size = info->size;
  // A --range that starts off a 4 KiB boundary reads up to the next one first, so every
  // later window starts aligned and its whole chunks land on aligned addresses.
  auto window_at = [&](uint64_t at) {
    uint64_t len = std::min<uint64_t>(window, to - at);
    if (at % kDirectAlignment != 0)
      len = std::min<uint64_t>(len, kDirectAlignment - at % kDirectAlignment);
    return len;
  };
  auto read_window = [&](uint64_t at, AlignedBuffer& buf) -> Result<size_t> {
    if (!buf) {
      SLUICE_ASSIGN_OR_RETURN(buf, AlignedBuffer::allocate(std::max<size_t>(window, 1)));
    }
    return src->read_full(key, at, std::span(buf.data(), window_at(at)), ro);
  };
  struct Pending {
    std::future<Result<size_t>> read;
    size_t buf = 0;
    uint64_t at = 0, len = 0;
  };
  // The buffers go round: the kDepth reads in flight and the window being written always
  // hold kDepth + 1 different ones.
  std::deque<Pending> pending;
  uint64_t next_at = from;
  size_t next_buf = 0;
  auto launch = [&] {
    Pending p{{}, next_buf, next_at, window_at(next_at)};
    // The first runs on this thread when it is waited for; the others on their own.
    auto policy = pending.empty() ? std::launch::deferred : std::launch::async;
    try {
      p.read = std::async(policy, read_window, p.at, std::ref(bufs[p.buf]));
    } catch (const std::system_error&) {  // no thread to be had: read it when waited for
      p.read = std::async(std::launch::deferred, read_window, p.at, std::ref(bufs[p.buf]));
    }
    next_at += p.len;
    next_buf = (next_buf + 1) % (kDepth + 1);
    pending.push_back(std::move(p));
  };
  auto fill_pipe = [&] {
    while (pending.size() < kDepth && next_at < to) launch();
  };
  // Reads write into bufs: every one started is waited for before they go away.
  auto fail_with = [&](const Error& e) {
    for (Pending& p : pending) {
      // A deferred read has not started (and would run now if waited for).
      if (p.read.wait_for(std::chrono::seconds(0)) != std::future_status::deferred) p.read.wait();
    }
    return report_error(e);
  };
  fill_pipe();
  while (!pending.empty()) {
    Pending p = std::move(pending.front());
    pending.pop_front();
    Result<size_t> n = p.read.get();
    if (!n) return fail_with(n.error());
    if (*n != p.len)
      return fail_with(
          Error(Code::kCorruption, "'" + a.target + "' ended at byte " + std::to_string(p.at + *n) +
                                       ", before its size " + std::to_string(info->size)));
    fill_pipe();
    if (std::fwrite(bufs[p.buf].data(), 1, *n, stdout) != *n)
      return fail_with(error_from_errno(errno, "write to stdout"));
  }
  if (std::fflush(stdout) != 0) return report_error(error_from_errno(errno, "write to stdout"));
  return 0;
}

}  // namespace

void add_cache_commands(CLI::App& app, CacheArgs& a, std::string home, CancelHook cancel, int& rc) {
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
  add_cache_flags(cat, a.cache);
  cat->callback([&, home] { rc = cmd_cat(a); });

  auto* cache = app.add_subcommand(
      "cache",
      "Look after the node's cache: through sluiced when it answers on --daemon, else the "
      "cache directory itself (the embedded cache)");
  cache->require_subcommand(1);
  auto with_common = [&](CLI::App* c, bool source) {
    add_cache_flags(c, a.cache);
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
      ->callback([&, home] { rc = cmd_stat(a, home); });
  auto* ls = with_common(
      cache->add_subcommand("ls", "List cached chunks (of every store, or under a URI prefix)"),
      true);
  ls->add_option("PREFIX", a.target, "URI prefix: s3://bucket/data/, /local/dir/");
  ls->callback([&, home] { rc = cmd_ls(a, home); });
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
  warm->callback([&, home, cancel] { rc = cmd_warm(a, home, cancel); });
  for (const char* verb : {"evict", "pin", "unpin"}) {
    const char* what = std::string(verb) == "evict" ? "Drop every cached chunk under a URI prefix"
                       : std::string(verb) == "pin"
                           ? "Keep every chunk under a URI prefix (now and later) from eviction"
                           : "Undo pin";
    auto* c = with_common(cache->add_subcommand(verb, what), true);
    c->add_option("PREFIX", a.target, "URI prefix: s3://bucket/data/, /local/dir/")->required();
    c->callback([&, home, v = std::string(verb)] { rc = cmd_prefix(a, home, v); });
  }
  with_common(cache->add_subcommand(
                  "peers", "The running sluiced's peer daemons: membership, state, bytes fetched"),
              false)
      ->callback([&, home] { rc = cmd_peers(a, home); });
  with_common(cache->add_subcommand(
                  "verify", "Re-read every NVMe chunk and check its checksum; drop corrupt ones"),
              false)
      ->callback([&, home] { rc = cmd_verify(a, home); });
}

}  // namespace sluice::cli
