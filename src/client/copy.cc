// `sluice cp` as a call (sluice/client/copy.h).
#include "sluice/client/copy.h"

#include <sys/stat.h>

#include <filesystem>

#include "sluice/cache/read_ahead.h"
#include "sluice/client/location.h"
#include "sluice/node/client.h"
#include "sluice/telemetry/registry.h"

namespace sluice::client {

namespace fs = std::filesystem;

namespace {

// A store and the key (one object) or prefix (recursive) within it.
struct Side {
  std::string store_uri;
  std::string key;
};

std::string as_prefix(std::string p) {
  if (!p.empty() && !p.ends_with('/')) p += '/';
  return p;
}

std::string parent_or_dot(const fs::path& p) {
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

// The source of a one-object copy. A local source must be a regular file: a FIFO or a
// device would hang or never end.
Result<Side> source_object(const Location& l) {
  if (!l.local) {
    if (l.path.empty() || l.path.ends_with('/'))
      return fail(Code::kInvalidArgument,
                  "'" + l.text + "' names no object but a prefix: copy it recursively");
    return Side{l.store_uri, l.path};
  }
  struct stat st;
  if (::stat(l.path.c_str(), &st) != 0) return fail_errno(errno, "stat " + l.path);
  if (S_ISDIR(st.st_mode))
    return fail(Code::kInvalidArgument, "'" + l.path + "' is a directory: copy it recursively");
  if (!S_ISREG(st.st_mode))
    return fail(Code::kInvalidArgument,
                "'" + l.path + "' is not a regular file (a FIFO, device or socket is not copied)");
  // The user named this file: follow a symlink to wherever it points.
  std::error_code ec;
  fs::path real = fs::canonical(l.path, ec);
  if (ec) return fail_errno(ec.value(), "resolve " + l.path);
  return Side{"file://" + parent_or_dot(real), real.filename().string()};
}

// A local source read through the cache is named from the root (file:///, the key its
// absolute path), so every command names one file's chunks the same way.
Result<Side> cached_local(const Side& s) {
  SLUICE_ASSIGN_OR_RETURN(client::StoreKey k,
                          client::store_key(s.store_uri.substr(7) + "/" + s.key));
  return Side{k.store_uri, k.key};
}

// The destination of a one-object copy whose source object is called `name`.
Side destination_object(const Location& l, const std::string& name) {
  if (!l.local)
    return Side{l.store_uri, l.path.empty() || l.path.ends_with('/') ? l.path + name : l.path};
  std::error_code ec;
  if (l.path.ends_with('/') || fs::is_directory(l.path, ec)) return Side{"file://" + l.path, name};
  fs::path p(l.path);
  return Side{"file://" + parent_or_dot(p), p.filename().string()};
}

// The source or destination of a recursive copy.
Result<Side> prefix_side(const Location& l, bool source) {
  if (!l.local) return Side{l.store_uri, as_prefix(l.path)};
  std::error_code ec;
  if (source && !fs::is_directory(l.path, ec))
    return fail(Code::kNotFound, "'" + l.path + "' is not a directory");
  return Side{"file://" + l.path, ""};
}

std::string canonical_local(const std::string& store_uri, const std::string& key) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(store_uri.substr(7)) / key, ec);
  return ec ? store_uri + "/" + key : p.string();
}

// Copying an object onto itself (or a tree into itself) would destroy it.
Status refuse_overlap(const Side& src, const Side& dst, bool recursive) {
  bool local = src.store_uri.starts_with("file://") && dst.store_uri.starts_with("file://");
  std::string a = local ? canonical_local(src.store_uri, src.key) : src.store_uri + "/" + src.key;
  std::string b = local ? canonical_local(dst.store_uri, dst.key) : dst.store_uri + "/" + dst.key;
  if (!local && src.store_uri != dst.store_uri) return ok();
  if (a == b)
    return fail(Code::kInvalidArgument, "source and destination are the same: '" + a + "'");
  if (recursive && (b.starts_with(as_prefix(a)) || a.starts_with(as_prefix(b))))
    return fail(Code::kInvalidArgument,
                "source '" + a + "' and destination '" + b + "' overlap (one is inside the other)");
  return ok();
}

// What the copy did, with what the cache (or sluiced) served of it.
CopySummary summarize(const xfer::CopyReport& report, store::Store& src_store,
                      telemetry::Registry& registry) {
  CopySummary sum;
  sum.objects = report.objects;
  sum.bytes = report.bytes;
  sum.cancelled = report.cancelled;
  sum.seconds = report.seconds;
  sum.retries = registry.counter("sluice_s3_retries_total").value();
  if (auto* c = src_store.capability<cache::TieredCache>()) {
    cache::CacheStats cs = c->stats();
    sum.cached = true;
    sum.cache_hit_bytes = cs.ram.hit_bytes + cs.disk.hit_bytes;
    sum.cache_miss_bytes = cs.miss_bytes;
    sum.cache_not_kept = cs.disk_writes_skipped;
  } else if (auto* n = src_store.capability<node::NodeStore>()) {
    node::NodeReadStats ns = n->read_stats();
    sum.via_daemon = true;
    sum.handoff_bytes = ns.handoff_bytes;
    sum.inline_bytes = ns.inline_bytes;
  }
  const std::string& uri = src_store.uri();
  for (const xfer::CopyFailure& f : report.failures)
    sum.failures.push_back({uri + (uri.ends_with('/') ? "" : "/") + f.src_key, f.error});
  return sum;
}

}  // namespace

Result<CopySummary> copy(const Session& session, const CopyRequest& o) {
  SLUICE_ASSIGN_OR_RETURN(Location from, parse_location(o.src));
  SLUICE_ASSIGN_OR_RETURN(Location to, parse_location(o.dst));
  Side src, dst;
  if (o.recursive) {
    SLUICE_ASSIGN_OR_RETURN(src, prefix_side(from, true));
    SLUICE_ASSIGN_OR_RETURN(dst, prefix_side(to, false));
  } else {
    SLUICE_ASSIGN_OR_RETURN(src, source_object(from));
    dst = destination_object(to, fs::path(src.key).filename().string());
    // A destination no store can hold ("a//b", "..") is the caller's mistake, said before
    // anything is opened, not a failed object in the report.
    if (Status k = store::validate_key(dst.key); !k)
      return std::unexpected(k.error().with_context("'" + o.dst + "'"));
  }
  SLUICE_RETURN_IF_ERROR(refuse_overlap(src, dst, o.recursive));
  const bool cached = o.cache || from.cached;
  if (cached && from.local) {
    SLUICE_ASSIGN_OR_RETURN(src, cached_local(src));
  }

  telemetry::Registry registry;
  const OpenOptions how{.registry = &registry};
  SLUICE_ASSIGN_OR_RETURN(auto src_store, cached ? session.open_cached(src.store_uri, how)
                                                 : session.open_store(src.store_uri, how));
  SLUICE_ASSIGN_OR_RETURN(auto plain_dst, session.open_store(dst.store_uri, how));
  // Charged to the project that owns the destination, when the ledger has projects.
  SLUICE_ASSIGN_OR_RETURN(auto dst_store, session.charged(std::move(plain_dst)));

  xfer::CopyPlan plan;
  if (o.recursive) {
    SLUICE_ASSIGN_OR_RETURN(plan, xfer::plan_prefix(*src_store, src.key, dst.key));
  } else {
    plan.items.push_back(xfer::CopyItem{src.key, dst.key, std::nullopt});
  }
  xfer::CopyOptions co;
  co.concurrency = session.options().s3.max_in_flight;
  co.jobs = o.recursive ? o.jobs : 1;
  co.part_size = o.part_size;
  co.streams = o.streams;
  co.durable = o.durable;
  co.on_progress = o.on_progress;
  co.cancel = o.cancel;
  // Through a cache, parts start on its chunk bounds: no chunk is read by two parts.
  if (auto* chunked = src_store->capability<cache::ReadAhead>())
    co.part_align = chunked->chunk_size();
  xfer::CopyReport report = xfer::copy_all(*src_store, *dst_store, plan.items, co);
  report.failures.insert(report.failures.begin(), plan.rejected.begin(), plan.rejected.end());
  CopySummary sum = summarize(report, *src_store, registry);
  sum.skipped = std::move(plan.skipped);
  return sum;
}

}  // namespace sluice::client
