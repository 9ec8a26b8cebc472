// Datasets opened from their URI (sluice/client/datasets.h).
#include "sluice/client/datasets.h"

#include <filesystem>

#include "sluice/client/location.h"

namespace sluice::client {

namespace {

Result<std::shared_ptr<stream::Dataset>> open_once(const Session& session, const DatasetSpec& spec,
                                                   bool refresh) {
  SLUICE_ASSIGN_OR_RETURN(DatasetLocation w, dataset_location(spec.uri));
  // Readers only read: a mistyped path is not a new directory.
  const OpenOptions how{.create = false, .registry = spec.registry};
  std::shared_ptr<store::Store> s;
  if (spec.through_cache) {
    SLUICE_ASSIGN_OR_RETURN(s, session.open_cached(w.store_uri, how));
  } else {
    SLUICE_ASSIGN_OR_RETURN(s, session.open_store(w.store_uri, how));
  }
  stream::DatasetOptions o;
  o.format = spec.format;
  o.skip_corrupt = spec.skip_corrupt;
  if (spec.catalog) {
    // s3://bucket names a bucket on some server: the catalog must know which.
    o.store_id =
        w.store_uri +
        (w.store_uri.starts_with("s3://") ? " at " + s3::endpoint_url(session.options().s3) : "");
    o.catalog_dir =
        spec.catalog_dir.empty() ? session.options().home + "/datasets" : spec.catalog_dir;
    if (refresh) o.catalog_ttl = std::chrono::seconds(0);
  }
  return stream::Dataset::open(std::move(s), w.prefix, o);
}

// Whether the catalog's listing is out of date: two stats (the first and last shard).
bool replaced_in_place(stream::Dataset& ds) {
  if (!ds.from_catalog() || ds.shards().empty()) return false;
  for (const auto* sh : {&ds.shards().front(), &ds.shards().back()}) {
    auto info = ds.store().stat(sh->key);
    if (!info || info->etag != sh->etag || info->size != sh->size) return true;
  }
  return false;
}

}  // namespace

Result<DatasetLocation> dataset_location(const std::string& text) {
  SLUICE_ASSIGN_OR_RETURN(Location loc, parse_location(text));
  if (loc.local) {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(loc.path, ec);
    if (ec) return fail_errno(ec.value(), "resolve " + loc.path);
    return DatasetLocation{"file://" + p.lexically_normal().string(), ""};
  }
  std::string prefix = loc.path;
  if (!prefix.empty() && !prefix.ends_with('/')) prefix += '/';
  return DatasetLocation{loc.store_uri, prefix};
}

Result<std::shared_ptr<stream::Dataset>> open_dataset(const Session& session,
                                                      const DatasetSpec& spec) {
  SLUICE_ASSIGN_OR_RETURN(auto ds, open_once(session, spec, spec.refresh));
  if (spec.refresh || !replaced_in_place(*ds)) return ds;
  ds.reset();  // first: its store holds the cache directory's lock
  return open_once(session, spec, true);
}

}  // namespace sluice::client
